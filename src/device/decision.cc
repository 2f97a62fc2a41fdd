#include "device/decision.h"

#include <fmt/format.h>

#include "base/quant_format.h"
#include "device/dev_stream.h"
#include "device/hier_engine.h"

namespace hicoll::dev {

Capabilities deviceCapabilities() {
  Capabilities caps;
  caps.device = true;
  caps.max_reduce_inputs = kMaxReduceInputs;
  return caps;
}

DeviceChoice decide(const CollPlan& plan, const EngineStatus& status, const std::string& engine_unsupported) {
  DeviceChoice d;
  d.plan = plan;
  if (plan.fallback()) {
    d.fallback = true;
    d.reason = plan.reason;
  } else if (!status.hier_ok) {
    d.fallback = true;
    d.reason = status.why_not.empty() ? "no hierarchical device path" : status.why_not;
  } else if (!engine_unsupported.empty()) {
    d.fallback = true;
    d.reason = engine_unsupported;
  }
  return d;
}

std::string exactInstead(const Identity& id, const PlanContext& ctx, const CollArgs& a) {
  if (a.coll != hcCollAllGather && a.coll != hcCollReduceScatter)
    return fmt::format("the quantized {} has no device kernels", collName(a.coll));
  const int64_t min_nodes = ctx.cfg.num(Knob::QuantMinNodes);
  if (id.topo.nnodes >= quantizeFromNodes(ctx, /*model_may_decide=*/false)) return "";
  return fmt::format("exact on {} node(s) (HICOLL_QUANT_MIN_NODES={}{})", id.topo.nnodes, min_nodes,
                     min_nodes == 0 ? "; device calls quantize from 2 nodes" : "");
}

CollArgs planArgs(const CollArgs& a) {
  if (!quantizes(a) || a.coll != hcCollAllGather) return a;
  CollArgs wire = a;
  wire.dtype = hcUint8;
  wire.count = quant::packedBytes(a.count, a.quant.block);
  wire.quant.packed = true;
  return wire;
}

DeviceChoice decide(const Identity& id, const PlanContext& ctx, const CollArgs& a, const EngineStatus& status,
                    const HierEngine* engine) {
  const CollPlan plan = planCall(id, ctx, a, deviceCapabilities());
  const std::string unsupported = !plan.fallback() && status.hier_ok && engine ? engine->unsupported(a) : "";
  return decide(plan, status, unsupported);
}

}  // namespace hicoll::dev
