// linelat: how long a cache line takes to go from one process to another and back on this
// machine, the unit of a small call's cost on one node (a post crosses to the peer, the peer's
// crosses back). Two processes (unpinned, as agbench's ranks) bounce a counter in a shared
// line. On VMs the figure moves with where the host puts the vCPUs, between launches and
// within one (perf/README.md, "Small calls on one node"), so perf/targets.sh records it before
// every launch of its small rows.
// Usage: linelat [round trips=200000] [tries=5]. Prints the median and the range in ns.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

namespace {

struct alignas(64) Line {
  std::atomic<long> v{0};
};

struct Shared {
  Line ping, pong;
};

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 200000;
  const int tries = argc > 2 ? std::atoi(argv[2]) : 5;
  if (n <= 0 || tries <= 0) {
    std::fprintf(stderr, "usage: linelat [round trips > 0] [tries > 0]\n");
    return 2;
  }
  void* m = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  auto* s = new (m) Shared;
  const long total = n * tries;
  const pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) {  // answers every ping; gives up (exits) if the parent stops for 10 s
    for (long i = 1; i <= total; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      for (long k = 0; s->ping.v.load(std::memory_order_acquire) != i; ++k)
        if ((k & 0xffff) == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) _exit(1);
      s->pong.v.store(i, std::memory_order_release);
    }
    _exit(0);
  }
  std::vector<double> ns;
  long i = 0;
  bool stuck = false;
  for (int t = 0; t < tries && !stuck; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long j = 0; j < n && !stuck; ++j) {
      s->ping.v.store(++i, std::memory_order_release);
      for (long k = 0; s->pong.v.load(std::memory_order_acquire) != i; ++k)
        if ((k & 0xffff) == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) stuck = true;
    }
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n);
  }
  int status = 0;
  if (stuck) kill(child, SIGKILL);
  waitpid(child, &status, 0);
  if (stuck) {
    std::fprintf(stderr, "linelat: the other process stopped answering\n");
    return 1;
  }
  std::sort(ns.begin(), ns.end());
  std::printf("cache-line round trip between 2 processes: median %.0f ns (%.0f-%.0f over %d tries of %ld)\n",
              ns[ns.size() / 2], ns.front(), ns.back(), tries, n);
  return 0;
}
