#include "algorithms/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/numeric.h"

namespace hicoll::quant {
namespace {

const hcDataType_t kTypes[] = {hcFloat32, hcBfloat16, hcFloat16};
const size_t kBlocks[] = {1, 7, 256, 1000, 2048};
const size_t kCounts[] = {0, 1, 255, 257, 10007};
constexpr uint8_t kFill = 0xcd;  // what the buffers hold before a call
constexpr size_t kGuard = 16;    // bytes past the end that no call may touch

const char* name(hcDataType_t t) {
  return t == hcFloat32 ? "fp32" : t == hcBfloat16 ? "bf16" : "fp16";
}
size_t elemSize(hcDataType_t t) {
  return t == hcFloat32 ? 4 : 2;
}

// A value of dtype t (rounded to it) as its bits, and back.
uint32_t bitsOf(hcDataType_t t, float v) {
  return t == hcFloat32 ? num::floatToBits(v) : t == hcBfloat16 ? num::floatToBf16(v) : num::floatToHalf(v);
}
float fromBits(hcDataType_t t, uint32_t b) {
  const auto h = static_cast<uint16_t>(b);
  return t == hcFloat32 ? num::bitsToFloat(b) : t == hcBfloat16 ? num::bf16ToFloat(h) : num::halfToFloat(h);
}

// Element i of a buffer of dtype t, as a float (exact).
float load(hcDataType_t t, const uint8_t* p, size_t i) {
  uint32_t b = 0;
  std::memcpy(&b, p + elemSize(t) * i, elemSize(t));
  return fromBits(t, b);
}

std::vector<uint8_t> store(hcDataType_t t, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * elemSize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    const uint32_t b = bitsOf(t, v[i]);
    std::memcpy(&out[elemSize(t) * i], &b, elemSize(t));
  }
  return out;
}

// Neighbour of v among dtype t's values, toward +inf (dir 1) or -inf (dir -1).
float neighbour(hcDataType_t t, float v, int dir) {
  if (t == hcFloat32) return std::nextafter(v, dir * std::numeric_limits<float>::infinity());
  const uint32_t h = bitsOf(t, v);
  if ((h & 0x7fff) == 0) return fromBits(t, dir > 0 ? 0x0001 : 0x8001);
  const bool neg = (h & 0x8000) != 0;
  return fromBits(t, neg == (dir > 0) ? h - 1 : h + 1);  // toward or away from zero
}

// Spacing of dtype t's values just above |y| (below it at the largest finite value).
double ulp(hcDataType_t t, float y) {
  const float ay = std::fabs(y), up = neighbour(t, ay, 1);
  return std::isinf(up) ? static_cast<double>(ay) - neighbour(t, ay, -1) : static_cast<double>(up) - ay;
}

// The reference: the contract in plain double arithmetic, element by element.
struct Ref {
  std::vector<float> absmax;
  std::vector<int8_t> codes;
};
Ref reference(const std::vector<double>& x, size_t block) {
  Ref r;
  for (size_t off = 0; off < x.size(); off += block) {
    const size_t end = std::min(x.size(), off + block);
    double a = 0;
    for (size_t i = off; i < end; ++i)
      if (std::isfinite(x[i])) a = std::max(a, std::fabs(x[i]));
    r.absmax.push_back(static_cast<float>(a));
    for (size_t i = off; i < end; ++i) {
      if (!std::isfinite(x[i])) r.codes.push_back(-128);
      else if (a == 0) r.codes.push_back(0);
      else r.codes.push_back(static_cast<int8_t>(std::nearbyint(x[i] * 127.0 / a)));
    }
  }
  return r;
}

// The reference dequantization: q * a / 127 rounded once to t, to nearest even. Compares
// |127 y - q a| for the candidates around an estimate; both terms and the difference are exact.
float referenceValue(hcDataType_t t, int q, float a) {
  const double qa = static_cast<double>(q) * a;
  const float est = fromBits(t, bitsOf(t, static_cast<float>(qa / 127)));
  float best = est;
  for (float y : {neighbour(t, est, -1), neighbour(t, est, 1)}) {
    const double d = std::fabs(127.0 * y - qa), db = std::fabs(127.0 * best - qa);
    if (d < db || (d == db && (bitsOf(t, y) & 1) == 0)) best = y;
  }
  return best;
}

// Quantizes v (rounded to t first), checks the image against the reference byte for byte
// and the dequantized values against the bound and the reference; returns the number of
// failures.
int roundTrip(hcDataType_t t, size_t block, const std::vector<float>& v) {
  const size_t n = v.size(), nb = numBlocks(n, block), bytes = packedBytes(n, block);
  const auto src = store(t, v);
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = load(t, src.data(), i);

  std::vector<uint8_t> image(bytes + kGuard, kFill);
  quantize(src.data(), n, t, block, image.data());
  for (size_t i = bytes; i < image.size(); ++i) EXPECT_EQ(image[i], kFill) << "written past the image";
  for (size_t i = nb * 4 + n; i < bytes; ++i) EXPECT_EQ(image[i], 0) << "pad byte " << i;

  const Ref ref = reference(x, block);
  int bad = 0;
  for (size_t b = 0; b < nb; ++b) {
    float a;
    std::memcpy(&a, &image[4 * b], 4);
    if (num::floatToBits(a) != num::floatToBits(ref.absmax[b]) && ++bad < 5)
      ADD_FAILURE() << "block " << b << ": absmax " << a << ", reference " << ref.absmax[b];
  }
  for (size_t i = 0; i < n; ++i) {
    const int q = static_cast<int8_t>(image[nb * 4 + i]);
    if (q != ref.codes[i] && ++bad < 5)
      ADD_FAILURE() << "element " << i << " = " << x[i] << ": code " << q << ", reference " << int(ref.codes[i]);
  }

  std::vector<uint8_t> out(n * elemSize(t) + kGuard, kFill);
  dequantize(image.data(), n, t, block, out.data());
  for (size_t i = n * elemSize(t); i < out.size(); ++i) EXPECT_EQ(out[i], kFill) << "written past the output";
  for (size_t i = 0; i < n; ++i) {
    const float y = load(t, out.data(), i);
    if (!std::isfinite(x[i])) {
      if (!std::isnan(y) && ++bad < 5) ADD_FAILURE() << "element " << i << " = " << x[i] << " dequantizes to " << y;
      continue;
    }
    const float a = ref.absmax[i / block];
    const float want = referenceValue(t, ref.codes[i], a);
    if (y != want && ++bad < 5)
      ADD_FAILURE() << "element " << i << ": code " << int(ref.codes[i]) << " of absmax " << a << " dequantizes to "
                    << y << ", once rounded " << want;
    const double tol = a / 254 * (1 + 1e-6) + 0.5 * ulp(t, y);
    if (!(std::fabs(y - x[i]) <= tol) && ++bad < 5)
      ADD_FAILURE() << "element " << i << " = " << x[i] << " -> " << y << ", error " << std::fabs(y - x[i]) << " > "
                    << tol << " (absmax " << a << ")";
  }
  return bad;
}

// Runs gen(dtype, block, count) through every dtype, block and count.
template <class Gen>
void everyShape(Gen gen) {
  for (hcDataType_t t : kTypes)
    for (size_t block : kBlocks)
      for (size_t count : kCounts) {
        SCOPED_TRACE(std::string(name(t)) + " block " + std::to_string(block) + " count " + std::to_string(count));
        ASSERT_EQ(roundTrip(t, block, gen(t, block, count)), 0);
      }
}

// Representatives of the dtype's range: huge, the largest finite, subnormal.
float huge(hcDataType_t t) {
  return t == hcFloat16 ? 60000.0f : 3.0e38f;
}
float largest(hcDataType_t t) {
  if (t == hcFloat32) return std::numeric_limits<float>::max();
  return t == hcBfloat16 ? num::bf16ToFloat(0x7f7f) : 65504.0f;
}
float tiny(hcDataType_t t) {
  return t == hcFloat16 ? 1e-7f : 1e-39f;
}  // subnormal in both

std::vector<float> normal(size_t n, double sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0, sigma);
  std::vector<float> v(n);
  for (auto& e : v) e = static_cast<float>(d(rng));
  return v;
}

TEST(Quantize, SizesOfTheImage) {
  EXPECT_EQ(numBlocks(0, 256), 0u);
  EXPECT_EQ(numBlocks(1, 256), 1u);
  EXPECT_EQ(numBlocks(256, 256), 1u);
  EXPECT_EQ(numBlocks(257, 256), 2u);
  EXPECT_EQ(numBlocks(10007, 1), 10007u);
  EXPECT_EQ(packedBytes(0, 256), 0u);
  EXPECT_EQ(packedBytes(1, 256), 8u);
  EXPECT_EQ(packedBytes(4, 256), 8u);
  EXPECT_EQ(packedBytes(256, 256), 264u);
  EXPECT_EQ(packedBytes(257, 256), 272u);
  EXPECT_EQ(packedBytes(3, 1), 16u);
  EXPECT_EQ(packedBytes(1000, 7), 1576u);
  for (size_t count : kCounts)
    for (size_t block : kBlocks) EXPECT_EQ(packedBytes(count, block) % 8, 0u);
  EXPECT_THROW(numBlocks(10, 0), Error);
  EXPECT_THROW(numBlocks(10, kMaxBlock + 1), Error);
}

// A quantized ReduceScatter's chunks each carry their own image, or the call crosses exact.
TEST(Quantize, ChunkedImages) {
  EXPECT_EQ(chunkedImageBytes(16384, 4096, 4, 256), 4 * packedBytes(1024, 256));
  EXPECT_EQ(chunkedImageBytes(10000, 4096, 4, 256), 2 * packedBytes(1024, 256) + packedBytes(452, 256));
  EXPECT_EQ(chunkedImageBytes(402, 4096, 2, 64), packedBytes(201, 64)) << "one chunk, the whole block";
  EXPECT_EQ(chunkedImageBytes(4, 4096, 4, 256), 0u) << "an 8-byte image of one fp32 element";
  EXPECT_EQ(chunkedImageBytes(4096 + 4, 4096, 4, 256), 0u) << "a 4-byte last chunk, an 8-byte image";
  EXPECT_EQ(chunkedImageBytes(0, 4096, 4, 256), 0u);
}

TEST(Quantize, OnlyTheFloatTypesAreQuantizable) {
  for (int t = 0; t < hcNumTypes; ++t) {
    const auto d = static_cast<hcDataType_t>(t);
    EXPECT_EQ(quantizable(d), d == hcFloat32 || d == hcBfloat16 || d == hcFloat16) << t;
  }
  int32_t x[8] = {};
  uint8_t image[64];
  EXPECT_THROW(quantize(x, 8, hcInt32, 8, image), Error);
  EXPECT_THROW(dequantize(image, 8, hcFloat64, 8, x), Error);
}

TEST(QuantizeBound, RandomNormal) {
  everyShape([](hcDataType_t, size_t block, size_t n) { return normal(n, 1.0, 11 + block); });
}

TEST(QuantizeBound, ConstantBlocks) {
  everyShape([](hcDataType_t, size_t, size_t n) { return std::vector<float>(n, -3.3f); });
  everyShape([](hcDataType_t t, size_t, size_t n) { return std::vector<float>(n, huge(t)); });
  everyShape([](hcDataType_t t, size_t, size_t n) {
    std::vector<float> v(n, largest(t));
    for (size_t i = 1; i < n; i += 2) v[i] = -largest(t) / 3;
    return v;
  });
}

TEST(QuantizeBound, SpikyBlocks) {
  // One huge element per block among tiny ones: all of those code to 0.
  everyShape([](hcDataType_t t, size_t block, size_t n) {
    auto v = normal(n, tiny(t), 23);
    for (size_t off = 0; off < n; off += block) v[off + (off / block * 13) % std::min(block, n - off)] = -huge(t);
    return v;
  });
}

TEST(QuantizeBound, DenormalBlocks) {
  everyShape([](hcDataType_t t, size_t, size_t n) { return normal(n, tiny(t), 31); });
  // Subnormals with the fewest bits: as coarse as the scale and the codes' values get.
  everyShape([](hcDataType_t t, size_t, size_t n) {
    const float s = std::ldexp(1.0f, t == hcFloat16 ? -24 : t == hcBfloat16 ? -133 : -149);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = s * static_cast<float>(static_cast<int>(i % 7) - 3);
    return v;
  });
}

TEST(QuantizeBound, ZeroBlocks) {
  everyShape([](hcDataType_t, size_t, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = i % 3 ? 0.0f : -0.0f;
    return v;
  });
}

TEST(QuantizeBound, MixedSignsAndMagnitudes) {
  everyShape([](hcDataType_t t, size_t, size_t n) {
    std::mt19937_64 rng(41);
    const double top = t == hcFloat16 ? 15 : 120;  // log2 of the largest magnitude
    std::uniform_real_distribution<double> e(-top, top);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i % 2 ? -1 : 1) * std::exp2(e(rng)));
    return v;
  });
}

TEST(QuantizeBound, ExactTies) {
  // Blocks of absmax 127, where every half-integer is a tie, of absmax 381 (127 / 381 is
  // inexact), where 1.5 + 3k are, and random ones holding +-a/2.
  everyShape([](hcDataType_t, size_t block, size_t n) {
    auto v = normal(n, 100.0, 53);
    for (size_t off = 0; off < n; off += block) {
      const size_t m = std::min(block, n - off), kind = off / block % 3;
      for (size_t i = 0; i < m && kind < 2; ++i) {
        const double k = static_cast<double>(i % 127);
        v[off + i] = static_cast<float>((i % 2 ? -1 : 1) * (kind == 0 ? k + 0.5 : 3 * k + 1.5));
      }
      if (kind < 2) v[off] = kind == 0 ? 127.0f : 381.0f;
      if (kind == 2 && m > 2) {
        float a = 0;
        for (size_t i = 0; i < m; ++i) a = std::max(a, std::fabs(v[off + i]));
        v[off + 1] = a / 2;  // ties only if a is the absmax after rounding to the dtype
        v[off + 2] = -a / 2;
      }
    }
    return v;
  });
}

TEST(QuantizeBound, NearTies) {
  // Within an fp32 rounding of a tie: an fp32 x * (127 / a) rounds some of these wrongly.
  everyShape([](hcDataType_t, size_t block, size_t n) {
    std::mt19937_64 rng(61);
    std::uniform_real_distribution<double> u(0.5, 1.0);
    std::vector<float> v(n);
    for (size_t off = 0; off < n; off += block) {
      const double a = u(rng) * 1000;
      const size_t m = std::min(block, n - off);
      v[off] = static_cast<float>(a);
      for (size_t i = 1; i < m; ++i) v[off + i] = static_cast<float>((i % 127 + 0.5) * a / 127 * (i % 2 ? -1 : 1));
    }
    return v;
  });
}

TEST(QuantizeBound, NonFiniteElements) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const auto sprinkle = [&](std::vector<float> v, size_t block) {
    for (size_t i = 0; i < v.size(); i += 5) v[i] = i % 3 == 0 ? nan : i % 3 == 1 ? inf : -inf;
    // A block of non-finite elements only, and one of zeros and a NaN.
    for (size_t i = block; i < std::min(v.size(), 2 * block); ++i) v[i] = i % 2 ? nan : -inf;
    for (size_t i = 2 * block; i < std::min(v.size(), 3 * block); ++i) v[i] = i % 2 ? 0.0f : nan;
    return v;
  };
  everyShape([&](hcDataType_t, size_t block, size_t n) { return sprinkle(normal(n, 2.0, 71), block); });
  // Next to the largest finite value, and among subnormals.
  everyShape([&](hcDataType_t t, size_t block, size_t n) {
    auto v = normal(n, 1.0, 73);
    for (auto& e : v) e = e > 0 ? largest(t) : -largest(t) / 2;
    return sprinkle(v, block);
  });
  everyShape([&](hcDataType_t t, size_t block, size_t n) { return sprinkle(normal(n, tiny(t), 79), block); });
}

TEST(Quantize, NonFiniteCodesAndQuietNaNs) {
  const float inf = std::numeric_limits<float>::infinity();
  for (hcDataType_t t : kTypes) {
    SCOPED_TRACE(name(t));
    const std::vector<float> v = {1.0f, -inf, 0.5f, inf, -2.0f, std::numeric_limits<float>::quiet_NaN(), 0.25f};
    const auto src = store(t, v);
    std::vector<uint8_t> image(packedBytes(v.size(), 256));
    quantize(src.data(), v.size(), t, 256, image.data());
    float a;
    std::memcpy(&a, image.data(), 4);
    EXPECT_EQ(a, 2.0f);
    const int8_t want[] = {64, -128, 32, -128, -127, -128, 16};  // 0.5 * 127 / 2 = 31.75
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(static_cast<int8_t>(image[4 + i]), want[i]) << i;
    std::vector<uint8_t> out(v.size() * elemSize(t));
    dequantize(image.data(), v.size(), t, 256, out.data());
    for (size_t i : {1, 3, 5}) {
      uint32_t bits = 0;
      std::memcpy(&bits, &out[i * elemSize(t)], elemSize(t));
      const uint32_t quiet = t == hcFloat32 ? 1u << 22 : t == hcBfloat16 ? 1u << 6 : 1u << 9;
      EXPECT_TRUE(std::isnan(load(t, out.data(), i))) << i;
      EXPECT_TRUE(bits & quiet) << i;
    }
  }
}

TEST(Quantize, DeterministicAndPure) {
  for (hcDataType_t t : kTypes)
    for (size_t count : {size_t{1}, size_t{1001}, size_t{10007}}) {
      SCOPED_TRACE(std::string(name(t)) + " count " + std::to_string(count));
      auto v = normal(count, 1.0, 83);
      v[count / 2] = std::numeric_limits<float>::quiet_NaN();
      const auto src = store(t, v);
      const size_t bytes = packedBytes(count, 256);
      // Different garbage in the buffers beforehand: every byte of the image is written.
      std::vector<uint8_t> i1(bytes, 0x55), i2(bytes, 0xaa);
      quantize(src.data(), count, t, 256, i1.data());
      quantize(src.data(), count, t, 256, i2.data());
      EXPECT_EQ(i1, i2);
      const auto kept = i1;
      std::vector<uint8_t> o1(count * elemSize(t), 0x55), o2(count * elemSize(t), 0xaa);
      dequantize(i1.data(), count, t, 256, o1.data());
      dequantize(i1.data(), count, t, 256, o2.data());
      EXPECT_EQ(o1, o2);
      EXPECT_EQ(i1, kept);
    }
}

TEST(Quantize, ZeroCountWritesNothing) {
  for (hcDataType_t t : kTypes) {
    std::vector<uint8_t> buf(kGuard, kFill);
    const float x = 1.0f;
    quantize(&x, 0, t, 256, buf.data());
    dequantize(buf.data(), 0, t, 256, buf.data() + 8);
    EXPECT_EQ(buf, std::vector<uint8_t>(kGuard, kFill)) << name(t);
  }
}

}  // namespace
}  // namespace hicoll::quant
