// The quantized collectives on the device path without a GPU, on host streams.
// hcAllGatherQuantized (quantize on the stream, the images gathered, every image dequantized),
// checked bit for bit against the host quantizer: every rank holds
// dequantize(quantize(block of rank j)) for every j, NaN, infinities, zero blocks and tails
// included. hcReduceScatterQuantized (each node's partial of a chunk quantized, the images
// summed in fp32 by the chunk's owner), checked against a reference written out here.
#include <gtest/gtest.h>

#include <cstring>

#include <fmt/format.h>

#include "algorithms/quantize.h"
#include "base/numeric.h"
#include "engine_rig.h"

namespace {

using hctest::EngineRig;
using hctest::HostStream;
using hctest::RigOptions;
using hicoll::OpKind;

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
      {hcFloat32, 1, 256, false},    {hcFloat32, 1000, 256, true},    {hcBfloat16, 777, 256, false},
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

// What rank r of a quantized ReduceScatter must hold: per chunk of q bytes, its node's exact
// partial (the local ranks' blocks reduced in local order, pre-multiplied) plus every other
// node's partial quantized and dequantized to fp32, added in node order in fp32, divided for
// an average, rounded once. qb == 0: the exact hierarchical sum (the partials reduced in the
// same order).
struct RsShape {
  hcDataType_t dt;
  size_t count, block;
  OpKind op;
  bool in_place;
};

std::vector<char> rsReference(const hicoll::Topology& t, const RsShape& s, int r,
                              const std::vector<std::vector<char>>& inputs, size_t q, size_t qb) {
  const size_t e = hcTypeSize(s.dt), b = s.count * e;
  const int N = t.nnodes, L = t.localSize(0), n = t.node_of[r], W = t.nranks;
  const double scalar = s.op == OpKind::PreMulSum ? hctest::testScalar(s.dt) : 1.0;
  std::vector<std::vector<char>> partial(N, std::vector<char>(b));
  for (int m = 0; m < N; ++m) {
    hicoll::dev::ReduceJob j;
    j.dtype = s.dt;
    j.premul = s.op == OpKind::PreMulSum;
    j.scalar = scalar;
    j.divisor = N == 1 && s.op == OpKind::Avg ? W : 0;
    j.nin = L;
    for (int p = 0; p < L; ++p) j.in[p] = inputs[t.rankAt(m, p)].data() + static_cast<size_t>(r) * b;
    j.out = partial[m].data();
    j.n = s.count;
    hicoll::dev::hostReduce(j);
  }
  if (N == 1) return partial[0];
  std::vector<char> out(b);
  for (size_t off = 0; off < b; off += q) {
    const size_t len = std::min(q, b - off), k = len / e;
    if (!qb) {
      hicoll::dev::ReduceJob j;
      j.dtype = s.dt;
      j.divisor = s.op == OpKind::Avg ? W : 0;
      j.in[j.nin++] = partial[n].data() + off;
      for (int m = 0; m < N; ++m)
        if (m != n) j.in[j.nin++] = partial[m].data() + off;
      j.out = out.data() + off;
      j.n = k;
      hicoll::dev::hostReduce(j);
      continue;
    }
    std::vector<float> acc(k), deq(k);
    for (size_t i = 0; i < k; ++i) acc[i] = static_cast<float>(hctest::getElem(s.dt, partial[n].data() + off, i));
    std::vector<char> img(hicoll::quant::packedBytes(k, qb));
    for (int m = 0; m < N; ++m) {
      if (m == n) continue;
      hicoll::quant::quantize(partial[m].data() + off, k, s.dt, qb, img.data());
      hicoll::quant::dequantize(img.data(), k, hcFloat32, qb, deq.data());
      for (size_t i = 0; i < k; ++i) acc[i] += deq[i];
    }
    for (size_t i = 0; i < k; ++i) {
      const float v = s.op == OpKind::Avg ? acc[i] / static_cast<float>(W) : acc[i];
      char* dst = out.data() + off + i * e;
      if (s.dt == hcFloat32) {
        std::memcpy(dst, &v, e);
      } else {
        const uint16_t h = s.dt == hcBfloat16 ? hicoll::num::floatToBf16(v) : hicoll::num::floatToHalf(v);
        std::memcpy(dst, &h, e);
      }
    }
  }
  return out;
}

class DeviceQuantizedRsLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(DeviceQuantizedRsLayouts, ReduceScatterSumsTheOtherNodesImagesInFp32) {
  RigOptions opt;
  opt.chunk = 512;  // several chunks, each quantized on its own: the rings wrap
  EngineRig rig(GetParam().labels, opt);
  const int W = rig.size(), N = rig.topo().nnodes;
  const std::vector<RsShape> shapes = {
      {hcFloat32, 1000, 256, OpKind::Sum, false},
      {hcBfloat16, 777, 256, OpKind::Avg, true},
      {hcFloat16, 5000, 2048, OpKind::PreMulSum, false},
      {hcFloat32, 333, 7, OpKind::Avg, false},
      {hcBfloat16, 3000, 64, OpKind::Sum, true},
      {hcBfloat16, 201, 64, OpKind::Sum, false},  // one chunk of 402 bytes: images stay aligned
      {hcFloat32, 1, 256, OpKind::Sum, false},    // an image (8 bytes) larger than the chunk: exact
  };
  std::vector<std::string> errors(W);
  rig.parallel([&](int rank) {
    HostStream user;
    for (const RsShape& s : shapes) {
      const size_t e = hcTypeSize(s.dt), b = s.count * e;
      std::vector<std::vector<char>> inputs;
      for (int j = 0; j < W; ++j) inputs.push_back(hctest::quantInput(s.dt, W * s.count, s.block, j));
      std::vector<char> send(inputs[rank]), recv(b, static_cast<char>(0xab));
      const void* sendp = send.data();
      void* recvp = recv.data();
      if (s.in_place) recvp = send.data() + rank * b;
      hicoll::CollArgs a;
      a.coll = hcCollReduceScatter;
      a.send = sendp;
      a.recv = recvp;
      a.count = s.count;
      a.dtype = s.dt;
      a.op.kind = s.op;
      a.op.scalar = s.op == OpKind::PreMulSum ? hctest::testScalar(s.dt) : 1.0;
      a.stream = &user;
      a.quant = hicoll::QuantArgs{.block = s.block, .dtype = s.dt, .count = s.count};
      const size_t q = std::min(rig.engine(rank).chunkFor(a), b), qb = rig.engine(rank).wireBlock(a);
      const std::string what = fmt::format("rank {}: {} x {} {} block {}{}", rank, s.count, hicoll::dtypeName(s.dt),
                                           hicoll::opName(s.op), s.block, s.in_place ? " in place" : "");
      const bool expect_quantized = N > 1 && s.count > 1;
      if ((qb != 0) != expect_quantized) {
        errors[rank] = what + fmt::format(": wireBlock {}", qb);
        return;
      }
      const size_t before = rig.stream(rank).quantizations();
      try {
        rig.engine(rank).enqueue(a);
        user.synchronize();
        rig.engine(rank).drain();
      } catch (const std::exception& ex) {
        errors[rank] = what + ": " + ex.what();
        return;
      }
      const std::vector<char> got(static_cast<char*>(recvp), static_cast<char*>(recvp) + b);
      if (got != rsReference(rig.topo(), s, rank, inputs, q, qb)) {
        errors[rank] = what + ": output differs from the reference";
        return;
      }
      // It did quantize: the exact sum differs somewhere.
      if (qb && got == rsReference(rig.topo(), s, rank, inputs, q, 0)) {
        errors[rank] = what + ": output equals the exact sum";
        return;
      }
      if (!s.in_place && send != inputs[rank]) {
        errors[rank] = what + ": the send buffer was modified";
        return;
      }
      // Per chunk: the other nodes' partials quantized, one fp32 sum.
      const size_t runs = rig.stream(rank).quantizations() - before, chunks = (b + q - 1) / q;
      if (runs != (qb ? chunks * static_cast<size_t>(N) : 0)) {
        errors[rank] = what + fmt::format(": {} quantizer runs for {} chunks", runs, chunks);
        return;
      }
    }
  });
  for (const auto& e : errors)
    if (!e.empty()) ADD_FAILURE() << e;
  EXPECT_EQ(rig.stuck(), "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeviceQuantizedRsLayouts,
                         ::testing::Values(Layout{"one_node_2", {"a", "a"}}, Layout{"two_nodes_1", {"a", "b"}},
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

  // A quantized ReduceScatter: exact partials within the node, images to the rail peer.
  a.coll = hcCollReduceScatter;
  const size_t q = std::min(rig.engine(0).chunkFor(a), size_t{4096 * 4});
  ASSERT_EQ(16384 % q, 0u);
  size_t local = 0, rail = 0;
  rig.engine(0).forEachPeerBytes(a, [&](int peer, size_t bytes) { (peer == 1 ? local : rail) += bytes; });
  EXPECT_EQ(local, 2 * 16384u);
  EXPECT_EQ(rail, 16384 / q * hicoll::quant::packedBytes(q / 4, 256));
}

}  // namespace
