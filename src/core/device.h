// The device-buffer (CUDA) path of a communicator: stream-ordered collectives on GPU memory,
// CUDA IPC within a node, host-staged inter-node, and the NCCL fallback. Implemented under
// src/device/ in CUDA builds; makeDeviceEngine returns nullptr in host-only builds, and then
// calls with a stream fail with hcUnsupported.
#pragma once

#include <memory>

#include "base/coll.h"
#include "base/identity.h"
#include "bootstrap/bootstrap.h"
#include "core/health.h"
#include "core/stats.h"
#include "plan/plan.h"

namespace hicoll {

// What the device engine uses of its communicator (its own transports and memory it makes).
struct DeviceParts {
  const Identity& id;
  const PlanContext& plan;  // the configuration and the planner's inputs: device calls plan alike
  Bootstrap& bootstrap;     // its setup exchanges and the NCCL fallback's
  Stats& stats;
  const Health& health;  // failed at destruction: hcCommAbort, do not wait for peers
};

// A point-to-point operation on device buffers (hcSend / hcRecv with a stream).
struct DeviceP2p {
  bool send = true;
  void* buf = nullptr;
  size_t count = 0;
  hcDataType_t dtype = hcUint8;
  int peer = 0;
  void* stream = nullptr;
  bool grouped = false;  // inside hcGroupStart / hcGroupEnd: endGroup completes the batch
};

class DeviceEngine {
 public:
  virtual ~DeviceEngine() = default;
  // Enqueues a on a.stream (device buffers) and returns; errors found later surface on the
  // next call or at destruction. Throws hicoll::Error for what it can see up front.
  virtual void enqueue(const CollArgs& a) = 0;
  // Blocks until every enqueued collective has finished (destroy, abort).
  virtual void drain() = 0;
  // Enqueues p on p.stream and returns: NCCL's ncclSend / ncclRecv (the device path has no
  // point-to-point of its own yet). Throws for what it can see up front (not CUDA memory).
  virtual void enqueueP2p(const DeviceP2p& p) = 0;
  // Closes the batch that grouped operations opened (hcGroupEnd); nothing when none is open.
  virtual void endGroup() = 0;
};

// Created lazily by the first call with a non-NULL stream.
std::unique_ptr<DeviceEngine> makeDeviceEngine(const DeviceParts& parts);
// True when ptr is device memory (cudaPointerGetAttributes); false in host-only builds.
bool isDevicePointer(const void* ptr);

}  // namespace hicoll
