#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "algorithms/reduce.h"
#include "base/error.h"
#include "base/numeric.h"

namespace hicoll {
namespace {

TEST(Convert, EveryHalfRoundTripsAndMatchesTheCompiler) {
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 ref;
    uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&ref, &bits, 2);
    float f = num::halfToFloat(bits);
    if (std::isnan(static_cast<float>(ref))) {
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(f, static_cast<float>(ref)) << h;
    ASSERT_EQ(num::floatToHalf(f), bits) << h;
  }
}

TEST(Convert, FloatToHalfRoundsToNearestEven) {
  for (float f : {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65519.0f, 65520.0f, 1e-8f, 6.0e-5f, -3.1f, 1e9f}) {
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &ref, 2);
    EXPECT_EQ(num::floatToHalf(f), bits) << f;
  }
}

TEST(Convert, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(num::floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(num::bf16ToFloat(num::floatToBf16(3.0f)), 3.0f);
  float halfway;
  uint32_t x = 0x3f808000;  // exactly between 0x3f80 and 0x3f81: ties to even
  std::memcpy(&halfway, &x, 4);
  EXPECT_EQ(num::floatToBf16(halfway), 0x3f80);
  x = 0x3f818000;
  std::memcpy(&halfway, &x, 4);
  EXPECT_EQ(num::floatToBf16(halfway), 0x3f82);
}

TEST(Reduce, OpsOverManySources) {
  const int n = 1000, k = 5;
  std::vector<std::vector<int32_t>> src(k, std::vector<int32_t>(n));
  std::vector<const void*> p;
  for (int s = 0; s < k; ++s) {
    for (int i = 0; i < n; ++i) src[s][i] = (i * 7 + s * 13) % 11 - 5;
    p.push_back(src[s].data());
  }
  for (OpKind op : {OpKind::Sum, OpKind::Prod, OpKind::Max, OpKind::Min, OpKind::Avg, OpKind::PreMulSum}) {
    ReduceSpec spec;
    spec.dtype = hcInt32;
    spec.kind = op;
    spec.scalar = 3;
    spec.premul_mask = ~0ull;
    spec.avg_divisor = k;
    std::vector<int32_t> out(n);
    reduceN(spec, out.data(), p.data(), k, n);
    for (int i = 0; i < n; ++i) {
      int64_t want = src[0][i];
      for (int s = 1; s < k; ++s) {
        int64_t v = src[s][i];
        switch (op) {
          case OpKind::Prod: want *= v; break;
          case OpKind::Max: want = std::max(want, v); break;
          case OpKind::Min: want = std::min(want, v); break;
          default: want += v;
        }
      }
      if (op == OpKind::Avg) want /= k;
      if (op == OpKind::PreMulSum) want *= 3;
      ASSERT_EQ(out[i], want) << "op " << static_cast<int>(op) << " element " << i;
    }
  }
}

TEST(Reduce, HalfAccumulatesInFloat) {
  // 2048 + 1 + 1 is 2050 in fp32 but stays 2048 if each step rounds to fp16 (spacing 2).
  std::vector<uint16_t> a{num::floatToHalf(2048)}, b{num::floatToHalf(1)}, c{num::floatToHalf(1)}, out(1);
  const void* srcs[] = {a.data(), b.data(), c.data()};
  ReduceSpec spec;
  spec.dtype = hcFloat16;
  reduceN(spec, out.data(), srcs, 3, 1);
  EXPECT_EQ(num::halfToFloat(out[0]), 2050.0f);
}

TEST(Reduce, PremulOnlyScalesMarkedSources) {
  std::vector<float> in{2}, partial{10}, out(1);
  const void* srcs[] = {in.data(), partial.data()};
  ReduceSpec spec;
  spec.kind = OpKind::PreMulSum;
  spec.scalar = 0.5;
  spec.premul_mask = 1;
  reduceN(spec, out.data(), srcs, 2, 1);
  EXPECT_EQ(out[0], 11.0f);
}

// Each product is rounded before it is added, on every copy of the kernel (base/kernel_clones.h):
// a fused multiply-add would keep y * s's low bits, and ranks on CPUs with and without FMA, or
// the device, would sum differently. -1 + (1 + e)(1 + e) is 2e rounded that way, 2e + e^2 fused.
TEST(Reduce, APreMulSumRoundsEachProductBeforeItsSum) {
  auto check = [](auto one, double e, hcDataType_t dtype) {
    using T = decltype(one);
    const size_t n = 4099;  // the vector loops and their tails
    std::vector<T> acc(n, T(-1)), in(n, static_cast<T>(1 + e)), out(n);
    const void* srcs[] = {acc.data(), in.data()};
    ReduceSpec spec;
    spec.dtype = dtype;
    spec.kind = OpKind::PreMulSum;
    spec.scalar = 1 + e;
    spec.premul_mask = 2;  // the second source is an input, the first a partial sum
    reduceN(spec, out.data(), srcs, 2, n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], static_cast<T>(2 * e)) << dtypeName(dtype) << " element " << i;
  };
  check(1.0f, std::ldexp(1.0, -12), hcFloat32);
  check(1.0, std::ldexp(1.0, -27), hcFloat64);
}

TEST(Reduce, IntegerSumsWrap) {
  std::vector<int8_t> a{100}, b{100}, out(1);
  const void* srcs[] = {a.data(), b.data()};
  ReduceSpec spec;
  spec.dtype = hcInt8;
  reduceN(spec, out.data(), srcs, 2, 1);
  EXPECT_EQ(out[0], static_cast<int8_t>(200));
}

// Bitwise and / or / xor on every integer type: edge values (0, all ones, the type's minimum
// and maximum, alternating bits) and mixed bit patterns, 1 to 64 sources, several blocks and
// a ragged tail, in place, with streamed stores; against the integer operators.
template <class T>
void checkBitwise(hcDataType_t dt) {
  const size_t n = 3 * 512 + 77;
  const T edges[] = {T(0),
                     T(~T(0)),
                     std::numeric_limits<T>::min(),
                     std::numeric_limits<T>::max(),
                     T(1),
                     T(0x5555555555555555ull),
                     T(0xaaaaaaaaaaaaaaaaull)};
  const size_t ne = sizeof(edges) / sizeof(edges[0]);
  for (int k : {1, 2, 3, 7, 64}) {
    std::vector<std::vector<T>> src(static_cast<size_t>(k), std::vector<T>(n));
    uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(k);
    for (int s = 0; s < k; ++s)
      for (size_t i = 0; i < n; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        // The first elements pair every edge value with every other; then random bits.
        src[s][i] = i < ne * ne ? edges[(s == 0 ? i / ne : i % ne)] : static_cast<T>(x);
        if (i < ne * ne && s > 1) src[s][i] = edges[(i + static_cast<size_t>(s)) % ne] | src[1][i];
      }
    for (OpKind op : {OpKind::Band, OpKind::Bor, OpKind::Bxor}) {
      std::vector<T> want(n);
      for (size_t i = 0; i < n; ++i) {
        T w = src[0][i];
        for (int s = 1; s < k; ++s)
          w = op == OpKind::Band ? T(w & src[s][i]) : op == OpKind::Bor ? T(w | src[s][i]) : T(w ^ src[s][i]);
        want[i] = w;
      }
      for (int mode = 0; mode < 3; ++mode) {  // out of place, streamed, in place (dst = srcs[0])
        std::vector<std::vector<T>> in = src;
        std::vector<const void*> p;
        for (auto& v : in) p.push_back(v.data());
        std::vector<T> out(n, T(0x3c));
        T* dst = mode == 2 ? in[0].data() : out.data();
        ReduceSpec spec;
        spec.dtype = dt;
        spec.kind = op;
        spec.stream_dst = mode == 1;
        spec.avg_divisor = 3;  // only Avg divides
        spec.premul_mask = ~0ull;
        spec.scalar = 5;  // only PreMulSum scales
        reduceN(spec, dst, p.data(), k, n);
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(static_cast<uint64_t>(dst[i]), static_cast<uint64_t>(want[i]))
              << dtypeName(dt) << " " << opName(op) << " of " << k << " sources, mode " << mode << ", element " << i;
      }
    }
  }
}

TEST(Reduce, BitwiseOpsOnEveryIntegerType) {
  checkBitwise<int8_t>(hcInt8);
  checkBitwise<uint8_t>(hcUint8);
  checkBitwise<int32_t>(hcInt32);
  checkBitwise<uint32_t>(hcUint32);
  checkBitwise<int64_t>(hcInt64);
  checkBitwise<uint64_t>(hcUint64);
}

// uint8 0/1 as bool: and, or, parity (what torch's BAND / BOR / BXOR of bool tensors give).
TEST(Reduce, BitwiseOnBoolsIsLogical) {
  for (int bits = 0; bits < 16; ++bits) {
    std::vector<std::vector<uint8_t>> in(4, std::vector<uint8_t>(1));
    std::vector<const void*> p;
    int ones = 0;
    for (int s = 0; s < 4; ++s) {
      in[s][0] = (bits >> s) & 1;
      ones += in[s][0];
      p.push_back(in[s].data());
    }
    for (OpKind op : {OpKind::Band, OpKind::Bor, OpKind::Bxor}) {
      ReduceSpec spec;
      spec.dtype = hcUint8;
      spec.kind = op;
      uint8_t out = 7;
      reduceN(spec, &out, p.data(), 4, 1);
      const int want = op == OpKind::Band ? ones == 4 : op == OpKind::Bor ? ones > 0 : ones % 2;
      EXPECT_EQ(out, want) << opName(op) << " of " << bits;
    }
  }
}

// The device path's arithmetic (num::apply, the CUDA kernels' and the host streams'), the same
// operators.
TEST(Reduce, DeviceArithmeticBitwise) {
  EXPECT_EQ(num::apply<int8_t>(num::Op::Band, int8_t(-128), int8_t(-1)), int8_t(-128));
  EXPECT_EQ(num::apply<int8_t>(num::Op::Bor, int8_t(0x40), int8_t(-128)), int8_t(-64));
  EXPECT_EQ(num::apply<int8_t>(num::Op::Bxor, int8_t(-1), int8_t(0x0f)), int8_t(-16));
  EXPECT_EQ(num::apply<uint8_t>(num::Op::Bxor, uint8_t(0xff), uint8_t(0x0f)), uint8_t(0xf0));
  EXPECT_EQ(num::apply<int32_t>(num::Op::Band, INT32_MIN, -1), INT32_MIN);
  EXPECT_EQ(num::apply<uint32_t>(num::Op::Bor, 0x80000000u, 1u), 0x80000001u);
  EXPECT_EQ(num::apply<int64_t>(num::Op::Bxor, INT64_MIN, INT64_MAX), int64_t(-1));
  EXPECT_EQ(num::apply<uint64_t>(num::Op::Band, ~0ull, 0x8000000000000001ull), 0x8000000000000001ull);
}

// The API refuses bitwise ops on floating types; the reduction itself refuses them too, rather
// than computing something.
TEST(Reduce, BitwiseOnFloatingTypesIsRefused) {
  for (hcDataType_t t : {hcFloat16, hcBfloat16, hcFloat32, hcFloat64}) {
    std::vector<double> a(1, 1.0), out(1);
    const void* srcs[] = {a.data(), a.data()};
    ReduceSpec spec;
    spec.dtype = t;
    spec.kind = OpKind::Bor;
    EXPECT_THROW(reduceN(spec, out.data(), srcs, 2, 1), Error) << dtypeName(t);
  }
}

// Non-temporal stores write what plain stores write, on aligned and unaligned destinations and
// on a tail that is not a whole block.
TEST(Reduce, StreamedDestinationMatchesPlainStores) {
  const size_t n = 5 * 512 + 77;
  for (hcDataType_t t : {hcFloat32, hcBfloat16, hcFloat64, hcInt8}) {
    const size_t es = t == hcFloat64 ? 8 : t == hcFloat32 ? 4 : t == hcInt8 ? 1 : 2;
    std::vector<uint8_t> a(n * es), b(n * es), plain(n * es + 64), streamed(n * es + 64, 0xee);
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<uint8_t>(i * 7 + 3);
      b[i] = static_cast<uint8_t>(i * 13 + 1) & 0x3f;  // keeps bf16 and doubles finite
    }
    const void* srcs[] = {a.data(), b.data()};
    for (size_t offset : {size_t{0}, es}) {  // aligned start (malloc: 16 bytes), then misaligned
      ReduceSpec spec;
      spec.dtype = t;
      reduceN(spec, plain.data() + offset, srcs, 2, n);
      spec.stream_dst = true;
      reduceN(spec, streamed.data() + offset, srcs, 2, n);
      EXPECT_EQ(0, std::memcmp(plain.data() + offset, streamed.data() + offset, n * es))
          << "dtype " << t << " offset " << offset;
    }
  }
}

}  // namespace
}  // namespace hicoll
