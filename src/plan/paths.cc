#include "plan/paths.h"

#include <fmt/format.h>

namespace hicoll {
namespace {

constexpr uint32_t bit(hcColl_t c) {
  return 1u << c;
}
constexpr uint32_t kAgRsAr = bit(hcCollAllGather) | bit(hcCollReduceScatter) | bit(hcCollAllReduce);
constexpr uint32_t kAll = kAgRsAr | bit(hcCollBroadcast) | bit(hcCollBarrier) | bit(hcCollAllToAll);

}  // namespace

const std::vector<PathInfo>& pathTable() {
  static const std::vector<PathInfo> table = {
      {PathId::Hierarchical, "hierarchical", hcPathHierarchical, kAgRsAr | bit(hcCollBroadcast) | bit(hcCollBarrier),
       true, true, true, Algo::Hier,
       "rail-aligned inter-node exchange into the sort buffer, intra-node reads of the node's blocks "
       "(AllReduce: ReduceScatter + AllGather on blocks of count / ranks)"},
      {PathId::LatencyAllReduce, "latency-allreduce", hcPathHierarchical, bit(hcCollAllReduce), true, true, true,
       Algo::Hier,
       "AllReduce as one hierarchical AllGather of every rank's buffer and a local reduction "
       "(<= HICOLL_ALLREDUCE_SMALL_BYTES, or where the model predicts it faster)"},
      {PathId::Ring, "ring", hcPathRing, kAgRsAr | bit(hcCollBroadcast) | bit(hcCollBarrier), true, false, true,
       Algo::Ring,
       "flat ring over every rank (Broadcast: a chain); the host fallback, HICOLL_ALGO=ring, or the model's choice"},
      {PathId::Pairwise, "pairwise", hcPathRing, bit(hcCollAllToAll), true, false, true, Algo::Ring,
       "every block straight to its rank (AllToAll's one path; small local blocks staged in scratch)"},
      {PathId::Quantized, "quantized", hcPathHierarchical, bit(hcCollAllGather) | bit(hcCollReduceScatter), true, true,
       true, Algo::Hier,
       "int8 codes with one fp32 scale per block across nodes (hcAllGatherQuantized, hcReduceScatterQuantized)"},
      {PathId::Nccl, "nccl", hcPathFallback, kAll, false, true, false, Algo::Hier,
       "the device buffers' fallback: the call runs on NCCL"},
  };
  return table;
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
  const Verdict hier = hierarchicalRules(id, ctx, exact, caps, p);
  const Shape s = modelShape(id, ctx, p.chunk_bytes, p.net_window);
  const size_t bytes = callBytes(id, a), b = a.count * hcTypeSize(a.dtype);
  const bool forced = ctx.cfg.forceFallbackMask() & (1u << a.coll);
  std::vector<PathVerdict> out;
  for (const PathInfo& info : pathTable()) {
    if (!(info.colls & (1u << a.coll)) || !(caps.device ? info.device : info.host)) continue;
    PathVerdict v{&info};
    switch (info.id) {
      case PathId::Hierarchical:
        if (forced) v.why_not = "HICOLL_FORCE_FALLBACK names the collective";
        else if (hier.rule != Rule::Hierarchical) v.why_not = hier.reason;
        v.chosen = !quantizes && p.path == hcPathHierarchical && !p.allreduce_small;
        break;
      case PathId::LatencyAllReduce:
        if (forced) v.why_not = "HICOLL_FORCE_FALLBACK names the collective";
        else if (!id.topo.uniform) v.why_not = hier.reason;
        else if (b > ctx.scratchBytes() || static_cast<size_t>(id.topo.nnodes) * b > ctx.sortBytes())
          v.why_not = fmt::format("the whole buffer ({} bytes) is staged: scratch ({}) or sort buffer ({}) too small",
                                  b, ctx.scratchBytes(), ctx.sortBytes());
        else if (id.nranks > caps.max_reduce_inputs)
          v.why_not = fmt::format("{} ranks exceed the {} inputs of one reduction", id.nranks, caps.max_reduce_inputs);
        v.chosen = p.path == hcPathHierarchical && p.allreduce_small;
        break;
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
      v.prediction =
          info.id == PathId::Quantized
              ? predictQuantized(ctx.model, s, a.coll, info.algo, bytes, false, hcTypeSize(a.dtype), a.quant.block)
              : predict(ctx.model, s, a.coll, info.algo, bytes, false, info.id == PathId::LatencyAllReduce);
    }
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace hicoll
