// hcAllGatherQuantized on the device path without a GPU: the engine's schedule (quantize on
// the stream, the images gathered, every image dequantized) on host streams, checked bit for
// bit against the host quantizer: every rank holds dequantize(quantize(block of rank j)) for
// every j, NaN, infinities, zero blocks and tails included.
#include <gtest/gtest.h>

#include <cstring>

#include <fmt/format.h>

#include "algorithms/quantize.h"
#include "engine_rig.h"

namespace {

using hctest::EngineRig;
using hctest::HostStream;
using hctest::RigOptions;

struct Layout {
  const char* name;
  std::vector<std::string> labels;
};

class DeviceQuantizedLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(DeviceQuantizedLayouts, AllGatherHoldsTheHostQuantizersBitsOnEveryRank) {
  RigOptions opt;
  opt.chunk = 512;  // images of several chunks: the rings wrap
  EngineRig rig(GetParam().labels, opt);
  const int W = rig.size();
  struct Shape {
    hcDataType_t dt;
    size_t count, block;
    bool in_place;
  };
  const std::vector<Shape> shapes = {
      {hcFloat32, 1, 256, false},    {hcFloat32, 1000, 256, true}, {hcBfloat16, 777, 256, false},
      {hcFloat16, 5000, 2048, true}, {hcBfloat16, 4096, 2048, false}, {hcFloat32, 333, 7, false},
  };
  std::vector<std::string> errors(W);
  rig.parallel([&](int rank) {
    HostStream user;
    for (const Shape& s : shapes) {
      const size_t e = hcTypeSize(s.dt), b = s.count * e;
      const auto in = hctest::quantInput(s.dt, s.count, s.block, rank);
      std::vector<char> send(in), recv(W * b, static_cast<char>(0xab));
      const void* sendp = send.data();
      if (s.in_place) {
        std::memcpy(recv.data() + rank * b, in.data(), b);
        sendp = recv.data() + rank * b;
      }
      hicoll::CollArgs a;
      a.coll = hcCollAllGather;
      a.send = sendp;
      a.recv = recv.data();
      a.count = s.count;
      a.dtype = s.dt;
      a.stream = &user;
      a.quant = hicoll::QuantArgs{.block = s.block, .dtype = s.dt, .count = s.count};
      const size_t before = rig.stream(rank).quantizations();
      try {
        rig.engine(rank).enqueue(a);
      } catch (const std::exception& ex) {
        errors[rank] = ex.what();
        return;
      }
      user.synchronize();
      rig.engine(rank).drain();
      const std::string what = fmt::format("rank {}: {} x {} block {}{}", rank, s.count, hicoll::dtypeName(s.dt),
                                           s.block, s.in_place ? " in place" : "");
      if (recv != hctest::quantExpected(s.dt, s.count, s.block, W)) {
        errors[rank] = what + ": output differs from the host quantizer's";
        return;
      }
      if (!s.in_place && send != in) {
        errors[rank] = what + ": the send buffer was modified";
        return;
      }
      // Quantized once here, every image dequantized here.
      if (rig.stream(rank).quantizations() - before != static_cast<size_t>(1 + W)) {
        errors[rank] = what + fmt::format(": {} quantizer runs", rig.stream(rank).quantizations() - before);
        return;
      }
    }
  });
  for (const auto& e : errors)
    if (!e.empty()) ADD_FAILURE() << e;
  EXPECT_EQ(rig.stuck(), "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeviceQuantizedLayouts,
                         ::testing::Values(Layout{"one_rank", {"a"}}, Layout{"one_node_2", {"a", "a"}},
                                           Layout{"two_nodes_1", {"a", "b"}},
                                           Layout{"2x2_interleaved", {"a", "b", "a", "b"}},
                                           Layout{"3x2_contiguous", {"a", "a", "b", "b", "c", "c"}}),
                         [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.name); });

// The images are what moves: a quantized call sends a quarter of an fp32 call's bytes (plus
// the scales), as the statistics count them.
TEST(DeviceQuantized, PeerBytesAreTheImages) {
  EngineRig rig({"a", "a", "b", "b"});
  hicoll::CollArgs a;
  a.coll = hcCollAllGather;
  a.count = 4096;
  a.dtype = hcFloat32;
  a.quant = hicoll::QuantArgs{.block = 256, .dtype = hcFloat32, .count = 4096};
  size_t total = 0;
  rig.engine(0).forEachPeerBytes(a, [&](int, size_t bytes) { total += bytes; });
  const size_t img = hicoll::quant::packedBytes(4096, 256);  // 16 scales + 4096 codes
  EXPECT_EQ(img, 4096u + 64u);
  EXPECT_EQ(total, 2 * img /* local peer: both nodes' blocks */ + img /* rail peer */);
}

}  // namespace
