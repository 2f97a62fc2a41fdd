#include "engine_rig.h"

#include <cstring>
#include <thread>

#include "device/numeric.h"

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
    res.allreduce_small_bytes = opt.allreduce_small;
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

double testValue(hcDataType_t t, hicoll::OpKind op, int rank, size_t i) {
  const bool is_unsigned = t == hcUint8 || t == hcUint32 || t == hcUint64;
  const size_t k = static_cast<size_t>(rank) * 7 + i * 3;
  if (op == hicoll::OpKind::Prod) {  // |product| <= 2^W: fits int8 for W <= 6
    static const double s[] = {1, 2, -1, 1, 2};
    static const double u[] = {1, 2, 1};
    return is_unsigned ? u[k % 3] : s[k % 5];
  }
  if (is_unsigned) return static_cast<double>(k % 5);
  return static_cast<double>(k % 9) - 4;
}

void setElem(hcDataType_t t, void* base, size_t i, double v) {
  char* p = static_cast<char*>(base) + i * hcTypeSize(t);
  switch (t) {
    case hcInt8: { int8_t x = static_cast<int8_t>(v); std::memcpy(p, &x, 1); break; }
    case hcUint8: { uint8_t x = static_cast<uint8_t>(v); std::memcpy(p, &x, 1); break; }
    case hcInt32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
    case hcUint32: { uint32_t x = static_cast<uint32_t>(v); std::memcpy(p, &x, 4); break; }
    case hcInt64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); break; }
    case hcUint64: { uint64_t x = static_cast<uint64_t>(v); std::memcpy(p, &x, 8); break; }
    case hcFloat16: { uint16_t x = hicoll::num::floatToHalf(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
    case hcBfloat16: { uint16_t x = hicoll::num::floatToBf16(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
    case hcFloat32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
    case hcFloat64: std::memcpy(p, &v, 8); break;
    default: break;
  }
}

double getElem(hcDataType_t t, const void* base, size_t i) {
  const char* p = static_cast<const char*>(base) + i * hcTypeSize(t);
  switch (t) {
    case hcInt8: { int8_t x; std::memcpy(&x, p, 1); return x; }
    case hcUint8: { uint8_t x; std::memcpy(&x, p, 1); return x; }
    case hcInt32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case hcUint32: { uint32_t x; std::memcpy(&x, p, 4); return x; }
    case hcInt64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
    case hcUint64: { uint64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
    case hcFloat16: { uint16_t x; std::memcpy(&x, p, 2); return hicoll::num::halfToFloat(x); }
    case hcBfloat16: { uint16_t x; std::memcpy(&x, p, 2); return hicoll::num::bf16ToFloat(x); }
    case hcFloat32: { float x; std::memcpy(&x, p, 4); return x; }
    case hcFloat64: { double x; std::memcpy(&x, p, 8); return x; }
    default: return 0;
  }
}

std::string dtypeLabel(hcDataType_t t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                "float16", "float32", "float64", "bfloat16"};
  return t >= 0 && t < hcNumTypes ? names[t] : "?";
}

}  // namespace hctest
