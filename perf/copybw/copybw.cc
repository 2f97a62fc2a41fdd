// copybw: the copy bandwidths that bound intra-node collectives of 2 ranks on this machine.
// Two processes, each with its own private buffers; both measured alone (the peer sleeps in a
// pipe read) and both at once (as during a collective):
//   memcpy            private -> private (glibc)
//   streaming         private -> private, hicoll's copy with non-temporal stores (base/copy.h)
//   cma <piece>       process_vm_readv of the peer's buffer, in pieces of <piece> bytes
// Usage: copybw [bytes=32M] [reps=7]. Prints GB/s medians.
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/copy.h"

namespace {

using Clock = std::chrono::steady_clock;

char* mapTouched(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  memset(p, 1, n);
  return static_cast<char*>(p);
}

// Byte-sized messages over pipes: the two processes take turns without spinning.
void send1(int fd) {
  char c = 1;
  if (write(fd, &c, 1) != 1) exit(1);
}
void recv1(int fd) {
  char c;
  if (read(fd, &c, 1) != 1) exit(1);
}

double cmaRead(pid_t peer, char* remote, char* dst, size_t n, size_t piece) {
  auto t0 = Clock::now();
  for (size_t off = 0; off < n; off += piece) {
    size_t len = std::min(piece, n - off);
    iovec l{dst + off, len}, r{remote + off, len};
    if (process_vm_readv(peer, &l, 1, &r, 1, 0) != static_cast<ssize_t>(len)) {
      perror("process_vm_readv");
      exit(1);
    }
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double copy(char* dst, const char* src, size_t n) {
  auto t0 = Clock::now();
  memcpy(dst, src, n);
  asm volatile("" : : "r"(dst) : "memory");
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double copyStreamed(char* dst, const char* src, size_t n) {
  auto t0 = Clock::now();
  hicoll::copyStreaming(dst, src, n);
  asm volatile("" : : "r"(dst) : "memory");
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = argc > 1 ? strtoull(argv[1], nullptr, 0) : size_t{32} << 20;
  if (argc > 1 && strchr(argv[1], 'M')) n <<= 20;
  int reps = argc > 2 ? atoi(argv[2]) : 7;
  // Both buffers are mapped before fork: the same virtual addresses in both processes, each
  // with its own pages after the copy-on-write below.
  char* src = mapTouched(n);
  char* dst = mapTouched(n);
  int a2b[2], b2a[2];
  if (pipe(a2b) || pipe(b2a)) return 1;
  pid_t parent = getpid();
  pid_t child = fork();
  if (child < 0) return 1;
  const bool is_a = child != 0;
  const pid_t peer = is_a ? child : parent;
  const int out = is_a ? a2b[1] : b2a[1], in = is_a ? b2a[0] : a2b[0];
  memset(src, is_a ? 2 : 3, n);  // private pages in each process
  memset(dst, 0, n);

  const std::vector<size_t> pieces = {64 << 10, 1 << 20, 4 << 20, n};
  struct Result {
    std::string what;
    double alone, both;
  };
  std::vector<Result> results;
  auto measure = [&](const std::string& what, auto&& op) {
    std::vector<double> alone, both;
    for (int r = 0; r < reps; ++r) {
      // alone: A measures while B waits in a pipe read, then the other way round
      if (is_a) {
        alone.push_back(op());
        send1(out);
        recv1(in);
      } else {
        recv1(in);
        alone.push_back(op());
        send1(out);
      }
      // both at once, started together
      send1(out);
      recv1(in);
      both.push_back(op());
      send1(out);
      recv1(in);
    }
    results.push_back({what, n / median(alone) / 1e9, n / median(both) / 1e9});
  };
  measure("memcpy", [&] { return copy(dst, src, n); });
  measure("streaming", [&] { return copyStreamed(dst, src, n); });
  for (size_t p : pieces)
    measure("cma " + std::to_string(p >> 10) + "K pieces", [&] { return cmaRead(peer, src, dst, n, p); });

  if (is_a) {
    waitpid(child, nullptr, 0);
    printf("# copybw: %zu bytes, median of %d; GB/s per process (alone | both processes at once)\n", n, reps);
    for (const Result& r : results) printf("%-22s %7.2f | %7.2f\n", r.what.c_str(), r.alone, r.both);
  }
  return 0;
}
