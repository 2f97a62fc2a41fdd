// The decision table of the device path: hierarchical (CUDA IPC + staged inter-node) or the
// NCCL fallback, with the reason. Every input agrees across ranks, so all ranks choose alike.
#pragma once

#include <string>

#include "algorithms/host.h"
#include "base/coll.h"

struct hcComm;

namespace hicoll::dev {

class HierEngine;

struct DeviceChoice {
  bool fallback = false;
  std::string reason;  // why the fallback ("" on the hierarchical path)
};

// What the engine could set up at creation (agreed by all ranks): CUDA IPC among the node's
// ranks, stream memory operations, one process per rank of a node.
struct EngineStatus {
  bool hier_ok = false;
  std::string why_not;
};

// choosePath also applies rules that only concern host buffers (HICOLL_ALGO=ring, the
// single-copy CMA reads of the shm transport); those do not make a device call fall back.
bool hostOnlyRule(const PathChoice& host);

// The table, in order: the host rules that apply to device buffers (HICOLL_FORCE_FALLBACK,
// uneven nodes, SMDDP scratch/sort sizes), then what the engine could set up, then what it
// cannot run (engine_unsupported: HierEngine::unsupported, "" when it can).
DeviceChoice decide(const PathChoice& host, const EngineStatus& status, const std::string& engine_unsupported);

// The same with the communicator's configuration (calls choosePath).
DeviceChoice decide(const hcComm& comm, const CollArgs& a, const EngineStatus& status, const HierEngine* engine);

}  // namespace hicoll::dev
