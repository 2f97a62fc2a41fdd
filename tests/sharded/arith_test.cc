// Tier 1 (no peers): the sharding arithmetic, option checks, conversions and the AdamW kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "hicoll/sharded.hpp"
#include "sharded/convert.h"

namespace sh = hicoll::sharded;

TEST(ShardInfo, PadsToDegreeTimesAlignment) {
  const sh::ShardInfo s = sh::ShardInfo::make(10, 4, 1);
  EXPECT_EQ(s.padded, 12u);
  EXPECT_EQ(s.shard, 3u);
  EXPECT_EQ(s.padding(), 2u);
  EXPECT_EQ(s.begin(), 3u);
  EXPECT_EQ(s.end(), 6u);

  const sh::ShardInfo a = sh::ShardInfo::make(10, 4, 0, 16);
  EXPECT_EQ(a.padded, 64u);
  EXPECT_EQ(a.shard, 16u);

  const sh::ShardInfo exact = sh::ShardInfo::make(12, 4, 3);
  EXPECT_EQ(exact.padded, 12u);
  EXPECT_EQ(exact.padding(), 0u);
}

TEST(ShardInfo, ShardsTileTheFlatBufferExactly) {
  for (size_t numel : {0ul, 1ul, 2ul, 7ul, 64ul, 1000ul, 1001ul, 4097ul})
    for (int degree : {1, 2, 3, 4, 8})
      for (size_t align : {1ul, 16ul}) {
        size_t real = 0, next = 0;
        for (int r = 0; r < degree; ++r) {
          const sh::ShardInfo s = sh::ShardInfo::make(numel, degree, r, align);
          EXPECT_EQ(s.begin(), next);
          EXPECT_EQ(s.shard % align, 0u);
          EXPECT_LT(s.padding(), static_cast<size_t>(degree) * align);
          real += s.realCount();
          next = s.end();
        }
        EXPECT_EQ(real, numel) << numel << " over " << degree;
        EXPECT_EQ(next, sh::ShardInfo::make(numel, degree, 0, align).padded);
      }
}

TEST(ShardInfo, UnevenSizesLeavePaddingInTheLastShards) {
  // 10 elements over 4 ranks: shards of 3, rank 3 holds one real element and two padding.
  EXPECT_EQ(sh::ShardInfo::make(10, 4, 0).realCount(), 3u);
  EXPECT_EQ(sh::ShardInfo::make(10, 4, 3).realCount(), 1u);
  // 5 over 4: shards of 2; rank 3 holds only padding.
  EXPECT_EQ(sh::ShardInfo::make(5, 4, 2).realCount(), 1u);
  EXPECT_EQ(sh::ShardInfo::make(5, 4, 3).realCount(), 0u);
  EXPECT_EQ(sh::ShardInfo::make(0, 4, 0).shard, 0u);
}

TEST(ShardInfo, OverlapOfAParameterWithAShard) {
  const sh::ShardInfo s = sh::ShardInfo::make(100, 4, 1);  // [25, 50)
  auto o = s.overlap(20, 30);
  EXPECT_EQ(o.flat, 25u);
  EXPECT_EQ(o.local, 0u);
  EXPECT_EQ(o.count, 5u);
  o = s.overlap(30, 40);
  EXPECT_EQ(o.local, 5u);
  EXPECT_EQ(o.count, 10u);
  o = s.overlap(45, 80);
  EXPECT_EQ(o.count, 5u);
  EXPECT_EQ(s.overlap(0, 25).count, 0u);
  EXPECT_EQ(s.overlap(50, 60).count, 0u);
  EXPECT_EQ(s.overlap(10, 90).count, 25u);
}

TEST(ShardInfo, BucketsCoverTheShardWithinTheSizeLimit) {
  const sh::ShardInfo s = sh::ShardInfo::make(1000, 4, 2);  // shard of 250
  auto b = s.buckets(400);                                  // 100 columns per bucket
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].local, 0u);
  EXPECT_EQ(b[0].count, 100u);
  EXPECT_EQ(b[1].local, 100u);
  EXPECT_EQ(b[2].local, 200u);
  EXPECT_EQ(b[2].count, 50u);  // the remainder
  for (auto x : b) EXPECT_LE(x.count * 4, 400u);

  auto one = s.buckets(1000);  // exactly degree * shard: one bucket
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].count, 250u);
  EXPECT_EQ(s.buckets(5e8).size(), 1u);

  auto tiny = s.buckets(4);  // one element per rank per call
  EXPECT_EQ(tiny.size(), 250u);
  EXPECT_EQ(tiny.back().local, 249u);
  auto odd = s.buckets(7);  // 7/4 = 1 column
  EXPECT_EQ(odd.size(), 250u);

  EXPECT_THROW(s.buckets(3), sh::Error);  // less than one element per rank
  EXPECT_TRUE(sh::ShardInfo::make(0, 4, 0).buckets(8).empty());
}

TEST(Plan, PersistenceThresholdKeepsSmallParametersReplicated) {
  std::vector<sh::UnitSpec> units = {
      {"a", {{"w", {8, 8}}, {"b", {8}, false}, {"w2", {3, 5}}}},
      {"b", {{"ln", {4}, false}, {"m", {10, 10}}}},
  };
  auto plans = sh::planUnits(units, 16, 4, 1, 1);
  ASSERT_EQ(plans.size(), 2u);
  // Unit a: w (64) and... w2 (15 < 16) persistent, b (8) persistent.
  EXPECT_FALSE(plans[0].params[0].persistent);
  EXPECT_EQ(plans[0].params[0].offset, 0u);
  EXPECT_TRUE(plans[0].params[1].persistent);
  EXPECT_EQ(plans[0].params[1].offset, 0u);
  EXPECT_TRUE(plans[0].params[2].persistent);
  EXPECT_EQ(plans[0].params[2].offset, 8u);
  EXPECT_EQ(plans[0].persistent_begin, 0u);
  EXPECT_EQ(plans[0].persistent_numel, 23u);
  EXPECT_EQ(plans[0].shard.numel, 64u);
  EXPECT_EQ(plans[0].shard.shard, 16u);
  // Unit b continues the persistent buffer; a parameter exactly at the threshold is sharded.
  EXPECT_EQ(plans[1].persistent_begin, 23u);
  EXPECT_TRUE(plans[1].params[0].persistent);
  EXPECT_EQ(plans[1].params[0].offset, 23u);
  EXPECT_EQ(plans[1].params[1].offset, 0u);
  EXPECT_EQ(plans[1].shard.numel, 100u);

  auto exact = sh::planUnits({{"u", {{"p", {16}}}}}, 16, 2, 0, 1);
  EXPECT_FALSE(exact[0].params[0].persistent);
  auto none = sh::planUnits(units, 0, 2, 0, 1);  // threshold 0: everything sharded
  for (const auto& p : none)
    for (const auto& pl : p.params) EXPECT_FALSE(pl.persistent);
  auto all = sh::planUnits(units, 1000000, 2, 0, 1);  // the seed's default: all replicated
  EXPECT_EQ(all[0].shard.numel, 0u);
  EXPECT_EQ(all[1].persistent_begin + all[1].persistent_numel, 64u + 8 + 15 + 4 + 100);
}

TEST(Plan, FlatOffsetsDoNotDependOnTheDegree) {
  std::vector<sh::UnitSpec> units = {{"u", {{"x", {33}}, {"y", {7, 3}}, {"z", {100}}}}};
  for (int d : {1, 2, 3, 4, 8}) {
    auto p = sh::planUnits(units, 1, d, 0, 16)[0];
    EXPECT_EQ(p.params[1].offset, 33u);
    EXPECT_EQ(p.params[2].offset, 54u);
    EXPECT_EQ(p.shard.numel, 154u);
  }
}

TEST(Options, InvalidValuesAreNamed) {
  sh::Options o;
  EXPECT_NO_THROW(sh::validate(o, 4));
  o.sharded_data_parallel_degree = 3;
  try {
    sh::validate(o, 4);
    FAIL() << "degree 3 of world 4 accepted";
  } catch (const sh::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("sharded_data_parallel_degree=3"), std::string::npos) << m;
    EXPECT_NE(m.find("1, 2, 4"), std::string::npos) << m;
  }
  o.sharded_data_parallel_degree = 0;
  EXPECT_THROW(sh::validate(o, 4), sh::Error);
  o.sharded_data_parallel_degree = 4;
  o.sdp_reduce_bucket_size = 3;
  EXPECT_THROW(sh::validate(o, 4), sh::Error);
  o.sdp_reduce_bucket_size = 4;
  EXPECT_NO_THROW(sh::validate(o, 4));
  o.sdp_gradient_clipping = -1;
  EXPECT_THROW(sh::validate(o, 4), sh::Error);
  o.sdp_gradient_clipping = 0;
  o.sdp_max_live_parameters = 0;
  EXPECT_THROW(sh::validate(o, 4), sh::Error);
  o.sdp_max_live_parameters = 1;
  o.memory = sh::MemoryKind::Device;
  EXPECT_THROW(sh::validate(o, 4), sh::Error);
  EXPECT_THROW(sh::parseDType("fp8"), sh::Error);
  EXPECT_EQ(sh::parseDType("bf16"), sh::DType::BFloat16);
}

TEST(Convert, Bf16AndFp16RoundToNearestEven) {
  EXPECT_EQ(sh::floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(sh::bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 lies halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(sh::floatToBf16(1.00390625f), 0x3f80);
  EXPECT_EQ(sh::floatToBf16(1.01171875f), 0x3f82);  // 1 + 3*2^-8: ties up to the even 0x3f82
  EXPECT_TRUE(std::isnan(sh::bf16ToFloat(sh::floatToBf16(NAN))));
  EXPECT_EQ(sh::floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(sh::halfToFloat(sh::floatToHalf(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(sh::halfToFloat(sh::floatToHalf(70000.0f))));
  std::vector<float> x = {0.1f, -2.5f, 3.0f}, acc = {1, 1, 1};
  std::vector<uint16_t> h(3);
  sh::fromFloat(sh::DType::BFloat16, x.data(), h.data(), 3);
  sh::accumulate(sh::DType::BFloat16, h.data(), 0.5f, acc.data(), 3);
  EXPECT_NEAR(acc[0], 1.05, 1e-3);
  EXPECT_FLOAT_EQ(acc[1], -0.25f);
  EXPECT_FLOAT_EQ(acc[2], 2.5f);
}

TEST(AdamW, MatchesTheTextbookUpdateInDouble) {
  const size_t n = 5;
  std::vector<float> p = {0.5f, -1.0f, 0.0f, 2.0f, 1e-3f}, m(n, 0), v(n, 0);
  std::vector<double> pd(p.begin(), p.end()), md(n, 0), vd(n, 0);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, clip = 0.5;
  for (int t = 1; t <= 20; ++t) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>(std::sin(t * 0.7 + i) * (i + 1));
    sh::AdamWStep st{lr, b1, b2, eps, wd, 1 - std::pow(b1, t), 1 - std::pow(b2, t), static_cast<float>(clip)};
    sh::adamw(st, p.data(), m.data(), v.data(), g.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const double gi = g[i] * clip;
      pd[i] *= 1 - lr * wd;
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      const double mh = md[i] / (1 - std::pow(b1, t)), vh = vd[i] / (1 - std::pow(b2, t));
      pd[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], pd[i], 1e-5 * (1 + std::fabs(pd[i]))) << i;
}
