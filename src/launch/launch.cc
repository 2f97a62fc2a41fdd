#include "launch/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace hicoll::launch {
namespace {

using Clock = std::chrono::steady_clock;

bool hasEnv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// A port the kernel considers free on addr right now. The rank that listens on it binds it
// moments later; the window is the same as torchrun's.
int freePort(const std::string& addr) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) {
    ::close(fd);
    throw std::runtime_error("launch: MASTER_ADDR must be an IPv4 address, got '" + addr + "'");
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    int e = errno;
    ::close(fd);
    throw std::runtime_error("launch: cannot bind " + addr + ":0: " + std::strerror(e));
  }
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

// A listening socket on addr:0, made before the ranks are forked and inherited by rank 0
// (HICOLL_RENDEZVOUS_FD): no other process can take its port in between.
int listenAny(const std::string& addr, int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 128) != 0) {
    int e = errno;
    ::close(fd);
    throw std::runtime_error("launch: cannot listen on " + addr + ":0: " + std::strerror(e));
  }
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *port = ntohs(sa.sin_port);
  return fd;
}

int statusOf(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return 1;
}

std::string describe(int wstatus) {
  if (WIFEXITED(wstatus)) return "exited with status " + std::to_string(WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) {
    const char* name = ::strsignal(WTERMSIG(wstatus));
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(wstatus)) + " (" + (name ? name : "?") + ")";
  }
  return "stopped";
}

struct Child {
  int pid = -1;
  int rank = -1;  // -1 for runChild
  int pidfd = -1;
  bool done = false;
  int wstatus = 0;
};

int pidfdOpen(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

// Reaps every child that has exited; true when one was reaped.
bool reap(std::vector<Child>& kids) {
  bool any = false;
  for (Child& c : kids) {
    if (c.done) continue;
    int ws = 0;
    int r = ::waitpid(c.pid, &ws, WNOHANG);
    if (r == c.pid) {
      c.done = true;
      c.wstatus = ws;
      any = true;
      if (c.pidfd >= 0) ::close(c.pidfd);
      c.pidfd = -1;
    } else if (r < 0 && errno == ECHILD) {  // reaped by someone else: count it as a failure
      c.done = true;
      c.wstatus = 1 << 8;
      any = true;
    }
  }
  return any;
}

// Sleeps until a child may have exited or `until` passes. pidfds when the kernel has them
// (immediate wake-up), otherwise short naps.
void waitSome(std::vector<Child>& kids, Clock::time_point until) {
  std::vector<pollfd> fds;
  for (const Child& c : kids)
    if (!c.done && c.pidfd >= 0) fds.push_back({c.pidfd, POLLIN, 0});
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  if (left < 0) left = 0;
  bool all_have_fd = true;
  for (const Child& c : kids)
    if (!c.done && c.pidfd < 0) all_have_fd = false;
  if (!fds.empty() && all_have_fd) {
    ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 1000)));
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<long long>(left, 5)));
  }
}

bool allDone(const std::vector<Child>& kids) {
  for (const Child& c : kids)
    if (!c.done) return false;
  return true;
}

// SIGTERM to the children still running (only the pids we forked), SIGKILL after a grace
// period, then reap them all.
void killRest(std::vector<Child>& kids) {
  for (const Child& c : kids)
    if (!c.done) ::kill(c.pid, SIGTERM);
  auto grace = Clock::now() + std::chrono::seconds(3);
  while (!allDone(kids) && Clock::now() < grace) {
    reap(kids);
    if (!allDone(kids)) waitSome(kids, grace);
  }
  for (const Child& c : kids)
    if (!c.done) ::kill(c.pid, SIGKILL);
  for (Child& c : kids) {
    if (c.done) continue;
    int ws = 0;
    while (::waitpid(c.pid, &ws, 0) < 0 && errno == EINTR) {
    }
    c.done = true;
    c.wstatus = ws;
    if (c.pidfd >= 0) ::close(c.pidfd);
  }
}

// Waits for all children. On the timeout the rest are killed (their status: 124); on a failure
// too when kill_others (then the first failure is reported). Fills each child's status.
// Returns the index of the child whose failure ended the job (kill_others), else -1.
int superviseChildren(std::vector<Child>& kids, int timeout_s, const char* what, bool kill_others,
                      std::vector<int>* status) {
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s > 0 ? timeout_s : 1 << 30);
  auto record = [&] {
    for (size_t i = 0; i < kids.size(); ++i)
      if (kids[i].done && (*status)[i] < 0) (*status)[i] = statusOf(kids[i].wstatus);
  };
  while (true) {
    reap(kids);
    record();
    if (kill_others)
      for (size_t i = 0; i < kids.size(); ++i) {
        const Child& c = kids[i];
        if (!c.done || (WIFEXITED(c.wstatus) && WEXITSTATUS(c.wstatus) == 0)) continue;
        std::string who = c.rank >= 0 ? "rank " + std::to_string(c.rank) : std::string(what);
        bool others = !allDone(kids);
        std::fprintf(stderr, "launch: %s (pid %d) %s%s\n", who.c_str(), c.pid, describe(c.wstatus).c_str(),
                     others ? "; killing the other ranks" : "");
        killRest(kids);
        record();
        return static_cast<int>(i);
      }
    if (allDone(kids)) return -1;
    if (Clock::now() >= deadline) {
      std::fprintf(stderr, "launch: %s timed out after %d s; killing %s\n", what, timeout_s,
                   kids.size() > 1 ? "the ranks" : "it");
      for (size_t i = 0; i < kids.size(); ++i)
        if (!kids[i].done) (*status)[i] = 124;
      killRest(kids);
      return -1;
    }
    waitSome(kids, deadline);
  }
}

void setEnv(const char* name, const std::string& value) {
  ::setenv(name, value.c_str(), 1);
}

// 32 random hex digits for HICOLL_COMM_SECRET: the job's rendezvous admits only its own ranks.
std::string randomSecret() {
  unsigned char b[16] = {};
  if (::getrandom(b, sizeof b, 0) != sizeof b) throw std::runtime_error("launch: getrandom failed");
  std::string s;
  for (unsigned char c : b) s += "0123456789abcdef"[c >> 4], s += "0123456789abcdef"[c & 15];
  return s;
}

}  // namespace

bool underLauncher() {
  if (hasEnv("RANK") && hasEnv("WORLD_SIZE")) return true;                            // torchrun
  if (hasEnv("OMPI_COMM_WORLD_RANK") && hasEnv("OMPI_COMM_WORLD_SIZE")) return true;  // mpirun
  if (hasEnv("PMIX_RANK") || hasEnv("PMI_RANK")) return true;                         // other MPI
  // srun sets SLURM_STEP_ID for its tasks; a batch script alone has no task rank.
  if (hasEnv("SLURM_PROCID") && hasEnv("SLURM_NTASKS") && hasEnv("SLURM_STEP_ID")) return true;
  return false;
}

int nodeOf(const Options& opt, int rank) {
  if (opt.nodes <= 1) return 0;
  if (opt.layout == Layout::Interleaved) return rank % opt.nodes;
  return static_cast<int>(static_cast<long long>(rank) * opt.nodes / opt.np);
}

std::string nodeLabel(int node) {
  return "node" + std::to_string(node);
}

namespace {

struct Launched {
  std::vector<int> status;  // by rank; empty when nothing was launched
  int first_failure = -1;   // the rank whose failure ended the job (kill_others)
};

Launched launch(const Options& opt, const std::function<int(int rank)>& rank_main) {
  auto refuse = [](const std::string& why) -> Launched {
    std::fprintf(stderr, "launch: %s\n", why.c_str());
    return {};
  };
  if (opt.np < 1 || opt.nodes < 1 || opt.nodes > opt.np)
    return refuse("need 1 <= nodes <= np (np=" + std::to_string(opt.np) + " nodes=" + std::to_string(opt.nodes) + ")");
  if (!opt.labels.empty() && static_cast<int>(opt.labels.size()) != opt.np)
    return refuse("labels for " + std::to_string(opt.labels.size()) + " ranks, np=" + std::to_string(opt.np));
  if (opt.node_rank >= opt.nodes)
    return refuse("node rank " + std::to_string(opt.node_rank) + " out of range (nodes=" + std::to_string(opt.nodes) +
                  ")");
  auto envHas = [&](const char* name) { return opt.env.count(name) || hasEnv(name); };
  int port = opt.master_port;
  int rendezvous_fd = -1, rendezvous_port = 0;  // hicoll's rendezvous, when this launch picks it
  std::string secret;
  try {
    if (port == 0) {
      if (opt.node_rank >= 0) return refuse("a per-node launch needs an explicit master port");
      port = freePort(opt.master_addr);
      if (!envHas("HICOLL_COMM_ID")) rendezvous_fd = listenAny(opt.master_addr, &rendezvous_port);
    }
    // A per-node launch (one launcher per node) needs the secret from the environment; a
    // whole-job launch makes one.
    if (opt.secret && !envHas("HICOLL_COMM_SECRET") && opt.node_rank < 0) secret = randomSecret();
  } catch (const std::exception& e) {
    return refuse(e.what());
  }

  // Node label, local index and local size per rank.
  std::vector<std::string> label(opt.np);
  std::vector<int> local(opt.np);
  std::map<std::string, int> local_size;
  for (int r = 0; r < opt.np; ++r) {
    label[r] = opt.labels.empty() ? nodeLabel(nodeOf(opt, r)) : opt.labels[r];
    local[r] = local_size[label[r]]++;
  }

  std::fflush(nullptr);  // or buffered output would be written once per child
  const pid_t parent = ::getpid();
  std::vector<Child> kids;
  for (int r = 0; r < opt.np; ++r) {
    if (opt.node_rank >= 0 && nodeOf(opt, r) != opt.node_rank) continue;
    pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "launch: fork failed for rank %d: %s\n", r, std::strerror(errno));
      killRest(kids);
      return Launched{};
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      if (::getppid() != parent) ::_exit(1);
      setEnv("RANK", std::to_string(r));
      setEnv("WORLD_SIZE", std::to_string(opt.np));
      setEnv("LOCAL_RANK", std::to_string(local[r]));
      setEnv("LOCAL_WORLD_SIZE", std::to_string(local_size[label[r]]));
      if (opt.labels.empty()) setEnv("GROUP_RANK", std::to_string(nodeOf(opt, r)));  // torchrun's node index
      setEnv("MASTER_ADDR", opt.master_addr);
      setEnv("MASTER_PORT", std::to_string(port));
      if (opt.set_node_labels) setEnv("HICOLL_TOPO_NODE", label[r]);
      if (!secret.empty()) setEnv("HICOLL_COMM_SECRET", secret);
      if (rendezvous_fd >= 0) {
        setEnv("HICOLL_COMM_ID", opt.master_addr + ":" + std::to_string(rendezvous_port));
        if (r == 0) {
          setEnv("HICOLL_RENDEZVOUS_FD", std::to_string(rendezvous_fd));
        } else {
          ::close(rendezvous_fd);
        }
      }
      for (const auto& [k, v] : opt.env) setEnv(k.c_str(), v);
      if (auto it = opt.rank_env.find(r); it != opt.rank_env.end())
        for (const auto& [k, v] : it->second) setEnv(k.c_str(), v);
      int rc = 1;
      try {
        rc = rank_main(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        rc = 1;
      } catch (...) {
        std::fprintf(stderr, "rank %d: unknown exception\n", r);
        rc = 1;
      }
      std::fflush(nullptr);
      ::_exit(rc == 0 ? 0 : ((rc & 0xff) != 0 ? (rc & 0xff) : 1));
    }
    Child c;
    c.pid = pid;
    c.rank = r;
    c.pidfd = pidfdOpen(pid);
    kids.push_back(c);
  }
  if (rendezvous_fd >= 0) ::close(rendezvous_fd);  // rank 0 holds it now
  std::vector<int> status(kids.size(), -1);
  const int failed = superviseChildren(kids, opt.timeout_s, "job", opt.kill_others, &status);
  Launched out;
  out.status.assign(opt.np, -1);
  for (size_t i = 0; i < kids.size(); ++i) out.status[kids[i].rank] = status[i];
  if (failed >= 0) out.first_failure = kids[failed].rank;
  return out;
}

}  // namespace

std::vector<int> launchRanks(const Options& opt, const std::function<int(int rank)>& rank_main) {
  return launch(opt, rank_main).status;
}

int selfLaunch(const Options& opt, const std::function<int()>& rank_main) {
  const Launched l = launch(opt, [&](int) { return rank_main(); });
  if (l.status.empty()) return 2;
  if (l.first_failure >= 0) return l.status[l.first_failure];
  for (int s : l.status)
    if (s > 0) return s;  // a timeout (ranks of other nodes are -1: not this launcher's)
  return 0;
}

int runChild(const std::vector<std::string>& argv, int timeout_s) {
  if (argv.empty()) return 2;
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "launch: fork failed: %s\n", std::strerror(errno));
    return 2;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "launch: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  std::vector<Child> kids(1);
  kids[0].pid = pid;
  kids[0].pidfd = pidfdOpen(pid);
  std::vector<int> status(1, -1);
  superviseChildren(kids, timeout_s, argv[0].c_str(), true, &status);
  return status[0];
}

}  // namespace hicoll::launch
