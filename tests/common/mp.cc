#include "mp.h"

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

namespace hctest {

std::vector<std::string> contiguous(int nodes, int per_node) {
  std::vector<std::string> v;
  for (int n = 0; n < nodes; ++n)
    for (int l = 0; l < per_node; ++l) v.push_back("node" + std::to_string(n));
  return v;
}

std::vector<std::string> interleaved(int nodes, int per_node) {
  std::vector<std::string> v;
  for (int i = 0; i < nodes * per_node; ++i) v.push_back("node" + std::to_string(i % nodes));
  return v;
}

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A loopback listening socket that rank 0 inherits (HICOLL_RENDEZVOUS_FD): its port cannot be
// taken by another test between choosing it and listening.
static int listenLoopback(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 128) != 0) return -1;
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

std::string randomSecret() {
  unsigned char b[16] = {};
  if (getrandom(b, sizeof b, 0) != sizeof b) std::abort();
  std::string s;
  for (unsigned char c : b) s += "0123456789abcdef"[c >> 4], s += "0123456789abcdef"[c & 15];
  return s;
}

std::vector<int> runRaw(const Job& job, const std::function<int(int rank)>& body) {
  const std::string secret = randomSecret();  // as a careful launcher does: strangers stay out
  int port = 0;
  const int listen_fd = job.comm_id.empty() ? listenLoopback(&port) : -1;
  const std::string comm_id = job.comm_id.empty() ? "127.0.0.1:" + std::to_string(port) : job.comm_id;
  std::vector<pid_t> pids(job.nranks, -1);
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < job.nranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(job.nranks).c_str(), 1);
      setenv("HICOLL_COMM_ID", comm_id.c_str(), 1);
      if (!job.no_secret) setenv("HICOLL_COMM_SECRET", secret.c_str(), 1);
      if (listen_fd >= 0) {
        if (r == 0) {
          setenv("HICOLL_RENDEZVOUS_FD", std::to_string(listen_fd).c_str(), 1);
        } else {
          close(listen_fd);
        }
      }
      if (!job.node.empty()) setenv("HICOLL_TOPO_NODE", job.node[r].c_str(), 1);
      for (const auto& [k, v] : job.env) setenv(k.c_str(), v.c_str(), 1);
      auto it = job.rank_env.find(r);
      if (it != job.rank_env.end())
        for (const auto& [k, v] : it->second) setenv(k.c_str(), v.c_str(), 1);
      int rc = 1;
      try {
        rc = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] exception: %s\n", r, e.what());
      }
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids[r] = pid;
  }
  if (listen_fd >= 0) close(listen_fd);
  std::vector<int> status(job.nranks, -1);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(job.timeout_s);
  int left = job.nranks;
  while (left > 0) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < job.nranks; ++r)
        if (pids[r] == p) {
          status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          pids[r] = -1;
          --left;
        }
      continue;
    }
    if (std::chrono::steady_clock::now() > end) {
      for (int r = 0; r < job.nranks; ++r)
        if (pids[r] > 0) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          status[r] = 124;
          std::fprintf(stderr, "[rank %d] killed: the job exceeded %d s\n", r, job.timeout_s);
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

std::vector<int> run(const Job& job, const std::function<int(int rank, hcComm_t comm)>& body) {
  return runRaw(job, [&](int rank) {
    hcComm_t comm = nullptr;
    hcResult_t r = hcCommInitFromEnv(&comm);
    if (r != hcSuccess) {
      std::fprintf(stderr, "[rank %d] hcCommInitFromEnv: %s: %s\n", rank, hcGetErrorString(r), hcGetLastError(nullptr));
      return 2;
    }
    int rc = body(rank, comm);
    hcCommDestroy(comm);
    return rc;
  });
}

}  // namespace hctest
