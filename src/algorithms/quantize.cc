#include "algorithms/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "base/error.h"
#include "base/kernel_clones.h"
#include "base/numeric.h"

namespace hicoll::quant {

namespace {

// Per dtype: the element as stored, its bits as a signed integer (magnitudes stay
// non-negative, so SSE2's signed compares and max apply), and the conversions. Blocks are
// coded from floats: fp32 in place, the 16-bit types widened a chunk at a time.
struct F32 {
  using Elem = float;
  using Raw = int32_t;
  static constexpr Raw kAbs = 0x7fffffff, kInf = 0x7f800000;
  static Raw bits(float x) { return static_cast<Raw>(num::floatToBits(x)); }
  static float toFloat(Raw r) { return num::bitsToFloat(static_cast<uint32_t>(r)); }
};
struct BF16 {
  using Elem = uint16_t;
  using Raw = int16_t;
  static constexpr Raw kAbs = 0x7fff, kInf = 0x7f80;
  static Raw bits(uint16_t x) { return static_cast<Raw>(x); }
  static float toFloat(Raw r) { return value(static_cast<uint16_t>(r)); }
  static float value(uint16_t x) { return num::bf16ToFloat(x); }
  static uint16_t fromFloat(float f) { return num::floatToBf16(f); }
  static uint16_t fromNumber(float f) { return num::roundToBf16(f); }  // f not a NaN: no select
};
struct F16 {
  using Elem = uint16_t;
  using Raw = int16_t;
  static constexpr Raw kAbs = 0x7fff, kInf = 0x7c00;
  static Raw bits(uint16_t x) { return static_cast<Raw>(x); }
  static float toFloat(Raw r) { return value(static_cast<uint16_t>(r)); }
  static float value(uint16_t x) { return num::halfToFloat(x); }
  static uint16_t fromFloat(float f) { return num::floatToHalf(f); }
  static uint16_t fromNumber(float f) { return fromFloat(f); }
};

constexpr size_t kChunk = 512;  // floats of a widened (or narrowed) piece of a block

// Adding and subtracting k rounds to an integer, to nearest even (the default rounding
// mode), any value much smaller than k; unlike nearbyint it vectorises on SSE2.
template <class Real>
Real roundEven(Real t) {
  constexpr Real k = std::is_same_v<Real, float> ? 0x1.8p23f : 0x1.8p52;
  return (t + k) - k;
}

using num::pick;  // branch-free selects (numeric.h): the loops below must vectorise

// Bits of the largest finite magnitude in the block (magnitude order is bit order).
template <class F>
typename F::Raw absmaxBits(const typename F::Elem* e, size_t n) {
  using Raw = typename F::Raw;
  Raw m = 0;
  for (size_t i = 0; i < n; ++i) {
    const Raw mag = static_cast<Raw>(F::bits(e[i]) & F::kAbs);
    const Raw v = mag < F::kInf ? mag : 0;
    m = v > m ? v : m;
  }
  return m;
}

// How a block of absmax a is coded. The fast ways multiply by s, 127 / a rounded upward:
// x * s is then within a few ulps of x * 127 / a, and a quotient that is not a tie lies
// further than that from one, so it rounds to the exact code. That holds in double for
// fp32 input, and in float for the 16-bit types, whose significands are short enough. An
// exact tie, 254 x = (2k + 1) a, needs 127 to divide 2k + 1 or a's significand: x = +-a/2,
// which s rounded upward sends away from zero as round-to-even must (to +-64), or a block
// that divides instead. Non-finite elements are replaced by xneg, which codes to -128.
struct Plan {
  enum Kind { kFloat, kDouble, kDivide } kind;
  int32_t amag;  // fp32 bits of a
  int32_t xneg;  // fp32 bits of a value coding to -128
  float sf;      // kFloat: the scale
  double sd;     // kDouble: the scale
  double ad;     // kDivide: the divisor (1 for a block of zeros)
};

Plan plan(float a, bool shortInput) {
  Plan p{Plan::kDivide, F32::bits(a), 0, 0, 0, a > 0 ? static_cast<double>(a) : 1.0};
  const uint32_t ab = num::floatToBits(a), exp = ab >> 23;
  const uint32_t sig = (ab & 0x7fffffu) | (exp ? 0x800000u : 0u);
  if (a == 0 || sig % 127 == 0) return p;
  // Not representable (overflow, or too few subnormal bits) for some blocks: those divide.
  const float xneg = static_cast<float>(-128.0 * a / 127.0);
  p.xneg = F32::bits(xneg);
  // Overflows for tiny a: those blocks use double.
  p.sf = std::nextafter(static_cast<float>(127.0 / a), std::numeric_limits<float>::infinity());
  if (shortInput && std::isfinite(p.sf) && roundEven(xneg * p.sf) == kNonFinite) {
    p.kind = Plan::kFloat;
    return p;
  }
  p.sd = std::nextafter(127.0 / a, std::numeric_limits<double>::infinity());
  if (roundEven(static_cast<double>(xneg) * p.sd) == kNonFinite) p.kind = Plan::kDouble;
  return p;
}

template <class Real>
void codesFast(const Plan& p, Real s, const float* x, size_t n, int8_t* codes) {
  for (size_t i = 0; i < n; ++i) {
    const int32_t b = F32::bits(x[i]);
    const int32_t xb = pick((b & F32::kAbs) <= p.amag, b, p.xneg);
    codes[i] = static_cast<int8_t>(static_cast<int32_t>(roundEven(static_cast<Real>(F32::toFloat(xb)) * s)));
  }
}

// Exact: x * 127 is exact in double and the quotient is rounded once, which cannot carry a
// non-tie across a half-integer, and keeps a tie a tie.
void codesDivide(const Plan& p, const float* x, size_t n, int8_t* codes) {
  for (size_t i = 0; i < n; ++i) {
    const int32_t b = F32::bits(x[i]);
    const bool finite = (b & F32::kAbs) <= p.amag;
    const double v = F32::toFloat(pick(finite, b, 0));  // keeps the conversion below defined
    const int32_t r = static_cast<int32_t>(roundEven(v * 127.0 / p.ad));
    codes[i] = static_cast<int8_t>(pick<int32_t>(finite, r, kNonFinite));
  }
}

void codeFloats(const Plan& p, const float* x, size_t n, int8_t* codes) {
  switch (p.kind) {
    case Plan::kFloat: return codesFast(p, p.sf, x, n, codes);
    case Plan::kDouble: return codesFast(p, p.sd, x, n, codes);
    case Plan::kDivide: return codesDivide(p, x, n, codes);
  }
}

template <class F>
void quantizeT(const void* src, size_t count, size_t block, uint8_t* dst) {
  if (count == 0) return;
  const auto* in = static_cast<const typename F::Elem*>(src);
  const size_t nb = numBlocks(count, block);
  int8_t* codes = reinterpret_cast<int8_t*>(dst + nb * sizeof(float));
  alignas(64) float wide[kChunk];
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * block, n = std::min(block, count - off);
    const typename F::Elem* e = in + off;
    const float a = F::toFloat(absmaxBits<F>(e, n));
    std::memcpy(dst + b * sizeof(float), &a, sizeof a);
    if constexpr (std::is_same_v<F, F32>) {
      codeFloats(plan(a, false), e, n, codes + off);
    } else {
      const Plan p = plan(a, true);
      for (size_t j = 0; j < n; j += kChunk) {
        const size_t m = std::min(kChunk, n - j);
        for (size_t i = 0; i < m; ++i) wide[i] = F::value(e[j + i]);
        codeFloats(p, wide, m, codes + off + j);
      }
    }
  }
  const size_t used = nb * sizeof(float) + count;
  std::memset(dst + used, 0, packedBytes(count, block) - used);
}

// Dequantized values before the final rounding to the output dtype, NaN for -128.
// q * a / 127, unless exact, lies far from the output's rounding boundaries: further than
// the few double ulps by which q * (a / 127) in double misses it, for fp32, and further
// than the few float ulps (or subnormal float steps) by which q * (a / 127) in float misses
// it, for the 16-bit types (short significands, and no subnormals below float's). So one
// rounding of that product (the 16-bit types: float's, then theirs) equals rounding
// q * a / 127 once. q = +-127 gives exactly +-a too.
template <class Real>
void values(const int8_t* q, size_t n, Real c, float* out) {
  const uint32_t nan = num::floatToBits(std::numeric_limits<float>::quiet_NaN());
  for (size_t i = 0; i < n; ++i) {
    const int32_t qi = q[i];
    const float y = static_cast<float>(static_cast<Real>(qi) * c);
    out[i] = num::bitsToFloat(pick<uint32_t>(qi == kNonFinite, nan, num::floatToBits(y)));
  }
}

// values() for the 16-bit types, rounded to them in the same pass (as F::fromFloat of
// values()' floats: a finite product, or F's NaN for -128): one pass over the output instead
// of a float stage and a second pass.
template <class F>
void valuesNarrow(const int8_t* q, size_t n, float c, uint16_t* out) {
  const uint16_t nan = F::fromFloat(std::numeric_limits<float>::quiet_NaN());
  for (size_t i = 0; i < n; ++i) {
    const int32_t qi = q[i];
    out[i] = pick<uint16_t>(qi == kNonFinite, nan, F::fromNumber(static_cast<float>(qi) * c));
  }
}

template <class F>
void dequantizeT(const uint8_t* src, size_t count, size_t block, void* dst) {
  auto* out = static_cast<typename F::Elem*>(dst);
  const size_t nb = numBlocks(count, block);
  const int8_t* codes = reinterpret_cast<const int8_t*>(src + nb * sizeof(float));
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * block, n = std::min(block, count - off);
    float a;
    std::memcpy(&a, src + b * sizeof(float), sizeof a);
    const double c = static_cast<double>(a) / 127.0;
    if constexpr (std::is_same_v<F, F32>) values(codes + off, n, c, out + off);
    else valuesNarrow<F>(codes + off, n, static_cast<float>(c), out + off);
  }
}

// sumImages over the elements [off, off + n) of one quantization block of each image.
template <class F>
void sumBlock(const void* own, const void* const* images, size_t nimages, size_t count, size_t block, size_t off,
              size_t n, float div, void* out) {
  const size_t nb = numBlocks(count, block), b = off / block;
  alignas(64) float acc[kChunk], deq[kChunk];
  for (size_t j = 0; j < n; j += kChunk) {
    const size_t m = std::min(kChunk, n - j), at = off + j;
    if constexpr (std::is_same_v<F, F32>) std::memcpy(acc, static_cast<const float*>(own) + at, m * sizeof(float));
    else
      for (size_t i = 0; i < m; ++i) acc[i] = F::value(static_cast<const uint16_t*>(own)[at + i]);
    for (size_t k = 0; k < nimages; ++k) {
      const auto* img = static_cast<const uint8_t*>(images[k]);
      float a;
      std::memcpy(&a, img + b * sizeof(float), sizeof a);
      values(reinterpret_cast<const int8_t*>(img + nb * sizeof(float)) + at, m, static_cast<double>(a) / 127.0, deq);
      for (size_t i = 0; i < m; ++i) acc[i] += deq[i];
    }
    if (div > 0)
      for (size_t i = 0; i < m; ++i) acc[i] /= div;
    if constexpr (std::is_same_v<F, F32>) std::memcpy(static_cast<float*>(out) + at, acc, m * sizeof(float));
    else
      for (size_t i = 0; i < m; ++i) static_cast<uint16_t*>(out)[at + i] = F::fromFloat(acc[i]);
  }
}

template <class F>
void sumImagesT(const void* own, const void* const* images, size_t nimages, size_t count, size_t block, int divisor,
                void* out) {
  const float div = divisor > 0 ? static_cast<float>(divisor) : 0.0f;
  for (size_t off = 0; off < count; off += block)
    sumBlock<F>(own, images, nimages, count, block, off, std::min(block, count - off), div, out);
}

void checkBlock(size_t block) {
  (void)numBlocks(0, block);
}  // throws on a block out of range

}  // namespace

bool quantizable(hcDataType_t dtype) {
  return dtype == hcFloat32 || dtype == hcBfloat16 || dtype == hcFloat16;
}

HC_KERNEL_CLONES void quantize(const void* src, size_t count, hcDataType_t dtype, size_t block, void* dst) {
  checkBlock(block);
  auto* d = static_cast<uint8_t*>(dst);
  switch (dtype) {
    case hcFloat32: return quantizeT<F32>(src, count, block, d);
    case hcBfloat16: return quantizeT<BF16>(src, count, block, d);
    case hcFloat16: return quantizeT<F16>(src, count, block, d);
    default: HC_THROW(hcInvalidArgument, "quantize: datatype {} is not quantizable", static_cast<int>(dtype));
  }
}

HC_KERNEL_CLONES void dequantize(const void* src, size_t count, hcDataType_t dtype, size_t block, void* dst) {
  checkBlock(block);
  const auto* s = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case hcFloat32: return dequantizeT<F32>(s, count, block, dst);
    case hcBfloat16: return dequantizeT<BF16>(s, count, block, dst);
    case hcFloat16: return dequantizeT<F16>(s, count, block, dst);
    default: HC_THROW(hcInvalidArgument, "dequantize: datatype {} is not quantizable", static_cast<int>(dtype));
  }
}

HC_KERNEL_CLONES void sumImages(const void* own, const void* const* images, size_t nimages, size_t count,
                                hcDataType_t dtype, size_t block, int divisor, void* out) {
  checkBlock(block);
  switch (dtype) {
    case hcFloat32: return sumImagesT<F32>(own, images, nimages, count, block, divisor, out);
    case hcBfloat16: return sumImagesT<BF16>(own, images, nimages, count, block, divisor, out);
    case hcFloat16: return sumImagesT<F16>(own, images, nimages, count, block, divisor, out);
    default: HC_THROW(hcInvalidArgument, "sumImages: datatype {} is not quantizable", static_cast<int>(dtype));
  }
}

}  // namespace hicoll::quant
