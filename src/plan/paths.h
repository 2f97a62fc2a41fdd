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

struct PathInfo {
  PathId id;
  const char* name;
  hcPath_t counted_as;  // how hcStats counts a call on it
  uint32_t colls;       // bit per hcColl_t it runs
  bool host, device;    // the buffers it runs on
  bool modelled;        // the cost model predicts it (Algo below)
  Algo algo;
  const char* what;  // for people
};
const std::vector<PathInfo>& pathTable();

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
