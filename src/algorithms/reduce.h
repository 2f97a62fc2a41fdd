// Element-wise reductions on host memory. Sources are combined in one pass per block, in
// registers of the accumulation type (fp32 for fp16/bf16, the type itself otherwise), so n
// sources cost one read of each and one write.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/coll.h"

namespace hicoll {

struct ReduceSpec {
  hcDataType_t dtype = hcFloat32;
  OpKind kind = OpKind::Sum;
  double scalar = 1.0;       // PreMulSum
  uint64_t premul_mask = 0;  // PreMulSum: sources (bit k = srcs[k]) that are inputs, scaled first
  int avg_divisor = 0;       // Avg: divide the result by this (only at the last step)
  bool stream_dst = false;   // write dst with non-temporal stores (large outputs read later)
};

// The spec of a's reduction among nranks ranks: premul_mask as above; final_step: the call's
// last reduction (an average divides there).
inline ReduceSpec reduceSpecOf(const CollArgs& a, int nranks, uint64_t premul_mask, bool final_step) {
  ReduceSpec s;
  s.dtype = a.dtype;
  s.kind = a.op.kind;
  s.scalar = a.op.scalar;
  s.premul_mask = premul_mask;
  s.avg_divisor = final_step && a.op.kind == OpKind::Avg ? nranks : 0;
  return s;
}

// dst[i] = srcs[0][i] op srcs[1][i] op ... ; dst may be one of the sources.
void reduceN(const ReduceSpec& spec, void* dst, const void* const* srcs, int nsrc, size_t n);

}  // namespace hicoll
