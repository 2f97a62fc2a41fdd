// The cost model's terms (plan/cost_model.h) and the model file's parser (base/machine_figures.h).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "base/error.h"
#include "base/machine_figures.h"
#include "base/quant_format.h"
#include "plan/cost_model.h"
#include "plan/plan.h"

namespace {

using namespace hicoll;

MachineFigures figures() {
  MachineFigures m;
  m.call_s = 1e-6;
  m.shm_alpha_s = 2e-6;
  m.copy_Bps = 5e9;
  m.reduce_Bps = 4e9;
  m.net_alpha_s = 40e-6;
  m.net_Bps = 125e6;  // 1 Gbit/s
  m.net_cpu_s_per_B = 0.4e-9;
  m.net_msg_s = 5e-6;
  return m;
}

Shape shape(int N, int L, int host_ranks = 1, int cores = 64) {
  Shape s;
  s.nodes = N;
  s.local = L;
  s.host_ranks = host_ranks;
  s.cores = cores;
  s.chunk = 256 << 10;
  s.window = 4;
  return s;
}

TEST(CostModel, LinkTermsAreTheBytesOverTheBusiestLink) {
  const MachineFigures m = figures();
  const size_t bytes = 64u << 20, b = bytes / 4;
  // 2 x 2: the hierarchical exchange puts L x (N-1) blocks on each node's link, the ring
  // (contiguous ranks: one hop leaves each node) W-1 blocks.
  Prediction h = predict(m, shape(2, 2), hcCollAllGather, Algo::Hier, bytes, false);
  Prediction r = predict(m, shape(2, 2), hcCollAllGather, Algo::Ring, bytes, false);
  EXPECT_DOUBLE_EQ(h.link, 2.0 * b / m.net_Bps);
  EXPECT_DOUBLE_EQ(r.link, 3.0 * b / m.net_Bps);
  EXPECT_STREQ(h.bound(), "link");
  EXPECT_LT(h.total(), r.total());
  // Interleaved ranks: every ring hop leaves its node, two per node.
  Shape inter = shape(2, 2);
  inter.ring_cross = 2;
  EXPECT_DOUBLE_EQ(predict(m, inter, hcCollAllGather, Algo::Ring, bytes, false).link, 6.0 * b / m.net_Bps);
  // ReduceScatter moves the same bytes over the links as the AllGather.
  EXPECT_DOUBLE_EQ(predict(m, shape(2, 2), hcCollReduceScatter, Algo::Hier, bytes, false).link, h.link);
  // One node: no link, no network latency.
  Prediction one = predict(m, shape(1, 4), hcCollAllGather, Algo::Hier, bytes, false);
  EXPECT_EQ(one.link, 0);
  EXPECT_DOUBLE_EQ(one.latency, m.call_s + 2 * m.shm_alpha_s);
  EXPECT_STREQ(one.bound(), "cpu");
}

TEST(CostModel, SmallCallsAreLatencyBoundAndTheRingPaysPerStep) {
  const MachineFigures m = figures();
  Prediction h = predict(m, shape(4, 1), hcCollAllGather, Algo::Hier, 64, false);
  Prediction r = predict(m, shape(4, 1), hcCollAllGather, Algo::Ring, 64, false);
  EXPECT_STREQ(h.bound(), "latency");
  EXPECT_DOUBLE_EQ(h.latency, m.call_s + m.net_alpha_s);      // one hop to every rail peer
  EXPECT_DOUBLE_EQ(r.latency, m.call_s + 3 * m.net_alpha_s);  // W-1 hops in turn
  EXPECT_LT(h.total(), r.total());
}

TEST(CostModel, RanksBeyondTheHostsCoresStretchTheCpuTerm) {
  const MachineFigures m = figures();
  Prediction alone = predict(m, shape(1, 4, 4, 4), hcCollReduceScatter, Algo::Hier, 64u << 20, false);
  Prediction shared = predict(m, shape(1, 4, 4, 2), hcCollReduceScatter, Algo::Hier, 64u << 20, false);
  EXPECT_NEAR(shared.cpu, 2 * alone.cpu, 1e-12);
}

// On the ring only ranks with a neighbour on another node do network work: with contiguous
// ranks one sends and one receives per node, so no rank pays both directions unless it is
// alone on its node (or the ranks are interleaved), and ranks beyond the host's cores share
// the host's work, not each the busiest rank's.
TEST(CostModel, TheRingsNetworkWorkIsOnTheRanksAtTheNodesEnds) {
  const MachineFigures m = figures();
  const size_t bytes = 16u << 20;
  auto ringCpu = [&](const Shape& s) { return predict(m, s, hcCollAllGather, Algo::Ring, bytes, false).cpu; };
  auto terms = [&](int W) {  // a rank's own copies, and one direction of its network work
    const double B = static_cast<double>(bytes / static_cast<size_t>(W)), hops = W - 1;
    const double K = std::ceil(B / (256 << 10));
    return std::pair{(hops + 1) * B / m.copy_Bps, hops * B * m.net_cpu_s_per_B + hops * K * m.net_msg_s};
  };
  const auto [own4, way4] = terms(4);
  EXPECT_NEAR(ringCpu(shape(2, 2)), own4 + way4, 1e-12) << "contiguous: one direction per rank";
  Shape inter = shape(2, 2);
  inter.ring_cross = 2;
  EXPECT_NEAR(ringCpu(inter), own4 + 2 * way4, 1e-12) << "interleaved: every hop leaves the node";
  EXPECT_NEAR(ringCpu(shape(4, 1)), own4 + 2 * way4, 1e-12) << "a rank alone on its node: both";
  // 4 ranks on 2 cores: the host's work (4 ranks' copies, 2 nodes' two directions) over 2 cores.
  EXPECT_NEAR(ringCpu(shape(2, 2, 4, 2)), (4 * own4 + 4 * way4) / 2, 1e-12);
  const auto [own8, way8] = terms(8);
  EXPECT_NEAR(ringCpu(shape(2, 4, 8, 2)), (8 * own8 + 4 * way8) / 2, 1e-12);
  EXPECT_NEAR(ringCpu(shape(2, 4)), own8 + way8, 1e-12) << "enough cores: the busiest rank";
}

TEST(CostModel, AllReduceSplitsTradeLatencyForBytes) {
  const MachineFigures m = figures();
  const Shape s = shape(2, 2);
  // Tiny buffers: the latency path's one exchange beats RS + AG's two; large buffers: RS + AG
  // moves 2 (W-1)/W of the buffer instead of W times it.
  EXPECT_LT(predict(m, s, hcCollAllReduce, Algo::Hier, 256, false, true).total(),
            predict(m, s, hcCollAllReduce, Algo::Hier, 256, false, false).total());
  EXPECT_GT(predict(m, s, hcCollAllReduce, Algo::Hier, 1u << 20, false, true).total(),
            predict(m, s, hcCollAllReduce, Algo::Hier, 1u << 20, false, false).total());
  // RS + AG is the two phases in turn.
  const size_t bytes = 16u << 20;
  const double rs = predict(m, s, hcCollReduceScatter, Algo::Hier, bytes, false).total();
  const double ag = predict(m, s, hcCollAllGather, Algo::Hier, bytes, true).total();
  EXPECT_NEAR(predict(m, s, hcCollAllReduce, Algo::Hier, bytes, false).total(), rs + ag, 1e-12);
}

TEST(CostModel, WindowCoversTheRoundTrip) {
  MachineFigures m = figures();
  Shape s = shape(2, 2);
  EXPECT_EQ(modelWindow(m, s, 4), 4u) << "1 Gbit/s, 40 us: a chunk covers each flow's share";
  m.net_Bps = 400e9 / 8;  // 400 Gbit/s, 15 us
  m.net_alpha_s = 15e-6;
  s.local = 1;
  // 2 x 15 us x 50 GB/s = 1.5 MB in flight on one flow: 6 chunks of 256 KiB, plus one.
  EXPECT_EQ(modelWindow(m, s, 4), 7u);
  EXPECT_EQ(modelWindow(m, shape(1, 4), 4), 4u) << "no network";
}

// The chunk leaves the measured default only for a prediction kChunkGain faster, each chunk
// with its own window.
TEST(CostModel, ChunkGrowsOnlyForAPredictedGain) {
  const MachineFigures m = figures();
  const Shape s = shape(2, 2);
  auto scripted = [](std::map<size_t, double> totals) {
    return [totals](const Shape& at) {
      Prediction p;
      p.link = totals.at(at.chunk);
      return p;
    };
  };
  const size_t K = 1024;
  // 512 KiB is 0.5 % faster (not enough), 1 MiB 1.5 %: 1 MiB.
  EXPECT_EQ(modelChunking(m, s, 1024 * K, false, scripted({{256 * K, 1.0}, {512 * K, 0.995}, {1024 * K, 0.985}})).chunk,
            1024 * K);
  EXPECT_EQ(modelChunking(m, s, 1024 * K, false, scripted({{256 * K, 1.0}, {512 * K, 0.995}, {1024 * K, 0.992}})).chunk,
            256 * K);
  // Never above the cap, nor below the floor when the cap is smaller.
  EXPECT_EQ(modelChunking(m, s, 512 * K, false, scripted({{256 * K, 1.0}, {512 * K, 0.9}})).chunk, 512 * K);
  EXPECT_EQ(modelChunking(m, s, 64 * K, false, scripted({{256 * K, 1.0}})).chunk, 256 * K);
  // The window is the chunk's own: fixed, or from modelWindow.
  EXPECT_EQ(modelChunking(m, s, 1024 * K, false, scripted({{256 * K, 1.0}, {512 * K, 0.9}, {1024 * K, 0.8}})).window,
            4u);
  MachineFigures fast = m;
  fast.net_Bps = 400e9 / 8;
  fast.net_alpha_s = 15e-6;
  Shape at = s;
  at.chunk = 1024 * K;
  EXPECT_EQ(modelChunking(fast, s, 1024 * K, true, scripted({{256 * K, 1.0}, {512 * K, 0.9}, {1024 * K, 0.8}})).window,
            modelWindow(fast, at, 4));
}

// With the model's own terms: on a 1 Gbit/s link the link bounds a large call and the measured
// default stays; on a 400 Gbit/s link each rank's per-message work bounds it, and fewer,
// larger messages are predicted faster.
TEST(CostModel, ChunkFollowsThePerMessageWork) {
  MachineFigures m = figures();
  m.net_msg_s = 15e-6;
  const Shape s = shape(2, 2);
  const size_t bytes = 64u << 20, cap = 4u << 20;
  auto hier = [&](const MachineFigures& f) {
    return [&f, bytes](const Shape& at) { return predict(f, at, hcCollAllGather, Algo::Hier, bytes, false); };
  };
  const Chunking slow = modelChunking(m, s, cap, true, hier(m));
  EXPECT_EQ(slow.chunk, s.chunk);
  EXPECT_STREQ(slow.predicted.bound(), "link");
  MachineFigures fast = m;
  fast.net_Bps = 400e9 / 8;
  fast.net_alpha_s = 15e-6;
  fast.net_cpu_s_per_B = 0;
  fast.copy_Bps = 100e9;
  const Chunking big = modelChunking(fast, s, cap, true, hier(fast));
  EXPECT_GT(big.chunk, s.chunk);
  const Prediction at_floor = predict(fast, s, hcCollAllGather, Algo::Hier, bytes, false);
  EXPECT_STREQ(at_floor.bound(), "cpu");
  EXPECT_LT(big.predicted.total(), (1 - kChunkGain) * at_floor.total());
}

TEST(CostModel, QuantizedAllGatherMovesTheImagesAndPaysForTheCompute) {
  MachineFigures m = figures();
  m.quant_Bps = 2e9;
  const Shape s = shape(2, 2);
  const size_t n = 4u << 20, bytes = 4 * n * 4;  // 4 M fp32 elements per rank
  const double image = static_cast<double>(quant::packedBytes(n, 256));
  const Prediction exact = predict(m, s, hcCollAllGather, Algo::Hier, bytes, false);
  const Prediction q = predictQuantized(m, s, hcCollAllGather, Algo::Hier, bytes, false, 4, 256);
  // The links carry the images: L x (N-1) of them per node.
  EXPECT_DOUBLE_EQ(q.link, 2 * image / m.net_Bps);
  // Quantizing the own block and dequantizing all four, pipelined with the gather.
  const double compute = 5.0 * n * 4 / m.quant_Bps;
  const Prediction wire = predict(m, s, hcCollAllGather, Algo::Hier, static_cast<size_t>(image) * 4, true);
  EXPECT_NEAR(q.cpu, wire.cpu + compute, 1e-12);
  EXPECT_NEAR(q.fill, wire.fill + 2 * compute / static_cast<double>(quant::numPieces(n, 256)), 1e-12);
  EXPECT_LT(q.total(), exact.total() / 3) << "1 Gbit/s: a quarter of the bytes";
  // One node: the same compute and no link to save on.
  EXPECT_GT(predictQuantized(m, shape(1, 2), hcCollAllGather, Algo::Hier, bytes / 2, false, 4, 256).total(),
            predict(m, shape(1, 2), hcCollAllGather, Algo::Hier, bytes / 2, false).total());
  // A small call is one piece: nothing overlaps its compute.
  const Prediction small = predictQuantized(m, s, hcCollAllGather, Algo::Hier, 4 * 1024 * 4, false, 4, 256);
  EXPECT_NEAR(small.after, 5.0 * 1024 * 4 / m.quant_Bps, 1e-15);
}

TEST(CostModel, QuantizedReduceScatterShrinksWhatCrossesTheLinks) {
  MachineFigures m = figures();
  m.quant_Bps = 2e9;
  const size_t n = 4u << 20, bytes = 4 * n * 2;  // bf16
  const Prediction exact = predict(m, shape(2, 2), hcCollReduceScatter, Algo::Hier, bytes, false);
  const Prediction q = predictQuantized(m, shape(2, 2), hcCollReduceScatter, Algo::Hier, bytes, false, 2, 256);
  EXPECT_NEAR(q.link, exact.link * static_cast<double>(quant::packedBytes(n, 256)) / (2.0 * n), 1e-12);
  EXPECT_GT(q.cpu, exact.cpu) << "the codes and the fp32 values cost more than the bytes saved";
  // The ring, and one node, run it exactly.
  EXPECT_EQ(predictQuantized(m, shape(2, 2), hcCollReduceScatter, Algo::Ring, bytes, false, 2, 256).total(),
            predict(m, shape(2, 2), hcCollReduceScatter, Algo::Ring, bytes, false).total());
  EXPECT_EQ(predictQuantized(m, shape(1, 4), hcCollReduceScatter, Algo::Hier, bytes, false, 2, 256).total(),
            predict(m, shape(1, 4), hcCollReduceScatter, Algo::Hier, bytes, false).total());
}

TEST(CostModel, AllToAllSendsEveryRemoteBlockOnce) {
  const MachineFigures m = figures();
  const size_t bytes = 16u << 20, b = bytes / 4;  // what one rank sends, a quarter to each rank
  const Prediction p = predict(m, shape(2, 2), hcCollAllToAll, Algo::Ring, bytes, false);
  // 2 x 2: each of the node's 2 ranks sends 2 blocks to the other node.
  EXPECT_DOUBLE_EQ(p.link, 4.0 * b / m.net_Bps);
  EXPECT_STREQ(p.bound(), "link");
  EXPECT_EQ(p.total(), predict(m, shape(2, 2), hcCollAllToAll, Algo::Hier, bytes, false).total()) << "one path";
  // One node: the own block and the peer's, copied once each.
  const Prediction one = predict(m, shape(1, 2), hcCollAllToAll, Algo::Ring, bytes / 2, false);
  EXPECT_EQ(one.link, 0);
  EXPECT_DOUBLE_EQ(one.cpu, 2.0 * (bytes / 4) / m.copy_Bps);
}

TEST(ModelFile, RoundTripsAndNamesWhatIsWrong) {
  const MachineFigures m = figures();
  const MachineFigures back = parseFigures(figuresJson(m, "test"), "t.json");
  EXPECT_EQ(back.net_Bps, m.net_Bps);
  EXPECT_EQ(back.net_cpu_s_per_B, m.net_cpu_s_per_B);
  EXPECT_EQ(back.source, "t.json");
  auto error = [](const std::string& text) {
    try {
      parseFigures(text, "f.json");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), hcInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string good = figuresJson(m);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  EXPECT_NE(error("{").find("f.json: not JSON"), std::string::npos);
  EXPECT_NE(error("[1]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error(with("\"version\": 1", "\"version\": 2")).find("version 2"), std::string::npos);
  EXPECT_NE(error(with("\"net_Bps\"", "\"net_bps\"")).find("no field 'net_Bps'"), std::string::npos);
  EXPECT_NE(error(with("\"call_s\": 1e-06", "\"call_s\": \"fast\"")).find("'call_s' is not a number"),
            std::string::npos);
  EXPECT_NE(error(with("\"copy_Bps\": 5000000000.0", "\"copy_Bps\": 0")).find("'copy_Bps' = 0 is out of range"),
            std::string::npos);
  EXPECT_NE(error(with("\"call_s\": 1e-06", "\"call_s\": -1")).find("'call_s' = -1"), std::string::npos);
  EXPECT_NE(error(with("\"version\": 1", "\"version\": 1, \"extra\": 3")).find("unknown field 'extra'"),
            std::string::npos);
  EXPECT_NE(error("{}").find("version 0"), std::string::npos);
  // quant_Bps came later: a file without it keeps the default.
  std::string old = good;
  const size_t at = old.find(",\n  \"quant_Bps\"");
  ASSERT_NE(at, std::string::npos) << old;
  old.erase(at, old.find('\n', at + 2) - at);
  EXPECT_EQ(parseFigures(old, "old.json").quant_Bps, MachineFigures{}.quant_Bps) << old;
  EXPECT_NE(error(with("\"quant_Bps\": 4000000000.0", "\"quant_Bps\": 0")).find("'quant_Bps' = 0 is out of range"),
            std::string::npos);
}

}  // namespace
