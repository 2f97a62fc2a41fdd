// Test support: W ranks of the device engine as threads, with host streams, host memory in
// place of device buffers, one counter segment per simulated node and an in-memory network
// between nodes. The same HierEngine code runs on the GPU with CUDA streams.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/hier_engine.h"
#include "host_stream.h"
#include "loop_transport.h"
#include "values.h"

namespace hctest {

struct RigOptions {
  size_t chunk = 1 << 20;
  size_t scratch = 16 << 20;
  size_t sort = 128 << 20;
  size_t allreduce_small = 65536;
  long timeout_ms = 20000;      // the engine's (HICOLL_TIMEOUT_MS)
  long stream_wait_ms = 30000;  // a host stream gives up waiting after this (then: stuck)
};

class EngineRig {
 public:
  EngineRig(const std::vector<std::string>& labels, const RigOptions& opt = {});
  ~EngineRig();

  int size() const { return W_; }
  const hicoll::Topology& topo() const { return topo_; }
  hicoll::dev::HierEngine& engine(int r) { return *engines_[r]; }
  HostStream& stream(int r) { return *streams_[r]; }
  // Runs fn(rank) on one thread per rank and joins them.
  void parallel(const std::function<void(int rank)>& fn);
  // Any host stream that gave up on a wait (a protocol bug): its description.
  std::string stuck() const;

 private:
  int W_;
  hicoll::Topology topo_;
  std::vector<std::vector<char>> dsort_, dwork_, hscratch_, hsort_;
  std::vector<std::unique_ptr<uint64_t[]>> flags_;  // per node (uint64 for alignment)
  std::shared_ptr<LoopFabric> fabric_;
  std::vector<std::unique_ptr<hicoll::Transport>> nets_;
  std::vector<HostStream*> streams_;  // owned by the engines
  std::vector<std::unique_ptr<hicoll::dev::HierEngine>> engines_;
};

}  // namespace hctest
