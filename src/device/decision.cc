#include "device/decision.h"

#include "core/comm.h"
#include "device/hier_engine.h"

namespace hicoll::dev {

bool hostOnlyRule(const PathChoice& host) {
  if (host.path == hcPathRing) return true;  // HICOLL_ALGO=ring selects the host ring
  // The shm transport's single-copy reads; CUDA IPC replaces them on the device path.
  return host.path == hcPathFallback && host.reason.rfind("no single-copy intra-node reads", 0) == 0;
}

DeviceChoice decide(const PathChoice& host, const EngineStatus& status, const std::string& engine_unsupported) {
  DeviceChoice d;
  if (host.path == hcPathFallback && !hostOnlyRule(host)) {
    d.fallback = true;
    d.reason = host.reason;
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
  const PathChoice host = choosePath(comm, a);
  const std::string unsupported = status.hier_ok && engine ? engine->unsupported(a) : "";
  return decide(host, status, unsupported);
}

}  // namespace hicoll::dev
