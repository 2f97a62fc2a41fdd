// Every path a collective can take, declared once: what it runs, on which buffers, for which
// collectives, and its cost-model entry. The planner's rules decide among them (planCall);
// explainCall says, for one call, which of them may run it, what each would cost, and which
// the plan takes (hicoll_info --algorithms).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/coll.h"
#include "plan/plan.h"

namespace hicoll {

enum class PathId { Hierarchical, LatencyAllReduce, Ring, Pairwise, Quantized, Nccl };

// What a path's rules look at: the call, the buffers and the plan's numbers so far (block,
// split, chunking). With preference false only what makes the path impossible refuses it;
// with preference true also that another path is preferred for this call (the AllReduce split
// at HICOLL_ALLREDUCE_SMALL_BYTES), which the model may overrule.
struct PlanInput {
  const Identity& id;
  const PlanContext& ctx;
  const CollArgs& a;
  const Capabilities& caps;
  const CollPlan& p;
  bool preference = true;
};

struct PathInfo {
  PathId id;
  const char* name;
  hcPath_t counted_as;  // how hcStats counts a call on it
  uint32_t colls;       // bit per hcColl_t it runs
  bool host, device;    // the buffers it runs on
  bool modelled;        // the cost model predicts it (Algo below)
  Algo algo;
  const char* what;  // for people
  // Whether its rules let it run in.a: an ok() Verdict, or the Rule that refuses it and why
  // (Verdict::elsewhere, without a reason, where another path is only preferred). null for
  // a variant the planner does not choose among the others (quantized: planQuantized).
  Verdict (*allows)(const PlanInput& in);
};
// In the planner's order of preference: the first path whose rules allow a call is its plan.
const std::vector<PathInfo>& pathTable();
bool runsOn(const PathInfo& path, hcColl_t coll, const Capabilities& caps);

struct PathVerdict {
  const PathInfo* path;
  std::string why_not;  // "" when the rules let it run this call
  bool predicted = false;
  Prediction prediction;
  bool chosen = false;  // the path the plan takes
};
// For a (a validated call, on buffers with caps): every path of the table that runs a's
// collective on those buffers, with the rules' verdict and the model's time; plan: what
// planCall takes.
std::vector<PathVerdict> explainCall(const Identity& id, const PlanContext& ctx, const CollArgs& a,
                                     const Capabilities& caps, CollPlan* plan);

}  // namespace hicoll
