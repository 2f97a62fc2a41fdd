// Sharding arithmetic, option checks and dtype helpers: everything that needs no peers.
#include <algorithm>
#include <cmath>
#include <string>

#include "hicoll/sharded.hpp"

namespace hicoll::sharded {

hcDataType_t toHc(DType t) {
  switch (t) {
    case DType::Float32: return hcFloat32;
    case DType::BFloat16: return hcBfloat16;
    case DType::Float16: return hcFloat16;
  }
  throw Error("invalid DType");
}

size_t dtypeSize(DType t) {
  return t == DType::Float32 ? 4 : 2;
}

const char* dtypeName(DType t) {
  switch (t) {
    case DType::Float32: return "fp32";
    case DType::BFloat16: return "bf16";
    case DType::Float16: return "fp16";
  }
  return "?";
}

DType parseDType(const std::string& s) {
  if (s == "fp32" || s == "float32") return DType::Float32;
  if (s == "bf16" || s == "bfloat16") return DType::BFloat16;
  if (s == "fp16" || s == "float16") return DType::Float16;
  throw Error("precision '" + s + "' is not one of fp32, bf16, fp16");
}

static std::string divisors(int n) {
  std::string out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return out;
}

void validate(const Options& o, int world) {
  auto fail = [](const std::string& m) { throw Error(m); };
  if (world < 1) fail("world size " + std::to_string(world) + " is not positive");
  const int d = o.sharded_data_parallel_degree;
  if (d < 1 || world % d != 0)
    fail("sharded_data_parallel_degree=" + std::to_string(d) + " must divide the data-parallel world size " +
         std::to_string(world) + " (choose one of: " + divisors(world) + ")");
  if (o.sdp_reduce_bucket_size < static_cast<size_t>(d))
    fail("sdp_reduce_bucket_size=" + std::to_string(o.sdp_reduce_bucket_size) +
         " is smaller than sharded_data_parallel_degree=" + std::to_string(d) +
         " (a bucket holds at least one element per rank)");
  if (o.sdp_max_live_parameters == 0) fail("sdp_max_live_parameters must be positive");
  if (!(o.sdp_gradient_clipping >= 0) || !std::isfinite(o.sdp_gradient_clipping))
    fail("sdp_gradient_clipping=" + std::to_string(o.sdp_gradient_clipping) +
         " must be a finite number >= 0 (0 disables clipping)");
  if ((o.sdp_quantized_allgather || o.sdp_quantized_reducescatter) &&
      (o.sdp_quant_block < 1 || o.sdp_quant_block > (size_t{1} << 24)))
    fail("sdp_quant_block=" + std::to_string(o.sdp_quant_block) + " must lie in [1, 16777216]");
  if (o.gradient_accumulation_steps < 1)
    fail("gradient_accumulation_steps=" + std::to_string(o.gradient_accumulation_steps) + " must be >= 1");
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) fail("AdamW betas must lie in [0, 1)");
  if (!(o.eps > 0)) fail("AdamW eps must be positive");
  if (!(o.weight_decay >= 0)) fail("AdamW weight_decay must be >= 0");
  if (!(o.initial_loss_scale > 0) || !(o.min_loss_scale > 0) || o.min_loss_scale > o.initial_loss_scale)
    fail("loss scale: need 0 < min_loss_scale <= initial_loss_scale");
  if (o.loss_scale_window < 1) fail("loss_scale_window must be >= 1");
  if (o.shard_alignment < 1) fail("shard_alignment must be >= 1");
  if (o.wait_timeout_ms < 0) fail("wait_timeout_ms must be >= 0");
  if (o.memory != MemoryKind::Host)
    fail(
        "memory kind Device is not supported: the sharded layer keeps its buffers and runs "
        "its optimizer on the host (use MemoryKind::Host)");
}

ShardInfo ShardInfo::make(size_t numel, int degree, int rank, size_t align) {
  if (degree < 1 || rank < 0 || rank >= degree)
    throw Error("ShardInfo: rank " + std::to_string(rank) + " outside a group of " + std::to_string(degree));
  if (align < 1) throw Error("ShardInfo: alignment must be >= 1");
  ShardInfo s;
  s.numel = numel;
  s.degree = degree;
  s.rank = rank;
  const size_t unit = static_cast<size_t>(degree) * align;
  s.padded = (numel + unit - 1) / unit * unit;
  s.shard = s.padded / degree;
  return s;
}

size_t ShardInfo::realCount(int r) const {
  const size_t b = begin(r);
  if (b >= numel) return 0;
  return std::min(shard, numel - b);
}

ShardInfo::Overlap ShardInfo::overlap(size_t flat_begin, size_t flat_end) const {
  const size_t b = std::max(flat_begin, begin());
  const size_t e = std::min(flat_end, end());
  if (b >= e) return {};
  return {b, b - begin(), e - b};
}

std::vector<ShardInfo::Bucket> ShardInfo::buckets(size_t bucket_elems) const {
  if (bucket_elems < static_cast<size_t>(degree))
    throw Error("bucket of " + std::to_string(bucket_elems) +
                " elements cannot hold one "
                "element for each of " +
                std::to_string(degree) + " ranks");
  const size_t per = bucket_elems / degree;
  std::vector<Bucket> out;
  for (size_t local = 0; local < shard; local += per) out.push_back({local, std::min(per, shard - local)});
  return out;
}

size_t ParamSpec::numel() const {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error("parameter '" + name + "' has a negative dimension");
    n *= static_cast<size_t>(d);
  }
  return n;
}

std::vector<UnitPlan> planUnits(const std::vector<UnitSpec>& units, size_t threshold, int degree, int rank,
                                size_t align) {
  std::vector<UnitPlan> plans;
  size_t persistent = 0;
  for (const UnitSpec& u : units) {
    UnitPlan p;
    p.name = u.name;
    p.persistent_begin = persistent;
    size_t flat = 0;
    for (const ParamSpec& ps : u.params) {
      ParamPlacement pl;
      pl.numel = ps.numel();
      pl.persistent = pl.numel < threshold;
      size_t& cursor = pl.persistent ? persistent : flat;
      pl.offset = cursor;  // persistent offsets are absolute in the shared buffer
      cursor += pl.numel;
      p.params.push_back(pl);
    }
    p.persistent_numel = persistent - p.persistent_begin;
    p.shard = ShardInfo::make(flat, degree, rank, align);
    plans.push_back(std::move(p));
  }
  return plans;
}

}  // namespace hicoll::sharded
