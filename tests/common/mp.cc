#include "mp.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "launch/launch.h"

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

Helper::Helper(const std::function<void()>& body) {
  std::fflush(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) std::abort();
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    body();
    std::fflush(nullptr);
    _exit(0);
  }
}

void Helper::join(int timeout_s) {
  if (pid_ <= 0) return;
  const time_t end = time(nullptr) + timeout_s;
  int st = 0;
  while (waitpid(pid_, &st, WNOHANG) == 0) {
    if (time(nullptr) >= end) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
      break;
    }
    usleep(10000);
  }
  pid_ = -1;
}

void* sharedBytes(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  return p;
}

void freeSharedBytes(void* p, size_t n) {
  munmap(p, n);
}

std::string randomSecret() {
  unsigned char b[16] = {};
  if (getrandom(b, sizeof b, 0) != sizeof b) std::abort();
  std::string s;
  for (unsigned char c : b) s += "0123456789abcdef"[c >> 4], s += "0123456789abcdef"[c & 15];
  return s;
}

// The project's launcher (src/launch), keeping every rank's status: a test decides what a
// killed or failed rank means.
std::vector<int> runRaw(const Job& job, const std::function<int(int rank)>& body) {
  hicoll::launch::Options o;
  o.np = job.nranks;
  o.labels = job.node.empty() ? std::vector<std::string>(job.nranks, "node0") : job.node;
  o.set_node_labels = !job.node.empty();
  o.timeout_s = job.timeout_s;
  o.env = job.env;
  o.rank_env = job.rank_env;
  if (!job.comm_id.empty()) o.env["HICOLL_COMM_ID"] = job.comm_id;
  o.secret = !job.no_secret;
  o.kill_others = false;
  std::vector<int> st = hicoll::launch::launchRanks(o, body);
  if (st.empty()) st.assign(job.nranks, 2);
  for (int r = 0; r < job.nranks; ++r)
    if (st[r] == 124) std::fprintf(stderr, "[rank %d] killed: the job exceeded %d s\n", r, job.timeout_s);
  return st;
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
