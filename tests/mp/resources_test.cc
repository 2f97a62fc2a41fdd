// Tier 3: what communicators cost a rank. Fifty idle children of a 2x2 job (hcCommSplit, as
// torch's mesh and new_group groups) stay small in resident memory and descriptors, and the
// first call on one still works; twenty that have each made a call across nodes stay small
// too (they share the process's libfabric endpoint). The figures themselves are
// perf/commcost's (perf/results/2026-12-03.md, 2026-12-06-shared-endpoint.md); this asserts a
// generous bound.
#include <dirent.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../common/mp.h"

namespace hctest {
namespace {

long rssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

long openFds() {
  long n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// What n children of world cost this rank (VmRSS, descriptors), each split and then given
// first_call (null: left idle), within kib and fds per child: 0, or 1 having said what broke.
// It stops early when the bound is already broken (a build that costs 100 MB a child would
// otherwise take the machine's memory).
struct ChildBound {
  int n;
  long kib, fds;  // per child
  const char* what;
};
int childrenCost(int rank, hcComm_t world, const ChildBound& b, const std::function<int(hcComm_t, int)>& first_call,
                 std::vector<hcComm_t>* kids) {
  const long rss0 = rssKiB(), fds0 = openFds();
  int f = 0;
  for (int i = 0; i < b.n && !f; ++i) {
    hcComm_t c = nullptr;
    if (hcCommSplit(world, 0, rank, &c) != hcSuccess) {
      std::fprintf(stderr, "[rank %d] split %d: %s\n", rank, i, hcGetLastError(world));
      return 1;
    }
    kids->push_back(c);
    if (first_call && first_call(c, i)) return 1;
    const long n = static_cast<long>(kids->size());
    if (n >= 3 && rssKiB() - rss0 > b.kib * n) f = 1;
  }
  if (hcBarrier(world) != hcSuccess) return 1;
  const long n = static_cast<long>(kids->size());
  const long rss = rssKiB() - rss0, fds = openFds() - fds0;
  std::fprintf(stderr, "[rank %d] %ld %s: VmRSS +%ld KiB (%ld KiB each), fds +%ld\n", rank, n, b.what, rss, rss / n,
               fds);
  return f || rss > b.kib * n || fds > b.fds * n;
}

// An AllGather of 1000 ints per rank on a 4-rank communicator, checked: 0 when right.
int gather4(int rank, hcComm_t c, int i) {
  std::vector<int> in(1000, rank), out(4000, -1);
  if (hcAllGather(in.data(), out.data(), in.size(), hcInt32, c, nullptr) != hcSuccess) {
    std::fprintf(stderr, "[rank %d] AllGather on child %d: %s\n", rank, i, hcGetLastError(c));
    return 1;
  }
  for (int r = 0; r < 4; ++r)
    if (out[r * 1000] != r || out[r * 1000 + 999] != r) return 1;
  return 0;
}

int destroyAll(const std::vector<hcComm_t>& kids) {
  int f = 0;
  for (hcComm_t c : kids) f |= hcCommDestroy(c) != hcSuccess;
  return f;
}

// Descriptors: one per local peer (its pidfd) and a little room. Idle: the goal is 5 MB, today's
// figure perf/results/2026-12-03.md. Busy: an endpoint of its own was 19-27 MB a child with
// tcp;ofi_rxm (2026-12-06-shared-endpoint.md).
constexpr ChildBound kIdle{50, 2048, 3, "idle children"};
constexpr ChildBound kBusy{20, 4096, 3, "children after a call across nodes"};

int fiftySplits(int rank, hcComm_t world) {
  if (hcBarrier(world) != hcSuccess) return 1;
  std::vector<hcComm_t> kids;
  int f = childrenCost(rank, world, kIdle, nullptr, &kids);
  // The last child works (its first call opens what creation deferred).
  if (!kids.empty()) f |= gather4(rank, kids.back(), kIdle.n - 1);
  return f | destroyAll(kids);
}

int twentyBusySplits(int rank, hcComm_t world) {
  // The world's network first: the process's endpoint and its connections exist before.
  if (gather4(rank, world, -1)) return 1;
  std::vector<hcComm_t> kids;
  const int f = childrenCost(
      rank, world, kBusy, [rank](hcComm_t c, int i) { return gather4(rank, c, i); }, &kids);
  return f | destroyAll(kids);
}

Job twoByTwo() {
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  job.timeout_s = 120;
  return job;
}

TEST(Resources, TwentyChildrenAcrossNodesStaySmallAfterTheirFirstCall) {
  auto st = run(twoByTwo(), twentyBusySplits);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

TEST(Resources, FiftyIdleSplitsStaySmall) {
  auto st = run(twoByTwo(), fiftySplits);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace hctest
