// Tier 3: N processes over 1-4 simulated nodes (contiguous and interleaved), every collective,
// dtype and op, in place and out of place, against independent references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <unistd.h>

#include "../common/mp.h"
#include "../common/reference.h"
#include "checks.h"

namespace hctest {
namespace {

struct Layout {
  int nodes, per_node;
  bool interleave;
};

std::string name(const testing::TestParamInfo<Layout>& i) {
  return std::to_string(i.param.nodes) + "x" + std::to_string(i.param.per_node) +
         (i.param.interleave ? "_interleaved" : "_contiguous");
}

class Collectives : public testing::TestWithParam<Layout> {};

TEST_P(Collectives, EveryTypeOpAndSizeMatchesTheReference) {
  const Layout l = GetParam();
  Job job;
  job.nranks = l.nodes * l.per_node;
  job.node = l.interleave ? interleaved(l.nodes, l.per_node) : contiguous(l.nodes, l.per_node);
  job.timeout_s = 240;
  auto st = run(job, [&](int, hcComm_t comm) { return checkMatrix(comm, {0, 1, 17, 4099}); });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Layouts, Collectives,
                         testing::Values(Layout{1, 1, false}, Layout{1, 2, false}, Layout{1, 3, false},
                                         Layout{2, 1, false}, Layout{2, 2, false}, Layout{2, 2, true},
                                         Layout{2, 3, true}, Layout{3, 2, false}, Layout{4, 2, true}),
                         name);

// 64 MiB of output: several chunks of the pipeline, and the sort buffer well used.
TEST(CollectivesLarge, AllGatherAndReduceScatter64MiB) {
  for (bool inter : {false, true}) {
    Job job;
    job.nranks = 4;
    job.node = inter ? interleaved(2, 2) : contiguous(2, 2);
    auto st = run(job, [&](int, hcComm_t comm) {
      const size_t per_rank = (64u << 20) / 4 / 4;  // floats
      int f = checkAllGather(comm, hcFloat32, per_rank, true, 1);
      f += checkAllGather(comm, hcFloat32, per_rank, false, 2);
      f += checkReduceScatter(comm, hcFloat32, hcSum, per_rank, false, 3);
      f += checkAllReduce(comm, hcBfloat16, hcSum, per_rank * 2 + 3, true, 4);
      return f;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << (inter ? " interleaved" : "");
  }
}

// Uneven nodes take the announced fallback and stay exact.
TEST(CollectivesUneven, ThreeRanksOnTwoNodes) {
  Job job;
  job.nranks = 3;
  job.node = {"a", "a", "b"};
  auto st = run(job, [&](int, hcComm_t comm) {
    int f = checkMatrix(comm, {1, 33});
    hcStats s = HC_STATS_INITIALIZER;
    hcCommGetStats(comm, &s);
    if (s.coll[hcCollAllGather].calls[hcPathFallback] == 0 || s.coll[hcCollAllGather].calls[hcPathHierarchical] != 0 ||
        std::string(s.coll[hcCollAllGather].last_fallback_reason).find("uneven") == std::string::npos) {
      std::fprintf(stderr, "uneven layout did not fall back: %s\n", s.coll[hcCollAllGather].last_fallback_reason);
      ++f;
    }
    return f;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

// The ring (forced) and the two-copy intra-node path give the same answers.
TEST(CollectivesPaths, RingAndBounceBuffers) {
  for (auto env : {std::map<std::string, std::string>{{"HICOLL_ALGO", "ring"}},
                   std::map<std::string, std::string>{{"HICOLL_SHM_CMA", "0"}}}) {
    Job job;
    job.nranks = 4;
    job.node = interleaved(2, 2);
    job.env = env;
    auto st = run(job, [&](int, hcComm_t comm) { return checkMatrix(comm, {1, 4099}); });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << " " << env.begin()->first;
  }
}

// The ring ReduceScatter (and AllGather) with 4 KiB chunks: blocks of many more chunks than it
// keeps under way (every slot reused), ragged last chunks, every op (PreMulSum scales before
// the first send).
TEST(CollectivesPaths, RingReduceScatterManyChunks) {
  for (auto l : {Layout{1, 3, false}, Layout{2, 2, true}}) {
    Job job;
    job.nranks = l.nodes * l.per_node;
    job.node = l.interleave ? interleaved(l.nodes, l.per_node) : contiguous(l.nodes, l.per_node);
    job.env = {{"HICOLL_ALGO", "ring"}, {"HICOLL_CHUNK_SIZE", "4096"}, {"HICOLL_NET_CHUNK_SIZE", "4096"}};
    auto st = run(job, [&](int, hcComm_t comm) {
      int f = 0, salt = 0;
      for (size_t count : {1u, 1025u, 70001u}) {
        for (int op = 0; op <= hcNumOps; ++op)  // the bitwise ops on an integer type
          f += checkReduceScatter(comm, isBitwise(op) ? hcInt64 : hcFloat32, static_cast<hcRedOp_t>(op), count,
                                  count == 1025, ++salt);
        f += checkReduceScatter(comm, hcBfloat16, hcSum, count, true, ++salt);
        f += checkAllReduce(comm, hcInt64, hcSum, count * 5, false, ++salt);
        // The ring AllGather in chunks: many per block, ragged last ones, every step pipelined.
        f += checkAllGather(comm, hcFloat32, count, false, ++salt);
        f += checkAllGather(comm, hcBfloat16, count * 3, true, ++salt);
      }
      hcStats s = HC_STATS_INITIALIZER;
      hcCommGetStats(comm, &s);
      if (s.coll[hcCollReduceScatter].calls[hcPathRing] == 0 || s.coll[hcCollReduceScatter].calls[hcPathHierarchical]) {
        std::fprintf(stderr, "the ring did not run\n");
        ++f;
      }
      return f;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << l.nodes << "x" << l.per_node << " rank " << r;
  }
}

// Large AllReduces whose count is not a multiple of the ranks: W blocks through ReduceScatter +
// AllGather, the last count % W elements through the small path; hierarchical and ring.
TEST(CollectivesPaths, AllReduceTailsOfFewerThanWElements) {
  for (auto l : {Layout{1, 3, false}, Layout{2, 2, true}})
    for (const char* algo : {"hier", "ring"}) {
      Job job;
      job.nranks = l.nodes * l.per_node;
      job.node = l.interleave ? interleaved(l.nodes, l.per_node) : contiguous(l.nodes, l.per_node);
      job.env = {{"HICOLL_ALGO", algo}};
      auto st = run(job, [&](int, hcComm_t comm) {
        int f = 0, salt = 0;
        const size_t base = 20000 * static_cast<size_t>(job.nranks);  // 80 KB of fp32 and more
        for (size_t tail = 0; tail < static_cast<size_t>(job.nranks); ++tail) {
          f += checkAllReduce(comm, hcFloat32, hcSum, base + tail, tail % 2 == 0, ++salt);
          f += checkAllReduce(comm, hcFloat64, hcAvg, base + tail, tail % 2 == 1, ++salt);
          f += checkAllReduce(comm, hcBfloat16, static_cast<hcRedOp_t>(hcNumOps), 2 * base + tail, true, ++salt);
        }
        return f;
      });
      for (int r = 0; r < job.nranks; ++r)
        EXPECT_EQ(st[r], 0) << l.nodes << "x" << l.per_node << " " << algo << " rank " << r;
    }
}

// Without single-copy reads (HICOLL_SHM_CMA=0) one node keeps the hierarchical ReduceScatter and
// AllReduce (push through scratch, bounce buffers); across nodes they fall back, saying why.
TEST(CollectivesPaths, NoSingleCopyReadsOneNodeStaysHierarchical) {
  for (auto l : {Layout{1, 3, false}, Layout{2, 2, false}}) {
    Job job;
    job.nranks = l.nodes * l.per_node;
    job.node = contiguous(l.nodes, l.per_node);
    job.env = {{"HICOLL_SHM_CMA", "0"}};
    auto st = run(job, [&](int, hcComm_t comm) {
      int f = 0, salt = 0;
      for (size_t count : {1u, 4099u, 300001u}) {
        f += checkReduceScatter(comm, hcFloat32, hcSum, count, false, ++salt);
        f += checkReduceScatter(comm, hcBfloat16, hcMax, count, true, ++salt);
        f += checkAllReduce(comm, hcFloat32, hcSum, count * 3, true, ++salt);
      }
      hcStats s = HC_STATS_INITIALIZER;
      hcCommGetStats(comm, &s);
      for (hcColl_t coll : {hcCollReduceScatter, hcCollAllReduce}) {
        const auto& cs = s.coll[coll];
        const bool want_hier = l.nodes == 1;
        const bool hier_only = cs.calls[hcPathHierarchical] > 0 && cs.calls[hcPathFallback] == 0;
        // Small AllReduces (one AllGather) stay hierarchical on two nodes too.
        const bool fell_back = cs.calls[hcPathFallback] > 0 &&
                               std::string(cs.last_fallback_reason).find("single-copy") != std::string::npos;
        if (want_hier ? !hier_only : !fell_back) {
          std::fprintf(stderr, "%dx%d %s: %llu hierarchical, %llu fallback calls (%s)\n", l.nodes, l.per_node,
                       coll == hcCollReduceScatter ? "ReduceScatter" : "AllReduce",
                       static_cast<unsigned long long>(cs.calls[hcPathHierarchical]),
                       static_cast<unsigned long long>(cs.calls[hcPathFallback]), cs.last_fallback_reason);
          ++f;
        }
      }
      return f;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << l.nodes << "x" << l.per_node << " rank " << r;
  }
}

// Inter-node messages of the smallest size (4 KiB chunks that do not divide the blocks) and one
// chunk in flight per rail peer: the pacing of the hierarchical AllGather and ReduceScatter.
// On one node (1x3), 4 KiB chunks make the ReduceScatter reuse each scratch slot many times.
TEST(CollectivesPaths, SmallestChunksOneInFlight) {
  for (auto l : {Layout{2, 2, true}, Layout{3, 2, false}, Layout{1, 3, false}}) {
    Job job;
    job.nranks = l.nodes * l.per_node;
    job.node = l.interleave ? interleaved(l.nodes, l.per_node) : contiguous(l.nodes, l.per_node);
    job.env = {{"HICOLL_NET_CHUNK_SIZE", "4096"}, {"HICOLL_NET_WINDOW", "1"}};
    if (l.nodes == 1) job.env = {{"HICOLL_CHUNK_SIZE", "4096"}};
    auto st = run(job, [&](int, hcComm_t comm) {
      int f = 0, salt = 0;
      for (size_t count : {1u, 5000u, 70001u}) {
        f += checkAllGather(comm, hcFloat32, count, false, ++salt);
        f += checkAllGather(comm, hcInt8, count, true, ++salt);
        f += checkReduceScatter(comm, hcFloat32, hcSum, count, false, ++salt);
        f += checkReduceScatter(comm, hcFloat64, hcMax, count, true, ++salt);
      }
      hcStats s = HC_STATS_INITIALIZER;
      hcCommGetStats(comm, &s);
      if (s.coll[hcCollAllGather].calls[hcPathHierarchical] == 0 ||
          s.coll[hcCollReduceScatter].calls[hcPathHierarchical] == 0) {
        std::fprintf(stderr, "the hierarchical paths did not run\n");
        ++f;
      }
      return f;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << " " << l.nodes << "x" << l.per_node;
  }
}

// Back-to-back AllGathers with the input overwritten as soon as each call returns, of varying
// sizes, mixed with ReduceScatters that reuse the segment. Small blocks (eager: staged before
// the peers are known to have started, and ranks return without waiting for each other) and
// larger ones (peers read the user buffer itself: a rank must not return before they have).
TEST(CollectivesBackToBack, CallsNeverSeeTheNextCallsData) {
  for (auto l : {Layout{1, 2, false}, Layout{1, 4, false}, Layout{2, 2, true}}) {
    Job job;
    job.nranks = l.nodes * l.per_node;
    job.node = l.interleave ? interleaved(l.nodes, l.per_node) : contiguous(l.nodes, l.per_node);
    auto st = run(job, [&](int rank, hcComm_t comm) {
      const int W = job.nranks;
      int wrong = 0;
      for (size_t base : {size_t{37}, size_t{3001}}) {  // int32 per rank: ~150 B (eager), 12 KB
        const size_t most = base + 16;
        std::vector<int32_t> in(most), out(most * W), rs_in(most * W), rs_out(most);
        const int calls = base < 1000 ? 2000 : 300;
        for (int it = 0; it < calls && wrong == 0; ++it) {
          const size_t n = base + static_cast<size_t>(it % 3) * 8;
          const bool in_place = it % 4 == 0;
          auto want = [&](int r, size_t i) { return it * 10000 + r * 1000 + static_cast<int32_t>(i % 1000); };
          for (size_t i = 0; i < n; ++i) in[i] = want(rank, i);
          const int32_t* src = in.data();
          if (in_place) {
            std::copy(in.begin(), in.begin() + static_cast<long>(n), out.begin() + static_cast<long>(rank * n));
            src = out.data() + rank * n;
          }
          if (hcAllGather(src, out.data(), n, hcInt32, comm, nullptr) != hcSuccess) return 1;
          // The next call's data, as soon as this one returns.
          std::fill(in.begin(), in.end(), -1);
          if (in_place)
            std::fill(out.begin() + static_cast<long>(rank * n), out.begin() + static_cast<long>((rank + 1) * n), -1);
          for (int r = 0; r < W; ++r)
            for (size_t i = 0; i < n; ++i)
              if (r != rank && out[r * n + i] != want(r, i)) ++wrong;
          if (it % 97 == 0) {  // a ReduceScatter between: it writes the same segment
            for (size_t i = 0; i < n * W; ++i) rs_in[i] = static_cast<int32_t>(i) + rank;
            if (hcReduceScatter(rs_in.data(), rs_out.data(), n, hcInt32, hcSum, comm, nullptr) != hcSuccess) return 1;
            for (size_t i = 0; i < n; ++i)
              if (rs_out[i] != W * static_cast<int32_t>(rank * n + i) + W * (W - 1) / 2) ++wrong;
          }
          if (wrong) std::fprintf(stderr, "[rank %d] %zu per rank, call %d: %d wrong elements\n", rank, n, it, wrong);
        }
      }
      return wrong;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << " " << l.nodes << "x" << l.per_node;
  }
}

}  // namespace
}  // namespace hctest

namespace hctest {
namespace {

// A small call whose shape was planned before takes the lean entry (algorithms/node_small.h);
// one whose in-place flag changed is planned again on the general path. Rank 0 alternates in
// place and out of place, so it takes the general path every call while its peers take the
// lean one: both must stage and read the same layout, call after call, every result checked.
TEST(CollectivesBackToBack, RanksOnDifferentEntriesOfOneSmallCall) {
  for (int L : {2, 3, 4}) {
    Job job;
    job.nranks = L;
    auto st = run(job, [&](int rank, hcComm_t comm) {
      const int W = L;
      const size_t n = 6;  // int32 per rank: staged
      std::vector<int32_t> in(n * W), out(n * W), big(5000), big_out_buf(5000);
      int wrong = 0;
      for (int it = 0; it < 300 && wrong == 0; ++it) {
        const bool in_place = rank == 0 && it % 2 == 1;
        auto v = [&](int r, size_t i) { return it * 1000 + r * 100 + static_cast<int32_t>(i); };
        // AllGather
        for (size_t i = 0; i < n; ++i) in[i] = v(rank, i);
        if (in_place) std::copy(in.begin(), in.begin() + n, out.begin() + rank * n);
        if (hcAllGather(in_place ? out.data() + rank * n : in.data(), out.data(), n, hcInt32, comm, nullptr) !=
            hcSuccess)
          return 100;
        for (int r = 0; r < W; ++r)
          for (size_t i = 0; i < n; ++i) wrong += out[r * n + i] != v(r, i);
        // ReduceScatter: block r of every rank's input holds v(r, i) + rank
        for (int r = 0; r < W; ++r)
          for (size_t i = 0; i < n; ++i) in[r * n + i] = v(r, i) + rank;
        int32_t* rs_out = in_place ? in.data() + rank * n : out.data();
        if (hcReduceScatter(in.data(), rs_out, n, hcInt32, hcSum, comm, nullptr) != hcSuccess) return 101;
        for (size_t i = 0; i < n; ++i) wrong += rs_out[i] != W * v(rank, i) + W * (W - 1) / 2;
        // AllReduce
        for (size_t i = 0; i < n; ++i) in[i] = v(rank, i);
        int32_t* ar_out = in_place ? in.data() : out.data();
        if (hcAllReduce(in.data(), ar_out, n, hcInt32, hcMax, comm, nullptr) != hcSuccess) return 102;
        for (size_t i = 0; i < n; ++i) wrong += ar_out[i] != v(W - 1, i);
        // Broadcast from a root that moves
        const int root = it % W;
        for (size_t i = 0; i < n; ++i) in[i] = v(rank, i);
        int32_t* bc_out = in_place ? in.data() : out.data();
        if (hcBroadcast(in.data(), bc_out, n, hcInt32, root, comm, nullptr) != hcSuccess) return 103;
        for (size_t i = 0; i < n; ++i) wrong += bc_out[i] != v(root, i);
        // A Broadcast of 20 KB: staged too (up to 8 x the eager size), read at once.
        for (size_t i = 0; i < big.size(); ++i) big[i] = v(rank, i);
        int32_t* big_out = in_place ? big.data() : big_out_buf.data();
        if (hcBroadcast(big.data(), big_out, big.size(), hcInt32, root, comm, nullptr) != hcSuccess) return 104;
        for (size_t i = 0; i < big.size(); ++i) wrong += big_out[i] != v(root, i);
        if (wrong) std::fprintf(stderr, "[rank %d] call %d: %d wrong elements\n", rank, it, wrong);
      }
      return wrong;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << " of 1x" << L;
  }
}

// Without single-copy reads, an AllGather of large blocks stages them across this rank's
// scratch, and a following small call writes its parity half before it posts: a peer still
// copying the large blocks must not see them change. Large and small calls (AllGather,
// AllReduce, AllToAll) alternate, every result checked.
TEST(CollectivesBackToBack, LargeStagedThenSmallCallsWithoutSingleCopyReads) {
  for (int L : {2, 3}) {
    Job job;
    job.nranks = L;
    job.env["HICOLL_SHM_CMA"] = "0";
    auto st = run(job, [&](int rank, hcComm_t comm) {
      const int W = L;
      const size_t big = 60000, small = 37;  // int32 per rank: 240 KB staged; 148 B early
      std::vector<int32_t> in(big), out(big * W), a2a_in(small * W), a2a_out(small * W);
      int wrong = 0;
      for (int it = 0; it < 400 && wrong == 0; ++it) {
        auto want = [&](int r, size_t i) { return (it * 7 + r * 1000003 + static_cast<int32_t>(i)) & 0x7fffffff; };
        for (size_t n : {big, small}) {
          for (size_t i = 0; i < n; ++i) in[i] = want(rank, i);
          if (hcAllGather(in.data(), out.data(), n, hcInt32, comm, nullptr) != hcSuccess) return 1;
          std::fill(in.begin(), in.begin() + static_cast<long>(n), -1);  // the next call's data at once
          for (int r = 0; r < W; ++r)
            for (size_t i = 0; i < n; ++i) wrong += out[r * n + i] != want(r, i);
          if (wrong) std::fprintf(stderr, "[rank %d] AllGather of %zu per rank wrong\n", rank, n);
          if (n == big) {  // an AllReduce staged in scratch right after the large gather
            std::vector<int32_t> x(4096, rank + it);
            if (hcAllReduce(x.data(), x.data(), x.size(), hcInt32, hcSum, comm, nullptr) != hcSuccess) return 1;
            for (int32_t v : x) wrong += v != W * it + W * (W - 1) / 2;
            if (wrong) std::fprintf(stderr, "[rank %d] AllReduce wrong\n", rank);
          }
          if (n == big) {  // an AllToAll of small blocks right after the large gather
            for (int d = 0; d < W; ++d)
              for (size_t i = 0; i < small; ++i) a2a_in[d * small + i] = want(rank, d * 100 + i);
            if (hcAllToAll(a2a_in.data(), a2a_out.data(), small, hcInt32, comm, nullptr) != hcSuccess) return 1;
            std::fill(a2a_in.begin(), a2a_in.end(), -1);
            for (int s = 0; s < W; ++s)
              for (size_t i = 0; i < small; ++i) wrong += a2a_out[s * small + i] != want(s, rank * 100 + i);
            if (wrong) std::fprintf(stderr, "[rank %d] AllToAll wrong\n", rank);
          }
        }
        if (wrong) std::fprintf(stderr, "[rank %d] call pair %d: %d wrong elements\n", rank, it, wrong);
      }
      return wrong;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << " of 1x" << L;
  }
}

// Small Broadcasts on one node run ahead of their peers (ring phases, transport/shm/board.h):
// runs of them longer than the board's ring, from one root or a moving one, in the slot (8 B),
// in the slot's ring data (100, 256 B), then one in scratch (2000 B or 64 KiB), each followed at once by new
// data in the root's buffer, then AllGathers (staged in scratch before the post, and large)
// and a small AllReduce: every result checked. A rank that is not the root pauses
// early in each run, so that the root fills its ring and must wait for it.
TEST(CollectivesBackToBack, BroadcastsRunAheadThenOtherCalls) {
  for (int L : {2, 3, 4}) {
    Job job;
    job.nranks = L;

    auto st = run(job, [&](int rank, hcComm_t comm) {
      const int W = L;
      const size_t big = 30000;
      // 64 KiB: the largest staged Broadcast (16 x HICOLL_SHM_EAGER_BYTES) where the ranks
      // outnumber the host's cores (L = 3, 4 on 2 cores), else read from the root's buffer.
      const size_t staged_max = 16384;
      std::vector<int32_t> in(big), out(big * W), bc(staged_max), bc_out(staged_max);
      int wrong = 0;
      for (int it = 0; it < 120 && wrong == 0; ++it) {
        const int run_len = 1 + (it * 7) % 60;
        for (int k = 0; k < run_len && wrong == 0; ++k) {
          // The run's last one is staged in scratch (a phase that waits for every rank).
          const size_t n = k == run_len - 1 ? (it % 4 == 1 ? staged_max : 500)
                                            : std::vector<size_t>{2, 25, 64}[static_cast<size_t>(k + it) % 3];
          const int root = it % 2 ? (k % W) : it % W;
          auto want = [&](size_t i) { return static_cast<int32_t>(it * 100000 + k * 1000 + root * 7 + i); };
          const bool in_place = (k + rank) % 2 == 0;
          if (k == 3 && rank != root) usleep(300);  // the root runs ahead: its ring fills
          for (size_t i = 0; i < n; ++i) bc[i] = rank == root ? want(i) : -5;
          int32_t* o = in_place ? bc.data() : bc_out.data();
          if (hcBroadcast(bc.data(), o, n, hcInt32, root, comm, nullptr) != hcSuccess) return 100;
          for (size_t i = 0; i < n; ++i) wrong += o[i] != want(i);
          std::fill(bc.begin(), bc.begin() + static_cast<long>(n), -7);  // the root's next data at once
          if (wrong) std::fprintf(stderr, "[rank %d] it %d Broadcast %d of %zu from %d wrong\n", rank, it, k, n, root);
        }
        for (size_t n : {size_t{700}, big}) {
          if (n == big && it % 3) continue;
          for (size_t i = 0; i < n; ++i) in[i] = static_cast<int32_t>(it + rank * 1000003 + i);
          if (hcAllGather(in.data(), out.data(), n, hcInt32, comm, nullptr) != hcSuccess) return 101;
          for (int r = 0; r < W; ++r)
            for (size_t i = 0; i < n; ++i) wrong += out[r * n + i] != static_cast<int32_t>(it + r * 1000003 + i);
        }
        int32_t x[3] = {rank, it, 1};
        if (hcAllReduce(x, x, 3, hcInt32, hcSum, comm, nullptr) != hcSuccess) return 102;
        wrong += x[0] != W * (W - 1) / 2 || x[1] != W * it || x[2] != W;
        if (wrong) std::fprintf(stderr, "[rank %d] it %d: %d wrong\n", rank, it, wrong);
      }
      return wrong;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << " of 1x" << L;
  }
}

// A root returns from a small Broadcast before its peers started it, and may destroy its
// communicator at once (which does not wait for them) or exit without destroying it: the
// peers that come later still read its data, and their destroy succeeds.
TEST(CollectivesBackToBack, BroadcastRootDestroysOrExitsBeforeItsPeersRead) {
  for (int L : {2, 3})
    for (bool destroys : {true, false}) {
      Job job;
      job.nranks = L;
      auto st = runRaw(job, [&](int rank) {
        hcComm_t comm = nullptr;
        if (hcCommInitFromEnv(&comm) != hcSuccess) return 2;
        std::vector<int32_t> x(40, rank == 0 ? 77 : -1);  // 160 B: the slot's ring data
        int32_t y = rank == 0 ? 5 : -1;                   // 4 B: the polled line
        int32_t z = 1;                                    // every rank's creation is over (rank 0 hosts the rendezvous)
        if (hcAllReduce(&z, &z, 1, hcInt32, hcSum, comm, nullptr) != hcSuccess) return 9;
        if (rank != 0) usleep(200000);
        if (hcBroadcast(&y, &y, 1, hcInt32, 0, comm, nullptr) != hcSuccess) return 3;
        if (hcBroadcast(x.data(), x.data(), x.size(), hcInt32, 0, comm, nullptr) != hcSuccess) return 4;
        if (rank == 0 && !destroys) _exit(0);  // its segment lives on in the peers' mappings
        const hcResult_t d = hcCommDestroy(comm);
        if (rank == 0) return d == hcSuccess ? 0 : 5;
        if (y != 5) return 6;
        for (int32_t v : x)
          if (v != 77) return 7;
        return d == hcSuccess ? 0 : 8;
      });
      for (int r = 0; r < job.nranks; ++r)
        EXPECT_EQ(st[r], 0) << "rank " << r << " of 1x" << L << (destroys ? " (destroys)" : " (exits)");
    }
}

}  // namespace
}  // namespace hctest
