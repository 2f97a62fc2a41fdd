// Blocks larger than the scratch and sort buffers (SMDDP_AG_*_BUFFER_SIZE_BYTES at their
// minimum) stream through them in pieces on the hierarchical path: exact on every layout, in
// place and out of place, with and without single-copy reads (HICOLL_SHM_CMA), sizes that are
// no multiple of a piece, and counted as hierarchical calls, never as fallbacks.
// HICOLL_SCRATCH_STRICT=1 keeps the seed's rule: the fallback, named.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../common/mp.h"
#include "checks.h"

namespace hctest {
namespace {

struct Layout {
  int nodes, per_node;
  bool interleave, cma;
};

std::string name(const testing::TestParamInfo<Layout>& i) {
  return std::to_string(i.param.nodes) + "x" + std::to_string(i.param.per_node) +
         (i.param.interleave ? "_interleaved" : "") + (i.param.cma ? "_cma" : "_nocma");
}

Job tinyBuffers(const Layout& l) {
  Job job;
  job.nranks = l.nodes * l.per_node;
  job.node = l.interleave ? interleaved(l.nodes, l.per_node) : contiguous(l.nodes, l.per_node);
  job.env["SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES"] = "8192";
  job.env["SMDDP_AG_SORT_BUFFER_SIZE_BYTES"] = "16384";
  job.env["HICOLL_SHM_CMA"] = l.cma ? "1" : "0";
  job.env["HICOLL_ALGO"] = "hier";  // the rules' path, not the cost model's choice
  job.env["HICOLL_TIMEOUT_MS"] = "60000";
  // On one node blocks up to the eager size are staged in scratch: 64 KiB makes them pieces.
  if (l.nodes == 1) job.env["HICOLL_SHM_EAGER_BYTES"] = "65536";
  job.timeout_s = 120;
  return job;
}

// hier of coll's calls hierarchical, the others fallbacks for a reason that is not the buffers.
int expectPaths(const hcStats& s, hcColl_t coll, uint64_t hier, uint64_t calls, const char* what) {
  const hcCollStats& c = s.coll[coll];
  const std::string reason = c.last_fallback_reason;
  if (c.calls[hcPathHierarchical] == hier && c.calls[hcPathFallback] == calls - hier &&
      reason.find("SMDDP_AG_") == std::string::npos)
    return 0;
  std::fprintf(stderr, "%s: %lu hierarchical (want %lu of %lu), %lu fallback (%s)\n", what,
               (unsigned long)c.calls[hcPathHierarchical], (unsigned long)hier, (unsigned long)calls,
               (unsigned long)c.calls[hcPathFallback], reason.c_str());
  return 1;
}

class ScratchPieces : public testing::TestWithParam<Layout> {};

TEST_P(ScratchPieces, LargerBlocksStreamThroughExactly) {
  const Layout l = GetParam();
  const Job job = tinyBuffers(l);
  auto st = run(job, [&](int, hcComm_t comm) {
    int f = 0, ag = 0, rs = 0, ar = 0;
    // 8 KiB pieces across 2 nodes (5461 bytes on 3): 2049 floats split 1025 + 1024, the rest
    // in pieces of which the last is shorter.
    for (size_t count : {size_t{2049}, size_t{5000}, size_t{30011}})
      for (bool in_place : {false, true}) {
        f += checkAllGather(comm, hcFloat32, count, in_place, 1 + in_place), ++ag;
        f += checkReduceScatter(comm, hcFloat32, hcSum, count, in_place, 3 + in_place), ++rs;
      }
    f += checkAllGather(comm, hcFloat64, 3001, false, 5), ++ag;
    f += checkAllGather(comm, hcInt8, 20001, true, 6), ++ag;
    f += checkReduceScatter(comm, hcInt32, hcMax, 7001, false, 7), ++rs;
    f += checkReduceScatter(comm, hcFloat64, hcSum, 3001, true, 8), ++rs;
    // AllReduce: ReduceScatter + AllGather on 30011-float blocks, and the latency split's one
    // AllGather of a 20 KB buffer.
    f += checkAllReduce(comm, hcFloat32, hcSum, 30011 * 4 + 3, false, 9), ++ar;
    f += checkAllReduce(comm, hcFloat32, hcSum, 5000, true, 10), ++ar;
    hcStats s = HC_STATS_INITIALIZER;
    hcCommGetStats(comm, &s);
    f += expectPaths(s, hcCollAllGather, ag, ag, "AllGather");
    // Across nodes the ReduceScatter reads its peers' inputs in place: without CMA it falls
    // back for that (so does the AllReduce's split), not for its buffers.
    const bool reads = l.cma || l.nodes == 1;
    f += expectPaths(s, hcCollReduceScatter, reads ? rs : 0, rs, "ReduceScatter");
    f += expectPaths(s, hcCollAllReduce, reads ? ar : 1, ar, "AllReduce");
    return f;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ScratchPieces,
                         testing::Values(Layout{2, 2, false, true}, Layout{2, 2, true, true}, Layout{2, 2, true, false},
                                         Layout{2, 1, false, true}, Layout{2, 1, false, false},
                                         Layout{1, 2, false, true}, Layout{1, 2, false, false},
                                         Layout{3, 1, false, true}, Layout{3, 1, false, false}),
                         name);

// HICOLL_SCRATCH_STRICT=1: a block larger than the scratch buffer (AllGather) or nodes x block
// larger than the sort buffer (ReduceScatter) takes the announced fallback, exactly.
TEST(ScratchStrict, TheSeedsRuleStillFallsBack) {
  Job job = tinyBuffers(Layout{2, 2, true, true});
  job.env["HICOLL_SCRATCH_STRICT"] = "1";
  auto st = run(job, [&](int, hcComm_t comm) {
    int f = checkAllGather(comm, hcFloat32, 2049, false, 1) + checkAllGather(comm, hcFloat32, 2048, false, 2) +
            checkReduceScatter(comm, hcFloat32, hcSum, 2049, true, 3);
    hcStats s = HC_STATS_INITIALIZER;
    hcCommGetStats(comm, &s);
    const hcCollStats &g = s.coll[hcCollAllGather], &r = s.coll[hcCollReduceScatter];
    if (g.calls[hcPathFallback] != 1 || g.calls[hcPathHierarchical] != 1 ||
        std::string(g.last_fallback_reason).find("SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES=8192") == std::string::npos) {
      std::fprintf(stderr, "AllGather: %lu fallback (%s)\n", (unsigned long)g.calls[hcPathFallback],
                   g.last_fallback_reason);
      ++f;
    }
    if (r.calls[hcPathFallback] != 1 ||
        std::string(r.last_fallback_reason).find("SMDDP_AG_SORT_BUFFER_SIZE_BYTES=16384") == std::string::npos) {
      std::fprintf(stderr, "ReduceScatter: %lu fallback (%s)\n", (unsigned long)r.calls[hcPathFallback],
                   r.last_fallback_reason);
      ++f;
    }
    return f;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace hctest
