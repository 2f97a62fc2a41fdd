// The table of paths and explainCall: every call's verdicts name the one path the plan takes,
// and that path may run it; a path the rules refuse says why.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "plan/paths.h"

namespace {

using hicoll::Capabilities;
using hicoll::CollArgs;
using hicoll::CollPlan;
using hicoll::PathId;
using hicoll::PathVerdict;

struct Comm {
  hicoll::Identity id;
  hicoll::PlanContext ctx;
  Comm(int nodes, int local, std::map<std::string, std::string> env = {}) {
    ctx.cfg = hicoll::Config::from([&](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
    std::vector<std::string> labels;
    for (int n = 0; n < nodes; ++n)
      for (int l = 0; l < local; ++l) labels.push_back("n" + std::to_string(n));
    id.nranks = nodes * local;
    id.topo = hicoll::Topology::build(labels, labels);
  }
};

CollArgs call(hcColl_t coll, size_t count, size_t quant_block = 0) {
  CollArgs a;
  a.coll = coll;
  a.count = count;
  a.dtype = hcFloat32;
  a.quant.block = quant_block;
  a.quant.count = count;
  return a;
}

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
  Comm c(2, 2);  // 16 MiB scratch by default: a 32 MiB block does not fit
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

}  // namespace
