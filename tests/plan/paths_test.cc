// The table of paths and explainCall: every call's verdicts name the one path the plan takes,
// and that path may run it; a path the rules refuse says why.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "plan/paths.h"
#include "plan_fixture.h"

namespace {

using hicoll::Capabilities;
using hicoll::CollArgs;
using hicoll::CollPlan;
using hicoll::PathId;
using hicoll::PathVerdict;

using plantest::call;
using plantest::Comm;

const PathVerdict& chosenOf(const std::vector<PathVerdict>& v) {
  const PathVerdict* c = nullptr;
  for (const PathVerdict& x : v) {
    EXPECT_FALSE(x.chosen && c) << "two paths chosen: " << c->path->name << " and " << x.path->name;
    if (x.chosen) c = &x;
  }
  EXPECT_NE(c, nullptr) << "no path chosen";
  return *c;
}

TEST(PathTable, EveryCollectiveHasAHostAndADevicePath) {
  for (int c = 0; c < hcNumColls; ++c) {
    bool host = false, device = false;
    for (const hicoll::PathInfo& p : hicoll::pathTable()) {
      host |= p.host && (p.colls & (1u << c));
      device |= p.device && (p.colls & (1u << c));
    }
    EXPECT_TRUE(host && device) << hicoll::collName(static_cast<hcColl_t>(c));
  }
}

TEST(ExplainCall, TheChosenPathIsThePlansAndMayRun) {
  struct Case {
    int nodes, local;
    CollArgs a;
    Capabilities caps;
    PathId expect;
  };
  Capabilities dev;
  dev.device = true;
  const std::vector<Case> cases = {
      {2, 2, call(hcCollAllGather, 1 << 20), {}, PathId::Hierarchical},
      {2, 2, call(hcCollAllReduce, 64), {}, PathId::LatencyAllReduce},
      {2, 2, call(hcCollAllReduce, 1 << 22), {}, PathId::Hierarchical},
      {2, 2, call(hcCollAllToAll, 4096), {}, PathId::Pairwise},
      {2, 2, call(hcCollBroadcast, 4096), {}, PathId::Hierarchical},
      {2, 2, call(hcCollAllGather, 1 << 20), dev, PathId::Hierarchical},
      {2, 2, call(hcCollAllGather, 1 << 20, 256), {}, PathId::Quantized},
  };
  for (const Case& k : cases) {
    Comm c(k.nodes, k.local);
    CollPlan plan;
    const auto v = hicoll::explainCall(c.id, c.ctx, k.a, k.caps, &plan);
    const PathVerdict& chosen = chosenOf(v);
    const std::string what = std::string(hicoll::collName(k.a.coll)) + " count " + std::to_string(k.a.count);
    EXPECT_EQ(chosen.path->id, k.expect) << what << ": took " << chosen.path->name;
    EXPECT_EQ(chosen.why_not, "") << what;
    for (const PathVerdict& x : v) {
      EXPECT_TRUE(x.path->colls & (1u << k.a.coll)) << x.path->name << " listed for " << what;
      EXPECT_EQ(x.predicted, x.path->modelled && !k.caps.device && (x.path->id != PathId::Quantized || k.a.quant.block))
          << x.path->name << ", " << what;
    }
  }
}

TEST(ExplainCall, ARefusedPathSaysWhyAndTheFallbackIsTaken) {
  // 16 MiB scratch by default: under the seed's rule a 32 MiB block does not fit.
  Comm c(2, 2, {{"HICOLL_SCRATCH_STRICT", "1"}});
  CollPlan plan;
  const auto v = hicoll::explainCall(c.id, c.ctx, call(hcCollAllGather, 8u << 20), {}, &plan);
  EXPECT_EQ(chosenOf(v).path->id, PathId::Ring);
  EXPECT_EQ(plan.rule, hicoll::Rule::ScratchTooSmall);
  for (const PathVerdict& x : v)
    if (x.path->id == PathId::Hierarchical)
      EXPECT_NE(x.why_not.find("SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES"), std::string::npos) << x.why_not;

  Comm uneven(1, 1);
  uneven.id.nranks = 3;
  uneven.id.topo = hicoll::Topology::build({"a", "a", "b"}, {"a", "a", "b"});
  const auto u = hicoll::explainCall(uneven.id, uneven.ctx, call(hcCollAllGather, 1024), {}, &plan);
  EXPECT_EQ(chosenOf(u).path->id, PathId::Ring);
  for (const PathVerdict& x : u) {
    if (x.path->id == PathId::Hierarchical) EXPECT_NE(x.why_not.find("uneven"), std::string::npos) << x.why_not;
    EXPECT_FALSE(x.predicted) << "the model predicts uniform nodes only";
  }
}

TEST(ExplainCall, KnobsThatDecideShowInTheVerdicts) {
  {
    Comm c(2, 2, {{"HICOLL_ALGO", "ring"}});
    const auto v = hicoll::explainCall(c.id, c.ctx, call(hcCollAllGather, 4096), {}, nullptr);
    EXPECT_EQ(chosenOf(v).path->id, PathId::Ring);
    for (const PathVerdict& x : v)
      if (x.path->id == PathId::Hierarchical) EXPECT_EQ(x.why_not, "HICOLL_ALGO=ring") << "the user's word refuses it";
  }
  {
    Comm c(2, 2, {{"HICOLL_QUANT_MIN_NODES", "3"}});
    const auto v = hicoll::explainCall(c.id, c.ctx, call(hcCollAllGather, 4096, 64), {}, nullptr);
    EXPECT_EQ(chosenOf(v).path->id, PathId::Hierarchical) << "runs exact";
    for (const PathVerdict& x : v)
      if (x.path->id == PathId::Quantized) EXPECT_NE(x.why_not.find("exact on 2 node(s)"), std::string::npos);
  }
  {
    Comm c(2, 2, {{"HICOLL_FORCE_FALLBACK", "allgather"}});
    const auto v = hicoll::explainCall(c.id, c.ctx, call(hcCollAllGather, 4096), {}, nullptr);
    EXPECT_EQ(chosenOf(v).path->id, PathId::Ring);
  }
}

// Blocks larger than the scratch or sort buffer stream through them in pieces: every piece
// fits, they cover the block, and none is much shorter than the others.
TEST(Pieces, SplitCoversTheBlockWithinTheCap) {
  EXPECT_EQ(hicoll::splitBlock(10, 4, 40).count, 1u);
  EXPECT_EQ(hicoll::splitBlock(0, 4, 40).count, 1u);
  EXPECT_EQ(hicoll::splitBlock(10, 8, 7).count, 0u) << "not one element fits";
  for (size_t esize : {1, 2, 4, 8})
    for (size_t count : {1, 2, 3, 7, 1000, 1023, 1024, 1025, 4097, 100003})
      for (size_t cap : {8, 9, 100, 1024, 4096, 5461, 8192}) {
        const hicoll::Pieces p = hicoll::splitBlock(count, esize, cap);
        const std::string what = std::to_string(count) + " x " + std::to_string(esize) + " in " + std::to_string(cap);
        ASSERT_GE(p.count, 1u) << what;
        size_t sum = 0;
        for (size_t i = 0; i < p.count; ++i) {
          const size_t len = p.lenOf(i, count);
          EXPECT_GT(len, 0u) << what << " piece " << i;
          EXPECT_LE(len * esize, cap) << what << " piece " << i;
          EXPECT_LE(len, p.elems) << what;
          sum += len;
        }
        EXPECT_EQ(sum, count) << what;
        EXPECT_EQ(p.count, (count * esize + cap / esize * esize - 1) / (cap / esize * esize)) << what << ": fewest";
      }
}

TEST(Pieces, TheScratchKnobSetsThePieceNotThePath) {
  Comm c(2, 2);
  CollPlan plan;
  auto v = hicoll::explainCall(c.id, c.ctx, call(hcCollAllGather, 8u << 20), {}, &plan);  // 32 MiB per rank
  EXPECT_EQ(chosenOf(v).path->id, PathId::Hierarchical);
  EXPECT_EQ(chosenOf(v).why_not, "");
  EXPECT_EQ(plan.rule, hicoll::Rule::Hierarchical);
  EXPECT_EQ(plan.pieces, 2u);
  EXPECT_EQ(plan.piece_bytes, 16u << 20);
  v = hicoll::explainCall(c.id, c.ctx, call(hcCollAllGather, 1u << 20), {}, &plan);
  EXPECT_EQ(plan.pieces, 1u) << "a block that fits is one piece";
  EXPECT_EQ(plan.piece_bytes, 4u << 20);

  // Scratch and sort at their minimum: the AllGather's piece is the smaller of scratch and a
  // node's sort slot; the ReduceScatter's only the sort slot (it stages chunk slots).
  Comm tiny(3, 1,
            {{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "8192"},
             {"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", "16384"},
             {"HICOLL_ALGO", "hier"}});
  CollPlan p = hicoll::planCall(tiny.id, tiny.ctx, call(hcCollAllGather, 100003), {});
  EXPECT_EQ(p.path, hcPathHierarchical);
  EXPECT_LE(p.piece_bytes, 16384u / 3);
  EXPECT_EQ(p.pieces, (100003u + 16384 / 3 / 4 - 1) / (16384 / 3 / 4));
  p = hicoll::planCall(tiny.id, tiny.ctx, call(hcCollReduceScatter, 100003), {});
  EXPECT_EQ(p.path, hcPathHierarchical);
  EXPECT_LE(p.piece_bytes, 16384u / 3);
  p = hicoll::planCall(tiny.id, tiny.ctx, call(hcCollAllReduce, 3 * 100003), {});
  EXPECT_EQ(p.path, hcPathHierarchical);
  EXPECT_GT(p.pieces, 1u);
  Comm rs(2, 2, {{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "8192"}, {"HICOLL_ALGO", "hier"}});
  EXPECT_EQ(hicoll::planCall(rs.id, rs.ctx, call(hcCollReduceScatter, 1u << 20), {}).pieces, 1u)
      << "the ReduceScatter's scratch holds chunk slots of any size";
  EXPECT_EQ(hicoll::planCall(rs.id, rs.ctx, call(hcCollAllGather, 1u << 20), {}).pieces, 512u);

  // HICOLL_SCRATCH_STRICT=1: the seed's rule, the fallback named as before.
  Comm strict(2, 2, {{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "8192"}, {"HICOLL_SCRATCH_STRICT", "1"}});
  p = hicoll::planCall(strict.id, strict.ctx, call(hcCollAllGather, 2049), {});
  EXPECT_TRUE(p.fallback());
  EXPECT_EQ(p.rule, hicoll::Rule::ScratchTooSmall);
  EXPECT_NE(p.reason.find("SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES=8192"), std::string::npos) << p.reason;
  EXPECT_FALSE(hicoll::planCall(strict.id, strict.ctx, call(hcCollAllGather, 2048), {}).fallback());

  // Device buffers: the engine runs whole blocks, so the seed's rule stays.
  Capabilities dev;
  dev.device = true;
  EXPECT_TRUE(hicoll::planCall(rs.id, rs.ctx, call(hcCollAllGather, 2049), dev).fallback());
}

// What cannot run at all still falls back: a node's sort slot smaller than one element.
TEST(Pieces, NotOneElementPerSlotFallsBack) {
  Comm c(1025, 1, {{"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", "8192"}, {"HICOLL_ALGO", "hier"}});
  CollArgs a = call(hcCollAllGather, 100);
  a.dtype = hcFloat64;  // 8192 / 1025 < 8 bytes
  const CollPlan p = hicoll::planCall(c.id, c.ctx, a, {});
  EXPECT_TRUE(p.fallback());
  EXPECT_EQ(p.rule, hicoll::Rule::SortTooSmall);
  EXPECT_NE(p.reason.find("less than one 8-byte element"), std::string::npos) << p.reason;
  a.dtype = hcInt8;
  EXPECT_FALSE(hicoll::planCall(c.id, c.ctx, a, {}).fallback());
}

}  // namespace
