#include "device/decision.h"

#include "core/comm.h"
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

DeviceChoice decide(const hcComm& comm, const CollArgs& a, const EngineStatus& status, const HierEngine* engine) {
  const CollPlan plan = planCall(comm, a, deviceCapabilities());
  const std::string unsupported = !plan.fallback() && status.hier_ok && engine ? engine->unsupported(a) : "";
  return decide(plan, status, unsupported);
}

}  // namespace hicoll::dev
