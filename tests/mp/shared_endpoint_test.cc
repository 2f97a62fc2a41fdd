// Tier 3: communicators that span nodes share one libfabric endpoint per process
// (HICOLL_OFI_SHARED_ENDPOINT, transport/ofi/ofi_transport.h), each a channel numbered in the
// tag bits above hicoll's own. Messages of one never reach another, whichever threads drive
// them; a channel that fails leaves the others working; numbers come round again once every
// other has been used; a rank that does not share makes the communicator open its own.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../common/mp.h"

namespace hctest {
namespace {

int fail(int me, const char* what, hcComm_t comm) {
  std::fprintf(stderr, "[rank %d] %s failed: %s\n", me, what, hcGetLastError(comm));
  return 1;
}

void expectAllZero(const std::vector<int>& st) {
  for (size_t r = 0; r < st.size(); ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

Job jobOf(int nodes, int per_node) {
  Job job;
  job.nranks = nodes * per_node;
  job.node = contiguous(nodes, per_node);
  job.env["HICOLL_TIMEOUT_MS"] = "20000";
  job.timeout_s = 120;
  return job;
}

// One AllGather whose every element names its rank in comm, its index and the communicator's
// mark: a message from another communicator shows as a wrong element. me: the world rank (for
// messages); W: comm's size.
int gatherChecked(int me, int W, hcComm_t comm, int mark, size_t n) {
  int cr = -1;
  hcCommUserRank(comm, &cr);
  std::vector<int32_t> in(n), out(n * static_cast<size_t>(W), -1);
  for (size_t i = 0; i < n; ++i) in[i] = mark * 100000000 + cr * 1000000 + static_cast<int32_t>(i);
  if (hcAllGather(in.data(), out.data(), n, hcInt32, comm, nullptr) != hcSuccess) return fail(me, "hcAllGather", comm);
  for (int r = 0; r < W; ++r)
    for (size_t i = 0; i < n; ++i)
      if (out[r * n + i] != mark * 100000000 + r * 1000000 + static_cast<int32_t>(i)) {
        std::fprintf(stderr, "[rank %d] mark %d: element %zu of rank %d is %d\n", me, mark, i, r, out[r * n + i]);
        return 1;
      }
  return 0;
}

// A send to and a receive from the rank on the other node (the same place on it), every value
// naming the communicator's mark: a message of another communicator shows as a wrong value or
// a size that differs (each mark sends its own size).
int exchangeChecked(int me, hcComm_t comm, int mark, int round) {
  const int peer = (me + 2) % 4;
  const size_t n = static_cast<size_t>(10 * mark + round % 7);
  std::vector<int32_t> out(n, mark * 1000 + me), in(n, -1);
  hcGroupStart();
  hcSend(out.data(), n, hcInt32, peer, comm, nullptr);
  hcRecv(in.data(), n, hcInt32, peer, comm, nullptr);
  if (hcGroupEnd() != hcSuccess) return fail(me, "send/recv", comm);
  for (int32_t v : in)
    if (v != mark * 1000 + peer) {
      std::fprintf(stderr, "[rank %d] mark %d: received %d\n", me, mark, v);
      return 1;
    }
  return 0;
}

// Two children used at once from two threads of every rank (as torch's groups, a worker
// thread each), with the same calls, so their tags are the same on both: point-to-point
// (whose envelopes share one tag per pair) and AllGathers small and chunked, every value checked.
TEST(SharedEndpoint, TwoCommunicatorsFromTwoThreadsKeepTheirMessages) {
  Job job = jobOf(2, 2);
  auto st = run(job, [](int me, hcComm_t world) {
    hcComm_t a = nullptr, b = nullptr;
    if (hcCommSplit(world, 0, me, &a) != hcSuccess || hcCommSplit(world, 0, me, &b) != hcSuccess)
      return fail(me, "hcCommSplit", world);
    // The networks open one after the other (opened at once from two threads, the second
    // would find every number on offer to the first and open its own endpoints).
    if (gatherChecked(me, 4, a, 1, 10) || gatherChecked(me, 4, b, 2, 10)) return 1;
    int fa = 0, fb = 0;
    auto loop = [&](hcComm_t c, int mark, int* f) {
      for (int i = 0; i < 60 && !*f; ++i)
        *f = exchangeChecked(me, c, mark, i) || gatherChecked(me, 4, c, mark, i % 3 == 0 ? 300000 : 1 + i);
    };
    std::thread ta(loop, a, 1, &fa), tb(loop, b, 2, &fb);
    ta.join();
    tb.join();
    if (fa || fb) return 1;
    int f = gatherChecked(me, 4, world, 3, 1000);
    if (hcCommDestroy(a) != hcSuccess || hcCommDestroy(b) != hcSuccess) return fail(me, "hcCommDestroy", world);
    return f;
  });
  expectAllZero(st);
}

// Children over different subsets of the ranks (rank pairs across the nodes, then every rank),
// so each process has used other numbers before the last one opens: each communicator's
// AllGathers land whole, in several rounds interleaved between them.
TEST(SharedEndpoint, SubsetsWithDifferentHistoriesAgreeOnANumber) {
  Job job = jobOf(2, 2);
  auto st = run(job, [](int me, hcComm_t world) {
    hcComm_t pair = nullptr, pair2 = nullptr, all = nullptr;
    // {0, 2} and {1, 3} (one rank per node each), then {0, 3} and {1, 2}, then all four.
    if (hcCommSplit(world, me % 2, me, &pair) != hcSuccess) return fail(me, "hcCommSplit pair", world);
    if (hcCommSplit(world, me == 0 || me == 3, me, &pair2) != hcSuccess) return fail(me, "hcCommSplit pair2", world);
    if (me == 0 && gatherChecked(me, 2, pair2, 9, 100)) return 1;  // rank 0 opens one more first
    if (me == 3 && gatherChecked(me, 2, pair2, 9, 100)) return 1;
    if (gatherChecked(me, 2, pair, 1, 100)) return 1;
    if (hcCommSplit(world, 0, me, &all) != hcSuccess) return fail(me, "hcCommSplit all", world);
    for (int round = 0; round < 4; ++round) {
      if (gatherChecked(me, 4, all, 2, 20000 + round) || gatherChecked(me, 2, pair, 1, 20000 + round) ||
          gatherChecked(me, 4, world, 3, 100 + round))
        return 1;
      if ((me == 1 || me == 2) && round == 0 && gatherChecked(me, 2, pair2, 9, 100)) return 1;
      if (gatherChecked(me, 2, pair2, 9, 3000 + round)) return 1;
    }
    for (hcComm_t c : {pair, pair2, all})
      if (hcCommDestroy(c) != hcSuccess) return fail(me, "hcCommDestroy", world);
    return 0;
  });
  expectAllZero(st);
}

// Two children whose networks open at the same moment from two threads of every rank: each
// takes a number or opens its own endpoints, alike on all its ranks, and its data is right.
TEST(SharedEndpoint, TwoCommunicatorsOpenedAtOnce) {
  Job job = jobOf(2, 2);
  auto st = run(job, [](int me, hcComm_t world) {
    int f = 0;
    for (int trial = 0; trial < 5 && !f; ++trial) {
      hcComm_t a = nullptr, b = nullptr;
      if (hcCommSplit(world, 0, me, &a) != hcSuccess || hcCommSplit(world, 0, me, &b) != hcSuccess)
        return fail(me, "hcCommSplit", world);
      int fa = 0, fb = 0;
      auto loop = [&](hcComm_t c, int mark, int* fl) {
        for (int i = 0; i < 5 && !*fl; ++i)
          *fl = exchangeChecked(me, c, mark, i) || gatherChecked(me, 4, c, mark, 5000);
      };
      std::thread ta(loop, a, 1, &fa), tb(loop, b, 2, &fb);
      ta.join();
      tb.join();
      f = fa || fb;
      if (hcCommDestroy(a) != hcSuccess || hcCommDestroy(b) != hcSuccess) return fail(me, "hcCommDestroy", world);
    }
    return f;
  });
  expectAllZero(st);
}

// A point-to-point size mismatch fails one child on both ranks; the parent and a sibling on
// the same endpoint go on, and a child made after it works.
TEST(SharedEndpoint, AFailedCommunicatorLeavesTheOthersWorking) {
  Job job = jobOf(2, 1);
  auto st = run(job, [](int me, hcComm_t world) {
    hcComm_t bad = nullptr, good = nullptr;
    if (hcCommSplit(world, 0, me, &bad) != hcSuccess || hcCommSplit(world, 0, me, &good) != hcSuccess)
      return fail(me, "hcCommSplit", world);
    if (gatherChecked(me, 2, bad, 1, 10) || gatherChecked(me, 2, good, 2, 10)) return 1;
    std::vector<int32_t> buf(200, me);
    const hcResult_t r =
        me == 0 ? hcSend(buf.data(), 100, hcInt32, 1, bad, nullptr) : hcRecv(buf.data(), 200, hcInt32, 0, bad, nullptr);
    if (r == hcSuccess) {
      std::fprintf(stderr, "[rank %d] the mismatched pair succeeded\n", me);
      return 1;
    }
    if (hcBarrier(bad) == hcSuccess) return fail(me, "the failed child still works: hcBarrier", bad);
    if (hcCommDestroy(bad) != hcSuccess) return fail(me, "hcCommDestroy of the failed child", world);
    for (int i = 0; i < 5; ++i)
      if (gatherChecked(me, 2, good, 2, 5000) || gatherChecked(me, 2, world, 3, 5000)) return 1;
    hcComm_t later = nullptr;
    if (hcCommSplit(world, 0, me, &later) != hcSuccess) return fail(me, "hcCommSplit after", world);
    int f = gatherChecked(me, 2, later, 4, 5000);
    if (hcCommDestroy(later) != hcSuccess || hcCommDestroy(good) != hcSuccess) return fail(me, "hcCommDestroy", world);
    return f;
  });
  expectAllZero(st);
}

// More children made and destroyed, one after another, than an endpoint has numbers (1024
// with tcp;ofi_rxm), while the world keeps the endpoint open: numbers come round again and
// every child's data is right.
TEST(SharedEndpoint, NumbersComeRoundAgain) {
  Job job = jobOf(2, 1);
  job.timeout_s = 300;
  auto st = run(job, [](int me, hcComm_t world) {
    if (gatherChecked(me, 2, world, 1, 10)) return 1;  // the world's channel: the endpoint stays open
    for (int i = 0; i < 1100; ++i) {
      hcComm_t c = nullptr;
      if (hcCommSplit(world, 0, me, &c) != hcSuccess) return fail(me, "hcCommSplit", world);
      int32_t v = me + i, sum = 0;
      if (hcAllReduce(&v, &sum, 1, hcInt32, hcSum, c, nullptr) != hcSuccess) return fail(me, "hcAllReduce", c);
      if (sum != 1 + 2 * i) {
        std::fprintf(stderr, "[rank %d] child %d: sum %d, expected %d\n", me, i, sum, 1 + 2 * i);
        return 1;
      }
      if (hcCommDestroy(c) != hcSuccess) return fail(me, "hcCommDestroy", world);
    }
    return gatherChecked(me, 2, world, 1, 1000);
  });
  expectAllZero(st);
}

// One rank with HICOLL_OFI_SHARED_ENDPOINT=0: every communicator opens its own endpoints, and
// works.
TEST(SharedEndpoint, OneRankThatDoesNotShareMakesEachOpenItsOwn) {
  Job job = jobOf(2, 2);
  job.rank_env[2]["HICOLL_OFI_SHARED_ENDPOINT"] = "0";
  auto st = run(job, [](int me, hcComm_t world) {
    hcComm_t a = nullptr;
    if (hcCommSplit(world, 0, me, &a) != hcSuccess) return fail(me, "hcCommSplit", world);
    int f = gatherChecked(me, 4, world, 1, 70000) + gatherChecked(me, 4, a, 2, 70000);
    if (hcCommDestroy(a) != hcSuccess) return fail(me, "hcCommDestroy", world);
    return f;
  });
  expectAllZero(st);
}

}  // namespace
}  // namespace hctest
