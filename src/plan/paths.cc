#include "plan/paths.h"

#include <fmt/format.h>

namespace hicoll {
namespace {

constexpr uint32_t bit(hcColl_t c) {
  return 1u << c;
}
constexpr uint32_t kAgRsAr = bit(hcCollAllGather) | bit(hcCollReduceScatter) | bit(hcCollAllReduce);
constexpr uint32_t kAll = kAgRsAr | bit(hcCollBroadcast) | bit(hcCollBarrier) | bit(hcCollAllToAll);

Verdict no(Rule r, std::string why) {
  return Verdict{r, std::move(why)};
}

// Only a preference refuses it: no reason to build (device calls plan every call).
Verdict preferredElsewhere() {
  Verdict v;
  v.elsewhere = true;
  return v;
}

// The user's word, before any path's own rules: HICOLL_FORCE_FALLBACK, HICOLL_ALGO=ring.
Verdict requested(const PlanInput& in) {
  if (in.ctx.cfg.forceFallbackMask() & (1u << in.a.coll))
    return no(Rule::Forced, fmt::format("HICOLL_FORCE_FALLBACK={}", in.ctx.cfg.str(Knob::ForceFallback)));
  if (!in.caps.device && in.ctx.cfg.algoRing() && in.a.coll != hcCollBarrier)
    return no(Rule::RingRequested, "HICOLL_ALGO=ring");
  return {};
}

// The hierarchical phases on blocks: for an AllReduce, ReduceScatter + AllGather on blocks of
// allReduceBlock elements.
Verdict hierarchical(const PlanInput& in) {
  if (Verdict v = requested(in); !v.ok()) return v;
  if (in.a.coll != hcCollAllReduce) return hierarchicalRules(in.id, in.ctx, in.a, in.caps, in.p);
  if (in.preference && in.p.allreduce_small)
    return preferredElsewhere();  // the latency path, at this size (HICOLL_ALLREDUCE_SMALL_BYTES)
  CollPlan q = in.p;
  q.allreduce_small = false;
  q.allreduce_block = allReduceBlock(in.a.count, in.id.nranks, in.caps);
  q.block_bytes = q.allreduce_block * typeSize(in.a.dtype);
  return hierarchicalRules(in.id, in.ctx, in.a, in.caps, q);
}

// The whole buffer as the block of one hierarchical AllGather, then a local reduction.
Verdict latencyAllReduce(const PlanInput& in) {
  if (Verdict v = requested(in); !v.ok()) return v;
  if (in.id.nranks > in.caps.max_reduce_inputs)
    return no(Rule::Hierarchical,
              fmt::format("{} ranks exceed the {} inputs of one reduction", in.id.nranks, in.caps.max_reduce_inputs));
  if (in.preference && !in.p.allreduce_small) return preferredElsewhere();  // ReduceScatter + AllGather, at this size
  CollPlan q = in.p;
  q.allreduce_small = true;
  q.block_bytes = in.a.count * typeSize(in.a.dtype);
  return hierarchicalRules(in.id, in.ctx, in.a, in.caps, q);
}

// The flat paths run anything on host buffers; NCCL anything on device buffers.
Verdict always(const PlanInput&) {
  return {};
}

}  // namespace

const std::vector<PathInfo>& pathTable() {
  static const std::vector<PathInfo> table = {
      {PathId::Hierarchical, "hierarchical", hcPathHierarchical, kAgRsAr | bit(hcCollBroadcast) | bit(hcCollBarrier),
       true, true, true, Algo::Hier,
       "rail-aligned inter-node exchange into the sort buffer, intra-node reads of the node's blocks "
       "(AllReduce: ReduceScatter + AllGather on blocks of count / ranks)",
       hierarchical},
      {PathId::LatencyAllReduce, "latency-allreduce", hcPathHierarchical, bit(hcCollAllReduce), true, true, true,
       Algo::Hier,
       "AllReduce as one hierarchical AllGather of every rank's buffer and a local reduction "
       "(<= HICOLL_ALLREDUCE_SMALL_BYTES, or where the model predicts it faster)",
       latencyAllReduce},
      {PathId::Ring, "ring", hcPathRing, kAgRsAr | bit(hcCollBroadcast) | bit(hcCollBarrier), true, false, true,
       Algo::Ring,
       "flat ring over every rank (Broadcast: a chain); the host fallback, HICOLL_ALGO=ring, or the model's choice",
       always},
      {PathId::Pairwise, "pairwise", hcPathRing, bit(hcCollAllToAll), true, false, true, Algo::Ring,
       "every block straight to its rank (AllToAll's one path; small local blocks staged in scratch)", always},
      {PathId::Quantized, "quantized", hcPathHierarchical, bit(hcCollAllGather) | bit(hcCollReduceScatter), true, true,
       true, Algo::Hier,
       "int8 codes with one fp32 scale per block across nodes (hcAllGatherQuantized, hcReduceScatterQuantized)",
       nullptr},
      {PathId::Nccl, "nccl", hcPathFallback, kAll, false, true, false, Algo::Hier,
       "the device buffers' fallback: the call runs on NCCL", always},
  };
  return table;
}

bool runsOn(const PathInfo& path, hcColl_t coll, const Capabilities& caps) {
  return (path.colls & (1u << coll)) && (caps.device ? path.device : path.host);
}

std::vector<PathVerdict> explainCall(const Identity& id, const PlanContext& ctx, const CollArgs& a,
                                     const Capabilities& caps, CollPlan* plan) {
  // The exact call (a quantized one runs it where it does not quantize), and whether a
  // quantized one quantizes (the device path quantizes from 2 nodes: dev::exactInstead).
  CollArgs exact = a;
  exact.quant = QuantArgs{};
  const CollPlan p = planCall(id, ctx, exact, caps);
  if (plan) *plan = p;
  QuantPlan q;
  if (a.quant.block && !caps.device) q = planQuantized(id, ctx, a, caps);
  if (a.quant.block && caps.device) q.quantize = id.topo.nnodes >= quantizeFromNodes(ctx, false);
  const bool quantizes = a.quant.block && q.quantize;
  const Shape s = modelShape(id, ctx, p.chunk_bytes, p.net_window);
  const size_t bytes = callBytes(id, a);
  // Each path's own rules, without the preference between the two AllReduce splits.
  const PlanInput in{id, ctx, exact, caps, p, /*preference=*/false};
  std::vector<PathVerdict> out;
  for (const PathInfo& info : pathTable()) {
    if (!runsOn(info, a.coll, caps)) continue;
    PathVerdict v{&info};
    if (info.allows) v.why_not = info.allows(in).reason;
    switch (info.id) {
      case PathId::Hierarchical: v.chosen = !quantizes && p.path == hcPathHierarchical && !p.allreduce_small; break;
      case PathId::LatencyAllReduce: v.chosen = p.path == hcPathHierarchical && p.allreduce_small; break;
      case PathId::Ring: v.chosen = !quantizes && p.path != hcPathHierarchical; break;
      case PathId::Pairwise: v.chosen = true; break;
      case PathId::Quantized:
        if (!a.quant.block) v.why_not = "only for hcAllGatherQuantized / hcReduceScatterQuantized";
        else if (!q.quantize) v.why_not = q.why;  // (its images are gathered by exact calls, planned alike)
        v.chosen = quantizes;
        break;
      case PathId::Nccl: v.chosen = p.fallback(); break;
    }
    // The model predicts host paths on uniform nodes.
    if (info.modelled && id.topo.uniform && !caps.device && (info.id != PathId::Quantized || a.quant.block)) {
      v.predicted = true;
      v.prediction = info.id == PathId::Quantized ? predictQuantized(ctx.figures(bytes), s, a.coll, info.algo, bytes,
                                                                     false, typeSize(a.dtype), a.quant.block)
                                                  : predict(ctx.figures(bytes), s, a.coll, info.algo, bytes, false,
                                                            info.id == PathId::LatencyAllReduce);
    }
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace hicoll
