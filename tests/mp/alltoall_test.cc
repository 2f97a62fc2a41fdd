// Tier 3: hcAllToAll / hcAllToAllv over 1-3 simulated nodes: uneven counts (zeros included),
// displacements with gaps, every path a block can take (read in place, through the segment,
// node memory, the network), checked element by element; counts that differ fail the pair on
// both of its ranks, naming both, and the others too; bad arguments fail every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/mp.h"

namespace hctest {
namespace {

// Elements rank s sends rank d (salt varies it per call): zeros, small and multi-chunk blocks.
size_t countOf(int s, int d, int salt, size_t scale) {
  return static_cast<size_t>((s * 7 + d * 3 + salt) % 5) * scale;
}
// The value of element i of the block s -> d (exact in every dtype used: below 2^7 for int8).
int64_t valueOf(int s, int d, size_t i, hcDataType_t t) {
  const int64_t v = s * 1000003 + d * 1009 + static_cast<int64_t>(i) * 7;
  return t == hcUint8 ? v & 0x7f : v & 0xffffff;
}

void put(void* buf, size_t at, hcDataType_t t, int64_t v) {
  switch (t) {
    case hcUint8: static_cast<uint8_t*>(buf)[at] = static_cast<uint8_t>(v); break;
    case hcInt32: static_cast<int32_t*>(buf)[at] = static_cast<int32_t>(v); break;
    case hcFloat64: static_cast<double*>(buf)[at] = static_cast<double>(v); break;
    default: break;
  }
}
int64_t get(const void* buf, size_t at, hcDataType_t t) {
  switch (t) {
    case hcUint8: return static_cast<const uint8_t*>(buf)[at];
    case hcInt32: return static_cast<const int32_t*>(buf)[at];
    case hcFloat64: return static_cast<int64_t>(static_cast<const double*>(buf)[at]);
    default: return -1;
  }
}

struct Buffers {
  void* p = nullptr;
  std::vector<char> heap;
  bool node = false;
  Buffers(size_t bytes, bool node_memory) : node(node_memory) {
    if (node) {
      if (hcMemAlloc(&p, bytes ? bytes : 1) != hcSuccess) p = nullptr;
    } else {
      heap.assign(bytes ? bytes : 1, 0);
      p = heap.data();
    }
  }
  ~Buffers() {
    if (node) hcMemFree(p);
  }
};

// One AllToAllv (gaps: one unused element between blocks, displacements given) or, with
// equal, hcAllToAll; returns the number of wrong elements (or 1000 for a failed call).
int checkAllToAll(hcComm_t comm, hcDataType_t t, size_t scale, int salt, bool gaps, bool equal, bool node_memory,
                  size_t (*count)(int, int, int, size_t) = countOf) {
  int me = 0, W = 0;
  hcCommUserRank(comm, &me);
  hcCommCount(comm, &W);
  const size_t e = hcTypeSize(t);
  std::vector<size_t> sc(W), rc(W), sd(W), rd(W);
  size_t sn = 0, rn = 0;
  for (int p = 0; p < W; ++p) {
    sc[p] = equal ? scale : count(me, p, salt, scale);
    rc[p] = equal ? scale : count(p, me, salt, scale);
    sd[p] = sn;
    rd[p] = rn;
    sn += sc[p] + (gaps ? 1 : 0);
    rn += rc[p] + (gaps ? 1 : 0);
  }
  Buffers send(sn * e, node_memory), recv(rn * e, node_memory);
  if (!send.p || !recv.p) return 1000;
  std::memset(recv.p, 0x5a, rn * e);
  for (int p = 0; p < W; ++p)
    for (size_t i = 0; i < sc[p]; ++i) put(send.p, sd[p] + i, t, valueOf(me, p, i, t));
  const hcResult_t r = equal ? hcAllToAll(send.p, recv.p, scale, t, comm, nullptr)
                             : hcAllToAllv(send.p, sc.data(), gaps ? sd.data() : nullptr, recv.p, rc.data(),
                                           gaps ? rd.data() : nullptr, t, comm, nullptr);
  if (r != hcSuccess) {
    std::fprintf(stderr, "rank %d: AllToAll failed: %s\n", me, hcGetLastError(comm));
    return 1000;
  }
  int wrong = 0;
  for (int p = 0; p < W; ++p) {
    for (size_t i = 0; i < rc[p]; ++i)
      if (get(recv.p, rd[p] + i, t) != valueOf(p, me, i, t) && wrong++ < 3)
        std::fprintf(stderr, "rank %d: element %zu from rank %d is %lld, not %lld\n", me, i, p,
                     static_cast<long long>(get(recv.p, rd[p] + i, t)), static_cast<long long>(valueOf(p, me, i, t)));
    // The gaps stay untouched.
    if (gaps && static_cast<const unsigned char*>(recv.p)[(rd[p] + rc[p]) * e] != 0x5a && wrong++ < 3)
      std::fprintf(stderr, "rank %d: the gap after the block from rank %d was written\n", me, p);
  }
  return wrong;
}

struct Layout {
  const char* name;
  int nodes, per_node;
  bool interleave;
};

class AllToAll : public testing::TestWithParam<Layout> {};

std::string name(const testing::TestParamInfo<Layout>& i) {
  return i.param.name;
}

Job jobOf(const Layout& l) {
  Job job;
  job.nranks = l.nodes * l.per_node;
  job.node = l.interleave ? interleaved(l.nodes, l.per_node) : contiguous(l.nodes, l.per_node);
  job.timeout_s = 120;
  // Small chunks: blocks of the larger scale go as many chunks.
  job.env["HICOLL_CHUNK_SIZE"] = "4096";
  job.env["HICOLL_NET_CHUNK_SIZE"] = "4096";
  return job;
}

int everyShape(hcComm_t comm, bool node_memory) {
  int f = 0, salt = 0;
  for (hcDataType_t t : {hcUint8, hcInt32, hcFloat64})
    for (size_t scale : {size_t{1}, size_t{3000}})  // 3000 x 8 B: above the eager size, 6 chunks
      for (bool gaps : {false, true}) f += checkAllToAll(comm, t, scale, ++salt, gaps, false, node_memory);
  f += checkAllToAll(comm, hcInt32, 5, ++salt, false, true, node_memory);
  f += checkAllToAll(comm, hcInt32, 0, ++salt, false, true, node_memory);  // every count zero
  return f;
}

TEST_P(AllToAll, UnevenCountsAndGapsMatchElementByElement) {
  Job job = jobOf(GetParam());
  auto st = run(job, [&](int, hcComm_t comm) {
    int f = everyShape(comm, false);
    hcStats s = HC_STATS_INITIALIZER;
    hcCommGetStats(comm, &s);
    const hcCollStats& a = s.coll[hcCollAllToAll];
    if (a.calls[hcPathRing] != 14 || a.calls[hcPathFallback] || a.calls[hcPathHierarchical]) {
      std::fprintf(stderr, "AllToAll counted %llu/%llu/%llu calls, not 14 pairwise\n",
                   static_cast<unsigned long long>(a.calls[0]), static_cast<unsigned long long>(a.calls[1]),
                   static_cast<unsigned long long>(a.calls[2]));
      ++f;
    }
    if ((s.nnodes > 1) != (a.bytes_inter > 0) || (s.nranks > s.nnodes) != (a.bytes_intra > 0)) {
      std::fprintf(stderr, "AllToAll bytes: intra %llu, inter %llu\n", static_cast<unsigned long long>(a.bytes_intra),
                   static_cast<unsigned long long>(a.bytes_inter));
      ++f;
    }
    return f;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

// Without single-copy reads every local block goes through the segment; in node memory every
// large one is read with plain loads.
TEST_P(AllToAll, WithoutSingleCopyReadsAndInNodeMemory) {
  if (GetParam().per_node < 2) GTEST_SKIP() << "no local peers";
  for (bool node_memory : {false, true}) {
    Job job = jobOf(GetParam());
    job.env["HICOLL_SHM_CMA"] = "0";
    auto st = run(job, [&](int, hcComm_t comm) {
      int f = everyShape(comm, node_memory);
      hcStats s = HC_STATS_INITIALIZER;
      hcCommGetStats(comm, &s);
      if (node_memory != (s.bytes_node_memory[hcCollAllToAll] > 0)) {
        std::fprintf(stderr, "node memory read %llu bytes\n",
                     static_cast<unsigned long long>(s.bytes_node_memory[hcCollAllToAll]));
        ++f;
      }
      return f;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << (node_memory ? " node memory" : "");
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, AllToAll,
                         testing::Values(Layout{"1x1", 1, 1, false}, Layout{"1x3", 1, 3, false},
                                         Layout{"2x1", 2, 1, false}, Layout{"2x2", 2, 2, false},
                                         Layout{"2x2i", 2, 2, true}, Layout{"3x2", 3, 2, false}),
                         name);

// On one node a rank whose blocks both ways are all small takes the lean entry
// (algorithms/node_small.cc) while ranks with a large block take the general one, in the same
// call: rank 0's blocks are 3 elements, ranks 1 and 2 exchange 2000 (above the eager size).
// Repeated, so that the later calls find their plan memoised.
TEST(AllToAllEntries, SmallAndLargeBlocksOnOneNodeMixTheEntries) {
  for (const char* cma : {"auto", "0"}) {
    Job job;
    job.nranks = 3;
    job.node = contiguous(1, 3);
    job.timeout_s = 60;
    job.env["HICOLL_SHM_CMA"] = cma;
    auto st = run(job, [&](int, hcComm_t comm) {
      auto mixed = [](int s, int d, int, size_t) -> size_t { return s == 0 || d == 0 ? 3 : 2000; };
      int f = 0;
      for (int call = 0; call < 4; ++call)
        for (bool gaps : {false, true}) f += checkAllToAll(comm, hcInt32, 1, call, gaps, false, false, mixed);
      return f;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << " HICOLL_SHM_CMA=" << cma;
  }
}

// Rank 0 expects 5 elements from rank 3, which sends it 4: both fail the call naming the pair;
// the others fail it too (hcRemoteError), or, when they had all their blocks before they
// heard, keep right data and fail their next call naming the cause. None waits for a timeout.
TEST(AllToAllMismatch, CountsThatDifferFailThePairNamingBothAndTheOthers) {
  for (const char* layout : {"1x4", "2x2"}) {
    Job job;
    job.nranks = 4;
    job.node = std::string(layout) == "1x4" ? contiguous(1, 4) : contiguous(2, 2);
    job.env["HICOLL_TIMEOUT_MS"] = "20000";
    job.timeout_s = 60;
    auto st = run(job, [&](int me, hcComm_t comm) {
      std::vector<size_t> sc(4, 4), rc(4, 4);
      if (me == 0) rc[3] = 5;
      std::vector<int32_t> in(16, me), out(17, -1);
      const auto t0 = std::chrono::steady_clock::now();
      const hcResult_t r =
          hcAllToAllv(in.data(), sc.data(), nullptr, out.data(), rc.data(), nullptr, hcInt32, comm, nullptr);
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string msg = hcGetLastError(comm);
      std::fprintf(stderr, "[%s rank %d] %s in %.2f s: %s\n", layout, me, hcGetErrorString(r), took, msg.c_str());
      if (r == hcSuccess && (me == 0 || me == 3)) return 11;
      if (took > 5.0) return 12;
      if (me == 0 || me == 3) {
        if (r != hcInvalidUsage) return 13;
        if (msg.find("rank 3 (node") == std::string::npos ||
            msg.find("sends 4 elements to rank 0 (node") == std::string::npos ||
            msg.find("which expects 5") == std::string::npos)
          return 14;
        return 0;
      }
      if (r == hcSuccess) {
        for (int s = 0; s < 4; ++s)
          for (int i = 0; i < 4; ++i)
            if (out[static_cast<size_t>(s * 4 + i)] != s) return 16;
        int32_t x = 1;
        const hcResult_t next = hcAllReduce(&x, &x, 1, hcInt32, hcSum, comm, nullptr);
        const std::string why = hcGetLastError(comm);
        std::fprintf(stderr, "[%s rank %d] next call: %s: %s\n", layout, me, hcGetErrorString(next), why.c_str());
        if (next != hcRemoteError || why.find("which expects 5") == std::string::npos) return 17;
        return 0;
      }
      return r == hcRemoteError ? 0 : 15;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << layout << " rank " << r;
  }
}

// A rank's own bad arguments are hcInvalidArgument there, naming what is wrong; its peers fail
// the same call (they are told) instead of pairing with its next one.
TEST(AllToAllArguments, BadArgumentsFailEveryRankNamingWhatIsWrong) {
  struct Case {
    const char* what;
    const char* must_mention;
  };
  const Case cases[] = {{"null counts", "sendcounts is NULL"},
                        {"overlap", "overlap"},
                        {"self", "sends itself"},
                        {"null buffer", "NULL send buffer"}};
  for (const Case& k : cases) {
    Job job;
    job.nranks = 4;
    job.node = contiguous(2, 2);
    job.env["HICOLL_TIMEOUT_MS"] = "20000";
    job.timeout_s = 60;
    auto st = run(job, [&](int me, hcComm_t comm) {
      std::vector<size_t> sc(4, 2), rc(4, 2);
      std::vector<int32_t> buf(16, me), out(8, -1);
      const void* send = buf.data();
      void* recv = out.data();
      const size_t* scp = sc.data();
      if (me == 1) {
        if (std::string(k.what) == "null counts") scp = nullptr;
        if (std::string(k.what) == "overlap") recv = buf.data() + 4;
        if (std::string(k.what) == "self") rc[1] = 3;
        if (std::string(k.what) == "null buffer") send = nullptr;
      }
      const hcResult_t r = hcAllToAllv(send, scp, nullptr, recv, rc.data(), nullptr, hcInt32, comm, nullptr);
      const std::string msg = hcGetLastError(comm);
      std::fprintf(stderr, "[%s rank %d] %s: %s\n", k.what, me, hcGetErrorString(r), msg.c_str());
      if (r == hcSuccess) return 11;
      if (me == 1 && (r != hcInvalidArgument || msg.find(k.must_mention) == std::string::npos)) return 12;
      if (me != 1 && r != hcRemoteError && r != hcInvalidUsage) return 13;
      return 0;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << k.what << " rank " << r;
  }
}

// A caller built when hcNumColls was 5 passes the old struct's size and reads its own layout.
TEST(AllToAllStats, ACallerOfTheFiveCollectiveLayoutReadsItsFields) {
  struct Stats5 {
    size_t size;
    int rank, nranks, nnodes, local_ranks, node, local_rank;
    hcCollStats coll[5];
    uint64_t bytes_node_memory[5];
    uint64_t quantized_calls[5];
    double predicted_us[5];
  };
  Job job;
  job.nranks = 2;
  job.node = contiguous(2, 1);
  auto st = run(job, [&](int, hcComm_t comm) {
    std::vector<float> in(64, 1.0f), out(128);
    hcQuant q = HC_QUANT_INITIALIZER;
    if (hcAllGatherQuantized(in.data(), out.data(), 64, hcFloat32, &q, comm, nullptr) != hcSuccess) return 1;
    if (hcAllToAll(in.data(), out.data(), 32, hcFloat32, comm, nullptr) != hcSuccess) return 2;
    Stats5 old{};
    old.size = sizeof old;
    if (hcCommGetStats(comm, reinterpret_cast<hcStats*>(&old)) != hcSuccess) return 3;
    hcStats now = HC_STATS_INITIALIZER;
    hcCommGetStats(comm, &now);
    if (old.nranks != 2 ||
        old.coll[hcCollAllGather].calls[hcPathHierarchical] != now.coll[hcCollAllGather].calls[hcPathHierarchical])
      return 4;
    if (old.quantized_calls[hcCollAllGather] != 1 || now.quantized_calls[hcCollAllGather] != 1) return 5;
    if (now.coll[hcCollAllToAll].calls[hcPathRing] != 1) return 6;
    return 0;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace hctest
