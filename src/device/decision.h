// The decision table of the device path: hierarchical (CUDA IPC + staged inter-node) or the
// NCCL fallback, with the reason. Every input agrees across ranks, so all ranks choose alike.
#pragma once

#include <string>

#include "base/coll.h"
#include "plan/plan.h"

namespace hicoll::dev {

class HierEngine;

struct DeviceChoice {
  bool fallback = false;
  CollPlan plan;       // the call's plan for device buffers
  std::string reason;  // why the fallback ("" on the hierarchical path)
};

// What the engine could set up at creation (agreed by all ranks): CUDA IPC among the node's
// ranks, stream memory operations, one process per rank of a node.
struct EngineStatus {
  bool hier_ok = false;
  std::string why_not;
};

// What device buffers let the planner assume: the rules about host memory (HICOLL_ALGO=ring,
// the shm transport's single-copy reads) do not apply; the device reduction combines at most
// kMaxReduceInputs inputs.
Capabilities deviceCapabilities();

// The table, in order: the plan's fallback rules (HICOLL_FORCE_FALLBACK, uneven nodes, SMDDP
// scratch/sort sizes), then what the engine could set up, then what it cannot run
// (engine_unsupported: HierEngine::unsupported, "" when it can). Only the plan's path and the
// engine's answers decide; reasons are carried, never read.
DeviceChoice decide(const CollPlan& plan, const EngineStatus& status, const std::string& engine_unsupported);

// A quantized call (a.quant.block) on device buffers: "" when it quantizes, else why it runs
// the exact collective. It quantizes from HICOLL_QUANT_MIN_NODES nodes on (from 2 when the
// knob is 0: the cost model has no device figures to decide with).
std::string exactInstead(const Identity& id, const PlanContext& ctx, const CollArgs& a);
// What the plan's rules judge for a quantized call: the images' bytes for an AllGather that
// quantizes (the scratch/sort rules apply to what moves), the call itself otherwise (a
// ReduceScatter's images replace partials in chunks sized for them).
CollArgs planArgs(const CollArgs& a);

// The same with the communicator's configuration (plans the call, asks the engine once).
DeviceChoice decide(const Identity& id, const PlanContext& ctx, const CollArgs& a, const EngineStatus& status,
                    const HierEngine* engine);

}  // namespace hicoll::dev
