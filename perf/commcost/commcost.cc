// commcost: what a communicator costs a rank before it runs anything, and what its first call
// costs. Creates --splits children of the job's communicator (hcCommSplit, all ranks in one
// color, as torch's mesh groups and new_group do), one at a time, and prints per rank: the
// creation time per child, VmRSS / RssAnon / RssShmem and open fds before and after, the
// machine's Shmem (/proc/meminfo) before and after; then one AllGather of --bytes per rank on a
// fresh child twice (the first call pays what creation deferred). A benchmark: it prints, it
// asserts nothing but the results of the calls.
//
//   commcost --np 4 --nodes 2 --splits 10          (self-launched, simulated nodes)
#include <dirent.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "hicoll/hicoll.h"
#include "launch/launch.h"

namespace {

struct Mem {
  long rss_kib = 0, anon_kib = 0, shmem_kib = 0, fds = 0, sys_shmem_kib = 0;
};

long field(const std::string& file, const char* name) {
  std::ifstream in(file);
  std::string line;
  const size_t n = std::strlen(name);
  while (std::getline(in, line))
    if (line.compare(0, n, name) == 0 && line.size() > n && line[n] == ':') return std::stol(line.substr(n + 1));
  return -1;
}

Mem measure() {
  Mem m;
  m.rss_kib = field("/proc/self/status", "VmRSS");
  m.anon_kib = field("/proc/self/status", "RssAnon");
  m.shmem_kib = field("/proc/self/status", "RssShmem");
  m.sys_shmem_kib = field("/proc/meminfo", "Shmem");
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) m.fds += e->d_name[0] != '.';
    closedir(d);
  }
  return m;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int check(hcResult_t r, const char* what, int rank) {
  if (r == hcSuccess) return 0;
  std::fprintf(stderr, "commcost rank %d: %s: %s\n", rank, what, hcGetLastError(nullptr));
  return 1;
}

int rankMain(int splits, size_t bytes) {
  hcComm_t world;
  if (hcCommInitFromEnv(&world) != hcSuccess) {
    std::fprintf(stderr, "commcost: hcCommInitFromEnv: %s\n", hcGetLastError(nullptr));
    return 1;
  }
  int rank = 0, n = 0;
  hcCommUserRank(world, &rank);
  hcCommCount(world, &n);
  if (check(hcBarrier(world), "barrier", rank)) return 1;
  const Mem before = measure();
  std::vector<hcComm_t> kids(splits);
  const double t0 = now();
  for (int i = 0; i < splits; ++i)
    if (check(hcCommSplit(world, 0, rank, &kids[i]), "hcCommSplit", rank)) return 1;
  const double create_s = now() - t0;
  if (check(hcBarrier(world), "barrier", rank)) return 1;
  const Mem after = measure();

  // The first and the second AllGather on the last child (a fresh one when --splits is 0).
  hcComm_t c = world;
  if (splits == 0 && check(hcCommSplit(world, 0, rank, &c), "hcCommSplit", rank)) return 1;
  if (splits > 0) c = kids.back();
  const size_t count = bytes / sizeof(float);
  std::vector<float> in(count, static_cast<float>(rank)), out(count * n);
  double first = 0, second = 0;
  for (double* t : {&first, &second}) {
    const double s = now();
    if (check(hcAllGather(in.data(), out.data(), count, hcFloat32, c, nullptr), "hcAllGather", rank)) return 1;
    *t = now() - s;
  }
  for (int r = 0; r < n; ++r)
    if (out[r * count] != static_cast<float>(r) || out[(r + 1) * count - 1] != static_cast<float>(r)) {
      std::fprintf(stderr, "commcost rank %d: wrong AllGather result from rank %d\n", rank, r);
      return 1;
    }
  const Mem used = measure();
  const double per = splits ? 1.0 / splits : 0;
  std::printf(
      "rank %d: %d splits in %.3f s (%.4f s each); VmRSS %ld -> %ld KiB (%.1f KiB per child), "
      "RssAnon %ld -> %ld, RssShmem %ld -> %ld, fds %ld -> %ld; machine Shmem %ld -> %ld KiB; "
      "first %zu-byte AllGather on a child %.2f ms, second %.2f ms; VmRSS after it %ld KiB\n",
      rank, splits, create_s, create_s * per, before.rss_kib, after.rss_kib, (after.rss_kib - before.rss_kib) * per,
      before.anon_kib, after.anon_kib, before.shmem_kib, after.shmem_kib, before.fds, after.fds, before.sys_shmem_kib,
      after.sys_shmem_kib, bytes, first * 1e3, second * 1e3, used.rss_kib);
  std::fflush(stdout);
  int f = 0;
  for (hcComm_t k : kids) f += check(hcCommDestroy(k), "hcCommDestroy", rank);
  if (splits == 0) f += check(hcCommDestroy(c), "hcCommDestroy", rank);
  f += check(hcCommDestroy(world), "hcCommDestroy", rank);
  return f ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"commcost: the cost of an idle communicator and of its first call"};
  hicoll::launch::Options opt;
  opt.np = 4;
  opt.nodes = 2;
  int splits = 10;
  size_t bytes = 1 << 20;
  app.add_option("--np", opt.np, "ranks (self-launched)");
  app.add_option("--nodes", opt.nodes, "simulated nodes");
  app.add_option("--splits", splits, "children created with hcCommSplit")->check(CLI::Range(0, 10000));
  app.add_option("--bytes", bytes, "bytes per rank of the AllGather on a child");
  app.add_option("-T,--timeout", opt.timeout_s, "bound of the whole job, seconds");
  CLI11_PARSE(app, argc, argv);
  if (hicoll::launch::underLauncher()) return rankMain(splits, bytes);
  return hicoll::launch::selfLaunch(opt, [&] { return rankMain(splits, bytes); });
}
