#include "gpu_launch.h"

#include <cuda_runtime_api.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace hcgpu {
namespace {

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

}  // namespace

int deviceCount() {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    (void)!write(fds[1], &n, sizeof n);
    _exit(0);
  }
  close(fds[1]);
  int n = 0;
  if (pid < 0 || read(fds[0], &n, sizeof n) != sizeof n) n = 0;
  close(fds[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);
  return n;
}

int run(const Job& job, const std::function<int(int, int)>& body) {
  const int W = static_cast<int>(job.nodes.size());
  const int port = freePort();
  unsigned char rnd[16] = {};
  if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) return 1;
  std::string secret;
  for (unsigned char c : rnd) secret += "0123456789abcdef"[c >> 4], secret += "0123456789abcdef"[c & 15];
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(W, -1);
  for (int r = 0; r < W; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(W).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("HICOLL_TOPO_NODE", job.nodes[r].c_str(), 1);
      setenv("HICOLL_COMM_SECRET", secret.c_str(), 1);  // strangers stay out of the rendezvous
      for (const auto& [k, v] : job.env) setenv(k.c_str(), v.c_str(), 1);
      int rc = 1;
      try {
        rc = body(r, W);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] exception: %s\n", r, e.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids[r] = pid;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(job.timeout_s);
  int failed = 0, left = W;
  while (left > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < W; ++r) {
        if (pids[r] != pid) continue;
        pids[r] = -1;
        --left;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          ++failed;
          if (WIFSIGNALED(status))
            std::fprintf(stderr, "rank %d died of signal %d\n", r, WTERMSIG(status));
          else
            std::fprintf(stderr, "rank %d exited with %d\n", r, WEXITSTATUS(status));
        }
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > end) {
      std::fprintf(stderr, "timeout after %d s: killing %d rank(s)\n", job.timeout_s, left);
      ++failed;
      break;
    }
    if (failed) {
      // One rank failed: give the others a moment to report their own errors, then stop them.
      std::this_thread::sleep_for(std::chrono::seconds(5));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < W; ++r)
    if (pids[r] > 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], nullptr, 0);
    }
  return failed ? 1 : 0;
}

}  // namespace hcgpu
