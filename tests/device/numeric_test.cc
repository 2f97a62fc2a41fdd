// The arithmetic the CUDA kernels and the host reference share (base/numeric.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "base/numeric.h"
#include "device/dev_stream.h"

namespace {

namespace num = hicoll::num;
using hicoll::dev::ReduceJob;

uint16_t gccHalf(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

TEST(Numeric, HalfRoundTripsEveryValue) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = num::halfToFloat(h);
    _Float16 g;
    std::memcpy(&g, &h, 2);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(g)));
      continue;
    }
    ASSERT_EQ(f, static_cast<float>(g)) << std::hex << b;
    ASSERT_EQ(num::floatToHalf(f), h) << std::hex << b;
  }
}

TEST(Numeric, FloatToHalfRoundsLikeTheCompiler) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(num::floatToHalf(f), gccHalf(f)) << std::hex << u;
  }
  EXPECT_EQ(num::floatToHalf(65504.f), 0x7bff);
  EXPECT_EQ(num::floatToHalf(65520.f), 0x7c00);
  EXPECT_EQ(num::floatToHalf(std::ldexp(1.f, -24)), 0x0001);
  EXPECT_EQ(num::floatToHalf(std::ldexp(1.f, -25)), 0x0000);  // a tie rounds to even
}

// The conversion is branch-free (every case computed, one selected): against the compiler's,
// each sign, every float where its cases meet (zero, the smallest half subnormal, the smallest
// normal half, 65504 and the overflow to infinity, the largest floats) and every 97th float of
// the half subnormals between them.
TEST(Numeric, FloatToHalfWhereItsCasesMeet) {
  struct Range {
    uint32_t from, to, step;
  };
  const Range ranges[] = {{0, 0x1000u, 1},
                          {0x32fff000u, 0x33001000u, 1},
                          {0x33001000u, 0x387ff000u, 97},
                          {0x387ff000u, 0x38801000u, 1},
                          {0x477fe000u, 0x47801000u, 1},
                          {0x7f7ff000u, 0x7f800001u, 1}};
  for (const Range& r : ranges)
    for (uint32_t a = r.from; a < r.to; a += r.step)
      for (uint32_t sign : {0u, 0x80000000u}) {
        float f;
        const uint32_t u = a | sign;
        std::memcpy(&f, &u, 4);
        ASSERT_EQ(num::floatToHalf(f), gccHalf(f)) << std::hex << u;
      }
}

TEST(Numeric, Bfloat16) {
  EXPECT_EQ(num::floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(num::bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(num::floatToBf16(1.0f + std::ldexp(1.f, -8)), 0x3f80);
  EXPECT_EQ(num::floatToBf16(1.0f + 3 * std::ldexp(1.f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(num::bf16ToFloat(num::floatToBf16(std::nanf("")))));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = num::bf16ToFloat(static_cast<uint16_t>(b));
    if (!std::isnan(f)) ASSERT_EQ(num::floatToBf16(f), b);
  }
}

template <class T>
std::vector<T> reduce(hcDataType_t dt, num::Op op, std::vector<std::vector<T>> in, bool premul = false,
                      double scalar = 1, int divisor = 0) {
  ReduceJob j;
  j.dtype = dt;
  j.op = op;
  j.nin = static_cast<int>(in.size());
  for (size_t k = 0; k < in.size(); ++k) j.in[k] = in[k].data();
  std::vector<T> out(in[0].size());
  j.out = out.data();
  j.n = out.size();
  j.premul = premul;
  j.scalar = scalar;
  j.divisor = divisor;
  hicoll::dev::hostReduce(j);
  return out;
}

TEST(Numeric, ReductionSemantics) {
  // Integers wrap.
  EXPECT_EQ(reduce<int8_t>(hcInt8, num::Op::Sum, {{100}, {100}})[0], static_cast<int8_t>(-56));
  EXPECT_EQ(reduce<uint8_t>(hcUint8, num::Op::Prod, {{16}, {17}})[0], static_cast<uint8_t>(16));
  EXPECT_EQ(reduce<int64_t>(hcInt64, num::Op::Max, {{-5}, {3}, {2}})[0], 3);
  EXPECT_EQ(reduce<uint32_t>(hcUint32, num::Op::Min, {{5}, {3}, {9}})[0], 3u);
  // Average: the finished sum divided, truncating for integers.
  EXPECT_EQ(reduce<int32_t>(hcInt32, num::Op::Sum, {{-3}, {-4}}, false, 1, 2)[0], -3);
  EXPECT_EQ(reduce<double>(hcFloat64, num::Op::Sum, {{1}, {2}}, false, 1, 2)[0], 1.5);
  // Pre-multiplied sum.
  EXPECT_EQ(reduce<float>(hcFloat32, num::Op::Sum, {{1.5f}, {2.5f}}, true, 0.5)[0], 2.0f);
  EXPECT_EQ(reduce<int32_t>(hcInt32, num::Op::Sum, {{3}, {4}}, true, 3)[0], 21);
  // fp16 accumulates in fp32 and rounds once: 2048 + 1 + 1 = 2050 (pairwise fp16 gives 2048).
  const uint16_t h2048 = num::floatToHalf(2048), h1 = num::floatToHalf(1);
  auto out = reduce<uint16_t>(hcFloat16, num::Op::Sum, {{h2048}, {h1}, {h1}});
  EXPECT_EQ(num::halfToFloat(out[0]), 2050.0f);
  const uint16_t b256 = num::floatToBf16(256), b1 = num::floatToBf16(1);
  auto outb = reduce<uint16_t>(hcBfloat16, num::Op::Sum, {{b256}, {b1}, {b1}});
  EXPECT_EQ(num::bf16ToFloat(outb[0]), 258.0f);
  // The pre-multiplication scalar is the datatype's value of the user's scalar.
  auto p = reduce<uint16_t>(hcFloat16, num::Op::Sum, {{num::floatToHalf(3)}}, true, 0.1);
  EXPECT_EQ(num::halfToFloat(p[0]), num::halfToFloat(num::floatToHalf(3 * num::halfToFloat(num::floatToHalf(0.1f)))));
}

TEST(Numeric, EncodeScalar) {
  unsigned char b[8] = {};
  num::encodeScalar(0.5, hcFloat16, b);
  EXPECT_EQ(b[0], 0x00);
  EXPECT_EQ(b[1], 0x38);
  num::encodeScalar(-3, hcInt64, b);
  int64_t v;
  std::memcpy(&v, b, 8);
  EXPECT_EQ(v, -3);
}

}  // namespace
