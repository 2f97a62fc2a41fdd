// Element conversions and the few vector kernels the layer needs (host, fp32 arithmetic).
#pragma once

#include <cstddef>
#include <cstdint>

#include "hicoll/sharded.hpp"

namespace hicoll::sharded {

// Round to nearest even, NaN stays NaN (as torch does): base/numeric.h's, the one home of
// these conversions, for the layer's own callers.
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);

// dst[i] = (dtype) src[i]
void fromFloat(DType t, const float* src, void* dst, size_t n);
// dst[i] = (float) src[i]
void toFloat(DType t, const void* src, float* dst, size_t n);
// acc[i] += scale * (float) src[i]
void accumulate(DType t, const void* src, float scale, float* acc, size_t n);
// sum of squares in double (order fixed: left to right)
double sumSquares(const float* x, size_t n);

// One AdamW update of n elements, torch.optim.AdamW arithmetic: decoupled weight decay,
// bias-corrected moments; the gradient is multiplied by grad_scale (the clip factor) first.
struct AdamWStep {
  double lr, beta1, beta2, eps, weight_decay;
  double bias_correction1, bias_correction2;  // 1 - beta^t
  float grad_scale;
};
void adamw(const AdamWStep& s, float* param, float* exp_avg, float* exp_avg_sq, const float* grad, size_t n);

}  // namespace hicoll::sharded
