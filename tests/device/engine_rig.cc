#include "engine_rig.h"

#include <cstring>
#include <thread>

namespace hctest {

using hicoll::dev::FlagLayout;
using hicoll::dev::HierEngine;
using hicoll::dev::Resources;

EngineRig::EngineRig(const std::vector<std::string>& labels, const RigOptions& opt)
    : W_(static_cast<int>(labels.size())) {
  topo_ = hicoll::Topology::build(labels, std::vector<std::string>(labels.size(), "host"));
  const int N = topo_.nnodes, L = topo_.localSize(0);
  const hicoll::dev::BufferSizes sz = hicoll::dev::bufferSizes(L, N, opt.chunk, opt.scratch, opt.sort);
  for (int r = 0; r < W_; ++r) {
    dsort_.emplace_back(sz.dsort);
    dwork_.emplace_back(sz.dwork);
    hscratch_.emplace_back(sz.hscratch);
    hsort_.emplace_back(sz.hsort);
  }
  for (int n = 0; n < N; ++n) {
    const size_t words = FlagLayout::bytes(L) / 8 + 1;
    flags_.emplace_back(new uint64_t[words]());
  }
  if (N > 1) {
    fabric_ = LoopFabric::create(W_);
    for (int r = 0; r < W_; ++r) nets_.push_back(fabric_->endpoint(r));
  }
  for (int r = 0; r < W_; ++r) {
    Resources res;
    res.rank = r;
    res.topo = topo_;
    const int n = topo_.node_of[r];
    for (int p = 0; p < L; ++p) res.dsort.push_back(dsort_[topo_.rankAt(n, p)].data());
    res.dsort_bytes = sz.dsort;
    res.dwork = dwork_[r].data();
    res.dwork_bytes = sz.dwork;
    res.hscratch = hscratch_[r].data();
    res.hscratch_bytes = sz.hscratch;
    res.hsort = hsort_[r].data();
    res.hsort_bytes = sz.hsort;
    res.flags.host = reinterpret_cast<volatile uint32_t*>(flags_[n].get());
    res.flags.local_ranks = L;
    res.net = N > 1 ? nets_[r].get() : nullptr;
    res.chunk_bytes = opt.chunk;
    const std::string small = std::to_string(opt.allreduce_small);
    res.plan.cfg = hicoll::Config::from([&](const char* name) -> const char* {
      return std::string(name) == "HICOLL_ALLREDUCE_SMALL_BYTES" ? small.c_str() : nullptr;
    });
    res.timeout_ms = opt.timeout_ms;
    auto s = std::make_unique<HostStream>(opt.stream_wait_ms);
    streams_.push_back(s.get());
    engines_.push_back(std::make_unique<HierEngine>(std::move(res), std::move(s)));
  }
}

EngineRig::~EngineRig() {
  // Engines first (they drain and stop their proxies), then the memory they used.
  engines_.clear();
}

void EngineRig::parallel(const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < W_; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

std::string EngineRig::stuck() const {
  std::string s;
  for (int r = 0; r < W_; ++r)
    if (streams_[r]->stuck()) s += "rank " + std::to_string(r) + ": " + streams_[r]->stuckWhat() + "\n";
  return s;
}

}  // namespace hctest
