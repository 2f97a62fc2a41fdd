#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "algorithms/reduce.h"
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

TEST(Reduce, IntegerSumsWrap) {
  std::vector<int8_t> a{100}, b{100}, out(1);
  const void* srcs[] = {a.data(), b.data()};
  ReduceSpec spec;
  spec.dtype = hcInt8;
  reduceN(spec, out.data(), srcs, 2, 1);
  EXPECT_EQ(out[0], static_cast<int8_t>(200));
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
