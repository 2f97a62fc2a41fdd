// The device engine's planning: chunk sizes per collective, whether a call can run here
// (unsupported), the bytes it moves per peer and the sizes of the staging buffers.
#include "device/hier_engine.h"

#include <algorithm>

#include "base/error.h"
#include "base/quant_format.h"
#include "device/decision.h"

namespace hicoll::dev {
namespace {

size_t roundChunk(size_t q, size_t esize) {
  if (q >= 256) return q - q % 256;
  return q - q % esize;
}

}  // namespace

BufferSizes bufferSizes(int local_ranks, int nnodes, size_t chunk, size_t scratch_knob, size_t sort_knob) {
  const size_t D = kDepth, L = static_cast<size_t>(local_ranks), N = static_cast<size_t>(nnodes);
  BufferSizes s;
  s.dsort = std::min(sort_knob, D * L * N * chunk);
  if (N > 1) {
    s.dwork = (D + 1) * N * chunk;
    s.hscratch = std::min(scratch_knob, D * N * chunk);
    s.hsort = std::min(sort_knob, D * N * chunk);
  }
  return s;
}

size_t HierEngine::chunkBytes(Kind k, size_t e) const {
  const size_t L = static_cast<size_t>(L_), N = static_cast<size_t>(N_);
  size_t q = res_.chunk_bytes;
  switch (k) {
    case Kind::AllGather:
      q = std::min(q, dslot_ / N);
      if (N > 1) q = std::min({q, hsslot_, hrslot_ / N});
      break;
    case Kind::ReduceScatter:
      q = std::min(q, dslot_ / (L * N));
      if (N > 1) q = std::min({q, wslot_ / N, hsslot_ / N, hrslot_ / N});
      break;
    case Kind::Broadcast:
      q = std::min(q, dslot_);
      if (N > 1) q = std::min({q, hsslot_, hrslot_});
      break;
  }
  return roundChunk(q, e);
}

size_t HierEngine::chunkFor(const CollArgs& a) const {
  const size_t e = typeSize(a.dtype);
  if (e == 0) return 0;
  switch (a.coll) {
    case hcCollAllGather: return chunkBytes(Kind::AllGather, quantizes(a) ? 1 : e);  // the images' bytes
    case hcCollReduceScatter: return chunkBytes(Kind::ReduceScatter, e);
    case hcCollBroadcast: return chunkBytes(Kind::Broadcast, e);
    case hcCollAllReduce:
      if (smallAllReduce(a)) return chunkBytes(Kind::AllGather, e);
      return std::min(chunkBytes(Kind::AllGather, e), chunkBytes(Kind::ReduceScatter, e));
    default: return 0;
  }
}

size_t HierEngine::wireBlock(const CollArgs& a) const {
  if (!quantizes(a)) return 0;
  if (a.coll == hcCollAllGather) return a.quant.block;
  if (a.coll != hcCollReduceScatter || N_ == 1) return 0;
  const size_t e = typeSize(a.dtype);
  return quant::chunkedImageBytes(a.count * e, chunkFor(a), e, a.quant.block) ? a.quant.block : 0;
}

CollPlan HierEngine::plan(const CollArgs& a) const {
  return planCall(id_, res_.plan, a, deviceCapabilities());
}

std::string HierEngine::unsupported(const CollArgs& a) const {
  const size_t e = typeSize(a.dtype);
  if (e == 0) return fmt::format("datatype {} has no device kernel", static_cast<int>(a.dtype));
  if (a.coll != hcCollAllGather && a.coll != hcCollReduceScatter && a.coll != hcCollAllReduce &&
      a.coll != hcCollBroadcast)
    return fmt::format("{} has no device path", collName(a.coll));
  if (quantizes(a) && a.coll != hcCollAllGather && a.coll != hcCollReduceScatter)
    return fmt::format("the quantized {} has no device path", collName(a.coll));
  const bool reduces = a.coll == hcCollReduceScatter || (a.coll == hcCollAllReduce && !smallAllReduce(a));
  if (reduces && L_ > kMaxReduceInputs)
    return fmt::format("{} ranks per node exceed the {} inputs of the device reduction", L_, kMaxReduceInputs);
  if (reduces && N_ > kMaxReduceInputs)
    return fmt::format("{} nodes exceed the {} inputs of the device reduction", N_, kMaxReduceInputs);
  if (chunkFor(a) == 0)
    return fmt::format(
        "device staging buffers too small for one {}-byte element per chunk ({} nodes x {} local ranks; "
        "SMDDP_AG_SORT_BUFFER_SIZE_BYTES / SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES)",
        e, N_, L_);
  return "";
}

void HierEngine::forEachPeerBytes(const CollArgs& a, const std::function<void(int, size_t)>& fn) const {
  const Topology& t = res_.topo;
  const size_t e = typeSize(a.dtype), N = static_cast<size_t>(N_);
  // AllGather and ReduceScatter move the same bytes: N blocks to each local peer, one to each
  // rail peer (rail: a quantized ReduceScatter's images instead).
  auto hier = [&](size_t b, size_t rail = 0) {
    for (int p = 0; p < L_; ++p)
      if (p != l_) fn(t.rankAt(n_, p), N * b);
    for (int m = 0; m < N_; ++m)
      if (m != n_) fn(t.rankAt(m, l_), rail ? rail : b);
  };
  switch (a.coll) {
    case hcCollAllGather: hier(quantizes(a) ? quant::packedBytes(a.count, a.quant.block) : a.count * e); break;
    case hcCollReduceScatter:  // a quantized one: exact within the node, images to the rail peers
      hier(a.count * e, wireBlock(a) ? quant::chunkedImageBytes(a.count * e, chunkFor(a), e, a.quant.block) : 0);
      break;
    case hcCollAllReduce:
      if (smallAllReduce(a)) {
        hier(a.count * e);
      } else {
        const size_t bb = plan(a).allreduce_block * e;
        hier(bb);
        hier(bb);
      }
      break;
    case hcCollBroadcast: {
      const int n0 = t.node_of[a.root], l0 = t.local_of[a.root];
      if (l_ != l0) break;
      for (int p = 0; p < L_; ++p)
        if (p != l_) fn(t.rankAt(n_, p), a.count * e);
      if (res_.rank == a.root)
        for (int m = 0; m < N_; ++m)
          if (m != n0) fn(t.rankAt(m, l0), a.count * e);
      break;
    }
    default: break;
  }
}

}  // namespace hicoll::dev
