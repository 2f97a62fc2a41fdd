// Tier 3: N processes over 1-4 simulated nodes (contiguous and interleaved), every collective,
// dtype and op, in place and out of place, against independent references.
#include <gtest/gtest.h>

#include <cstdio>

#include "../common/mp.h"
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

}  // namespace
}  // namespace hctest
