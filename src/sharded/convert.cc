#include "sharded/convert.h"

#include "base/numeric.h"

#include <cmath>
#include <cstring>

namespace hicoll::sharded {

uint16_t floatToBf16(float f) {
  return num::floatToBf16(f);
}
float bf16ToFloat(uint16_t h) {
  return num::bf16ToFloat(h);
}
uint16_t floatToHalf(float f) {
  return num::floatToHalf(f);
}
float halfToFloat(uint16_t h) {
  return num::halfToFloat(h);
}

void fromFloat(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::Float32:
      if (n) std::memcpy(dst, src, n * 4);
      return;
    case DType::BFloat16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = floatToBf16(src[i]);
      return;
    }
    case DType::Float16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = floatToHalf(src[i]);
      return;
    }
  }
}

void toFloat(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::Float32:
      if (n) std::memcpy(dst, src, n * 4);
      return;
    case DType::BFloat16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16ToFloat(s[i]);
      return;
    }
    case DType::Float16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = halfToFloat(s[i]);
      return;
    }
  }
}

void accumulate(DType t, const void* src, float scale, float* acc, size_t n) {
  switch (t) {
    case DType::Float32: {
      auto* s = static_cast<const float*>(src);
      for (size_t i = 0; i < n; ++i) acc[i] += scale * s[i];
      return;
    }
    case DType::BFloat16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) acc[i] += scale * bf16ToFloat(s[i]);
      return;
    }
    case DType::Float16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) acc[i] += scale * halfToFloat(s[i]);
      return;
    }
  }
}

double sumSquares(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void adamw(const AdamWStep& s, float* param, float* exp_avg, float* exp_avg_sq, const float* grad, size_t n) {
  // Same operation order as torch::optim::AdamW so that fp32 runs agree to rounding.
  // Scalars are formed in double and rounded once, as torch does with its double options.
  const float decay = static_cast<float>(1.0 - s.lr * s.weight_decay);
  const float beta1 = static_cast<float>(s.beta1), beta2 = static_cast<float>(s.beta2);
  const float one_minus_b1 = static_cast<float>(1.0 - s.beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - s.beta2);
  const float eps = static_cast<float>(s.eps);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(s.bias_correction2));
  const float step_size = static_cast<float>(s.lr / s.bias_correction1);
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * s.grad_scale;
    float p = param[i] * decay;
    const float m = exp_avg[i] * beta1 + g * one_minus_b1;
    const float v = exp_avg_sq[i] * beta2 + one_minus_b2 * (g * g);
    const float denom = std::sqrt(v) / sqrt_bc2 + eps;
    p += -step_size * (m / denom);
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

}  // namespace hicoll::sharded
