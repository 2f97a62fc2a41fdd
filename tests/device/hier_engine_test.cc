// The device path's protocol without a GPU: HierEngine on host streams (one thread per stream)
// with an in-memory network, W ranks as threads on simulated nodes. Checks every collective,
// datatype and op against a reference, in place and out of place, through chunk rings that
// wrap many times; stream ordering; back-to-back collectives; and failures that must end as
// errors, not hangs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "base/error.h"
#include "device/decision.h"
#include "engine_rig.h"

namespace {

using hctest::EngineRig;
using hctest::HostStream;
using hctest::RigOptions;
using hicoll::CollArgs;
using hicoll::OpKind;

struct Case {
  hcColl_t coll;
  hcDataType_t dt;
  OpKind op = OpKind::Sum;
  size_t count = 1;
  bool in_place = false;
  int root = 0;

  std::string str() const {
    return std::string(hicoll::collName(coll)) + " " + hctest::dtypeLabel(dt) + " op " + hicoll::opName(op) +
           " count " + std::to_string(count) + (in_place ? " in-place" : "") +
           (coll == hcCollBroadcast ? " root " + std::to_string(root) : "");
  }
};

// One rank's buffers for a case, filled on the user stream (stream order, like a kernel).
struct Buffers {
  std::vector<char> send, recv;
  const void* sendp = nullptr;
  void* recvp = nullptr;
};

Buffers prepare(const Case& c, int rank, int W, HostStream& user) {
  const size_t e = hcTypeSize(c.dt);
  size_t send_elems = c.count, recv_elems = c.count;
  if (c.coll == hcCollAllGather) recv_elems = W * c.count;
  if (c.coll == hcCollReduceScatter) send_elems = W * c.count;
  Buffers b;
  b.send.assign(send_elems * e, 0);
  b.recv.assign(recv_elems * e, static_cast<char>(0xab));
  b.sendp = b.send.data();
  b.recvp = b.recv.data();
  if (c.in_place) {
    if (c.coll == hcCollAllGather) b.sendp = b.recv.data() + rank * c.count * e;
    if (c.coll == hcCollReduceScatter) {
      b.recv.assign(b.send.size(), 0);
      b.sendp = b.recv.data();
      b.recvp = b.recv.data() + rank * c.count * e;
    }
    if (c.coll == hcCollAllReduce || c.coll == hcCollBroadcast) b.sendp = b.recv.data();
  }
  void* dst = const_cast<void*>(b.sendp);
  user.enqueueFn([=] {
    std::vector<char> in = hctest::testInput(c.coll, c.dt, c.op, c.count, rank, W);
    std::memcpy(dst, in.data(), in.size());
  });
  return b;
}

CollArgs collArgs(const Case& c, const Buffers& b, HostStream& user) {
  CollArgs a;
  a.coll = c.coll;
  a.send = b.sendp;
  a.recv = b.recvp;
  a.count = c.count;
  a.dtype = c.dt;
  a.op.kind = c.op;
  a.op.scalar = c.op == OpKind::PreMulSum ? hctest::testScalar(c.dt) : 1.0;
  a.root = c.root;
  a.stream = &user;
  return a;
}

// "" when rank's result matches the reference.
std::string verify(const Case& c, int rank, int W, const void* recv) {
  std::string err =
      hctest::compareOutput(c.dt, recv, hctest::expectedOutput(c.coll, c.dt, c.op, c.count, c.root, rank, W));
  return err.empty() ? "" : "rank " + std::to_string(rank) + ": " + c.str() + ": " + err;
}

std::vector<Case> matrix(int W, const std::vector<hcDataType_t>& types, const std::vector<size_t>& counts) {
  std::vector<Case> cs;
  for (hcDataType_t dt : types)
    for (size_t count : counts)
      for (bool ip : {false, true}) {
        cs.push_back({hcCollAllGather, dt, OpKind::Sum, count, ip});
        for (OpKind op : {OpKind::Sum, OpKind::Prod, OpKind::Max, OpKind::Min, OpKind::Avg, OpKind::PreMulSum})
          cs.push_back({hcCollReduceScatter, dt, op, count, ip});
        for (OpKind op : {OpKind::Sum, OpKind::Max, OpKind::Avg, OpKind::PreMulSum})
          cs.push_back({hcCollAllReduce, dt, op, count, ip});
        if (hicoll::isInteger(dt))
          for (OpKind op : {OpKind::Band, OpKind::Bor, OpKind::Bxor}) {
            cs.push_back({hcCollReduceScatter, dt, op, count, ip});
            cs.push_back({hcCollAllReduce, dt, op, count, ip});
          }
        cs.push_back({hcCollBroadcast, dt, OpKind::Sum, count, ip, 0});
        cs.push_back({hcCollBroadcast, dt, OpKind::Sum, count, ip, W - 1});
      }
  return cs;
}

// Every rank runs the cases in order, one at a time; returns the failures.
std::vector<std::string> runCases(EngineRig& rig, const std::vector<Case>& cases) {
  const int W = rig.size();
  std::vector<std::string> errors(W);
  rig.parallel([&](int rank) {
    HostStream user;
    for (const Case& c : cases) {
      Buffers b = prepare(c, rank, W, user);
      try {
        rig.engine(rank).enqueue(collArgs(c, b, user));
      } catch (const std::exception& e) {
        errors[rank] = c.str() + ": " + e.what();
        return;
      }
      user.synchronize();
      std::string err = verify(c, rank, W, b.recvp);
      if (!err.empty()) {
        errors[rank] = err;
        return;
      }
    }
    try {
      rig.engine(rank).drain();
    } catch (const std::exception& e) {
      errors[rank] = std::string("drain: ") + e.what();
    }
  });
  std::vector<std::string> out;
  for (auto& e : errors)
    if (!e.empty()) out.push_back(e);
  std::string stuck = rig.stuck();
  if (!stuck.empty()) out.push_back("stuck streams:\n" + stuck);
  return out;
}

const std::vector<hcDataType_t> kAllTypes = {hcInt8,   hcUint8,   hcInt32,   hcUint32,  hcInt64,
                                             hcUint64, hcFloat16, hcFloat32, hcFloat64, hcBfloat16};
const std::vector<hcDataType_t> kSomeTypes = {hcFloat32, hcFloat16, hcBfloat16, hcInt8, hcUint64};

struct Layout {
  const char* name;
  std::vector<std::string> labels;
  bool all_types;
};

class EngineLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(EngineLayouts, EveryCollectiveTypeAndOpMatchesTheReference) {
  const Layout& lay = GetParam();
  RigOptions opt;
  opt.chunk = 256;  // many chunks: the rings wrap and the counters run far
  opt.allreduce_small = 64;
  EngineRig rig(lay.labels, opt);
  const int W = rig.size();
  auto errors =
      runCases(rig, matrix(W, lay.all_types ? kAllTypes : kSomeTypes, {1, 5, 333, static_cast<size_t>(7 * W)}));
  for (const auto& e : errors) ADD_FAILURE() << e;
}

INSTANTIATE_TEST_SUITE_P(Layouts, EngineLayouts,
                         ::testing::Values(Layout{"one_rank", {"a"}, true}, Layout{"one_node_2", {"a", "a"}, true},
                                           Layout{"two_nodes_1", {"a", "b"}, false},
                                           Layout{"2x2_contiguous", {"a", "a", "b", "b"}, true},
                                           Layout{"2x2_interleaved", {"a", "b", "a", "b"}, false},
                                           Layout{"3x2_interleaved", {"a", "b", "c", "a", "b", "c"}, false},
                                           Layout{"2x2_scrambled", {"x", "y", "y", "x"}, false}),
                         [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.name); });

TEST(Engine, LargeChunksAndSmallBuffers) {
  // Default chunk, but sort/scratch buffers far smaller than a chunk: the chunk shrinks to fit.
  RigOptions opt;
  opt.scratch = 8192;
  opt.sort = 8192;
  EngineRig rig({"a", "a", "b", "b"}, opt);
  auto errors = runCases(rig, matrix(rig.size(), {hcFloat32, hcBfloat16}, {3, 5000}));
  for (const auto& e : errors) ADD_FAILURE() << e;
}

TEST(Engine, BackToBackCollectivesWithoutSynchronizing) {
  RigOptions opt;
  opt.chunk = 512;
  EngineRig rig({"a", "b", "a", "b"}, opt);
  const int W = rig.size();
  const std::vector<Case> seq = {
      {hcCollAllGather, hcFloat32, OpKind::Sum, 1000},     {hcCollReduceScatter, hcFloat16, OpKind::Sum, 777},
      {hcCollAllReduce, hcInt32, OpKind::Max, 4001},       {hcCollBroadcast, hcUint8, OpKind::Sum, 3000, false, 3},
      {hcCollAllGather, hcBfloat16, OpKind::Sum, 3, true}, {hcCollReduceScatter, hcFloat64, OpKind::Avg, 129, true},
      {hcCollAllReduce, hcFloat32, OpKind::PreMulSum, 5},  {hcCollAllGather, hcInt64, OpKind::Sum, 640},
  };
  std::vector<std::string> errors(W);
  rig.parallel([&](int rank) {
    HostStream user;
    std::vector<Buffers> bufs;
    bufs.reserve(seq.size());
    for (const Case& c : seq) {
      bufs.push_back(prepare(c, rank, W, user));
      try {
        rig.engine(rank).enqueue(collArgs(c, bufs.back(), user));
      } catch (const std::exception& e) {
        errors[rank] = c.str() + ": " + e.what();
        return;
      }
    }
    user.synchronize();
    for (size_t i = 0; i < seq.size() && errors[rank].empty(); ++i)
      errors[rank] = verify(seq[i], rank, W, bufs[i].recvp);
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(rig.stuck(), "");
}

// gpu_bench's pattern on 2 nodes x 1 with the default knobs (1 MiB chunks, 16 MiB scratch,
// 128 MiB sort): per size, warm-up and timed calls back to back on the same buffers (in place,
// the input changes under every call), then fresh input on the stream and one checked call.
// The device run reported 35424 wrong elements for the in-place 1 MiB ReduceScatter (one chunk
// per collective). The engine protocol runs that sequence correctly: the fault was gpu_bench's
// upload (a legacy-stream cudaMemcpy unordered with its non-blocking stream), fixed there.
TEST(Engine, BenchSequenceTwoNodesInPlaceReduceScatter) {
  EngineRig rig({"a", "b"});
  const int W = rig.size();
  constexpr int kCalls = 5 + 20;
  std::vector<std::string> errors(W);
  rig.parallel([&](int rank) {
    HostStream user;
    for (hcColl_t coll : {hcCollAllGather, hcCollReduceScatter})
      for (size_t bytes : {size_t{1} << 20, size_t{4} << 20})
        for (bool ip : {false, true}) {
          const Case c{coll, hcFloat32, OpKind::Sum, bytes / (W * 4), ip};
          Buffers b = prepare(c, rank, W, user);
          try {
            for (int i = 0; i < kCalls; ++i) rig.engine(rank).enqueue(collArgs(c, b, user));
            user.synchronize();
            void* dst = const_cast<void*>(b.sendp);
            user.enqueueFn([=] {
              std::vector<char> in = hctest::testInput(c.coll, c.dt, c.op, c.count, rank, W);
              std::memcpy(dst, in.data(), in.size());
            });
            rig.engine(rank).enqueue(collArgs(c, b, user));
          } catch (const std::exception& e) {
            errors[rank] = c.str() + ": " + e.what();
            return;
          }
          user.synchronize();
          errors[rank] = verify(c, rank, W, b.recvp);
          if (!errors[rank].empty()) return;
        }
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(rig.stuck(), "");
}

TEST(Engine, EnqueueReturnsAndTheCollectiveWaitsForEarlierStreamWork) {
  EngineRig rig({"a", "b"});
  const int W = rig.size();
  const Case c{hcCollAllGather, hcFloat32, OpKind::Sum, 4096};
  std::vector<std::string> errors(W);
  rig.parallel([&](int rank) {
    HostStream user;
    std::atomic<bool> released{false};
    // Earlier work on the user's stream: blocks until the test releases it.
    user.enqueueFn([&] {
      while (!released) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    Buffers b = prepare(c, rank, W, user);  // the input is written after the blocker
    const auto t0 = std::chrono::steady_clock::now();
    try {
      rig.engine(rank).enqueue(collArgs(c, b, user));
    } catch (const std::exception& e) {
      errors[rank] = e.what();
      released = true;
      return;
    }
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    if (ms > 2000) errors[rank] = "enqueue blocked for " + std::to_string(ms) + " ms";
    // Later work on the stream sees the result.
    std::vector<char> seen(b.recv.size());
    user.enqueueFn([&] { std::memcpy(seen.data(), b.recvp, seen.size()); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (std::memcmp(b.recv.data(), std::vector<char>(b.recv.size(), static_cast<char>(0xab)).data(), 64) != 0)
      errors[rank] = "the collective wrote the output before the stream reached it";
    released = true;
    user.synchronize();
    if (errors[rank].empty()) errors[rank] = verify(c, rank, W, seen.data());
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Engine, AllGatherMovesDataWithCopiesOnly) {
  EngineRig rig({"a", "a", "b", "b"});
  const Case c{hcCollAllGather, hcFloat16, OpKind::Sum, 10000};
  auto errors = runCases(rig, {c});
  for (const auto& e : errors) ADD_FAILURE() << e;
  for (int r = 0; r < rig.size(); ++r) {
    EXPECT_EQ(rig.stream(r).reductions(), 0u) << "rank " << r;
    EXPECT_GT(rig.stream(r).copies(), 0u) << "rank " << r;
  }
}

// One plan for both engines: the device engine runs the AllReduce split of the plan that
// dev::decide took it by (planCall with the device's capabilities), and that plan splits as the
// host's does wherever the host has a block to split (the device pads the last block, the host
// sends the tail through the latency path: their block sizes are ceil and floor of count / W).
TEST(Engine, RunsThePlansAllReduceSplit) {
  RigOptions opt;
  opt.allreduce_small = 4096;
  EngineRig rig({"a", "a", "b", "b"}, opt);
  hicoll::Identity id;
  id.nranks = rig.size();
  id.topo = rig.topo();
  hicoll::PlanContext ctx;
  ctx.cfg = hicoll::Config::from([](const char* name) -> const char* {
    return std::string(name) == "HICOLL_ALLREDUCE_SMALL_BYTES" ? "4096" : nullptr;
  });
  const hicoll::Capabilities host;
  for (size_t count : {4u, 5u, 1023u, 1024u, 1025u, 1026u, 4099u, 100000u}) {
    CollArgs a;
    a.coll = hcCollAllReduce;
    a.dtype = hcFloat32;
    a.count = count;
    const hicoll::CollPlan dev = hicoll::planCall(id, ctx, a, hicoll::dev::deviceCapabilities());
    const hicoll::CollPlan hst = hicoll::planCall(id, ctx, a, host);
    EXPECT_EQ(rig.engine(0).smallAllReduce(a), dev.allreduce_small) << count;
    EXPECT_EQ(rig.engine(0).plan(a).allreduce_block, dev.allreduce_block) << count;
    EXPECT_EQ(dev.allreduce_small, hst.allreduce_small) << count;
    EXPECT_EQ(dev.allreduce_small, count * 4 <= 4096) << count;
    EXPECT_EQ(dev.allreduce_block, (count + 3) / 4) << count;
    EXPECT_EQ(hst.allreduce_block, count / 4) << count;
    // What the engine moves follows the plan: the split's blocks to every peer.
    size_t moved = 0;
    rig.engine(0).forEachPeerBytes(a, [&](int, size_t b) { moved += b; });
    const size_t per_peer = dev.allreduce_small ? count * 4 : dev.allreduce_block * 4;
    EXPECT_EQ(moved, (dev.allreduce_small ? 1 : 2) * per_peer * 3) << count;
  }
}

TEST(Engine, PlansAndStatistics) {
  RigOptions opt;
  opt.chunk = 1 << 20;
  opt.sort = 8192;
  opt.scratch = 8192;
  EngineRig rig({"a", "a", "b", "b"}, opt);
  CollArgs a;
  a.coll = hcCollReduceScatter;
  a.dtype = hcFloat64;
  a.count = 100;
  // dsort 8192 / (2 slots x 2 local x 2 nodes) = 1024 bytes per chunk.
  EXPECT_EQ(rig.engine(0).chunkFor(a), 1024u);
  EXPECT_EQ(rig.engine(0).unsupported(a), "");
  a.coll = hcCollBarrier;
  EXPECT_NE(rig.engine(0).unsupported(a), "");
  // Rank 1 is (node 0, local 1): AllGather sends N*b to its local peer, b to its rail peer.
  a.coll = hcCollAllGather;
  std::map<int, size_t> bytes;
  rig.engine(1).forEachPeerBytes(a, [&](int peer, size_t b) { bytes[peer] += b; });
  EXPECT_EQ(bytes, (std::map<int, size_t>{{0, 1600}, {3, 800}}));

  const hicoll::dev::BufferSizes s = hicoll::dev::bufferSizes(8, 4, 1 << 20, 16 << 20, 128 << 20);
  EXPECT_EQ(s.dsort, 64u << 20);
  EXPECT_EQ(s.hscratch, 8u << 20);
  EXPECT_EQ(s.hsort, 8u << 20);
  EXPECT_EQ(s.dwork, 12u << 20);
  EXPECT_EQ(hicoll::dev::bufferSizes(8, 1, 1 << 20, 16 << 20, 128 << 20).hscratch, 0u);
}

TEST(Engine, TooSmallBuffersAreUnsupportedWithAReason) {
  RigOptions opt;
  opt.sort = 64;
  opt.scratch = 64;
  EngineRig rig({"a", "a", "b", "b"}, opt);
  CollArgs a;
  a.coll = hcCollReduceScatter;
  a.dtype = hcFloat64;
  a.count = 10;
  // 64 / (2 x 2 x 2) = 8 bytes: one double fits; 64 / (2 x 2 x 2) for int64 too; a broadcast fits.
  EXPECT_EQ(rig.engine(0).unsupported(a), "");
  RigOptions tiny;
  tiny.sort = 8;
  tiny.scratch = 8;
  EngineRig rig2({"a", "a", "b", "b"}, tiny);
  const std::string why = rig2.engine(0).unsupported(a);
  EXPECT_NE(why.find("too small"), std::string::npos) << why;
  EXPECT_NE(why.find("SMDDP_AG_SORT_BUFFER_SIZE_BYTES"), std::string::npos) << why;
}

TEST(Engine, ZeroCountEnqueuesNothing) {
  EngineRig rig({"a", "a"});
  HostStream user;
  CollArgs a;
  a.coll = hcCollAllReduce;
  a.count = 0;
  a.stream = &user;
  rig.engine(0).enqueue(a);
  EXPECT_TRUE(rig.stream(0).idle());
  rig.engine(0).drain();
}

TEST(Engine, AMissingLocalPeerTimesOutAndReleasesTheStream) {
  RigOptions opt;
  opt.timeout_ms = 300;
  EngineRig rig({"a", "a"}, opt);
  HostStream user(5000);
  Case c{hcCollAllGather, hcFloat32, OpKind::Sum, 100};
  Buffers b = prepare(c, 0, 2, user);
  rig.engine(0).enqueue(collArgs(c, b, user));  // rank 1 never joins
  try {
    rig.engine(0).drain();
    ADD_FAILURE() << "no error";
  } catch (const hicoll::Error& e) {
    EXPECT_EQ(e.code(), hcTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("HICOLL_TIMEOUT_MS"), std::string::npos) << e.what();
  }
  user.synchronize();  // returns: the failure released the stream's waits
  EXPECT_FALSE(user.stuck());
  EXPECT_TRUE(rig.engine(0).failed());
  EXPECT_THROW(rig.engine(0).enqueue(collArgs(c, b, user)), hicoll::Error);
  // The node learned it: rank 1's next collective fails instead of returning garbage.
  HostStream user1(5000);
  Buffers b1 = prepare(c, 1, 2, user1);
  rig.engine(1).enqueue(collArgs(c, b1, user1));
  try {
    rig.engine(1).drain();
    ADD_FAILURE() << "no error on rank 1";
  } catch (const hicoll::Error& e) {
    EXPECT_EQ(e.code(), hcRemoteError) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  user1.synchronize();
}

TEST(Engine, AMissingRailPeerTimesOutWithTheNetworkState) {
  RigOptions opt;
  opt.timeout_ms = 300;
  EngineRig rig({"a", "b"}, opt);
  HostStream user(5000);
  Case c{hcCollReduceScatter, hcFloat32, OpKind::Sum, 64};
  Buffers b = prepare(c, 0, 2, user);
  rig.engine(0).enqueue(collArgs(c, b, user));
  try {
    rig.engine(0).drain();
    ADD_FAILURE() << "no error";
  } catch (const hicoll::Error& e) {
    EXPECT_EQ(e.code(), hcTimeout) << e.what();
    const std::string m = e.what();
    EXPECT_NE(m.find("no network progress"), std::string::npos) << m;
    EXPECT_NE(m.find("recv<-1"), std::string::npos) << m;
  }
  user.synchronize();
  EXPECT_FALSE(user.stuck());
}

// Ranks whose calls differ (the last rank changes one field) fail on every rank, the ranks
// that compare with it naming both calls and what differs, well inside the timeout, and no
// stream is left waiting. Without the descriptor check these paired their counters: wrong
// results (op, datatype, root) or a timeout (count, collective).
TEST(Engine, CallsThatDifferFailOnEveryRankNamingTheDifference) {
  struct Mismatch {
    Case base;
    std::function<void(Case&)> change;
    const char* what;
  };
  const std::vector<Mismatch> kinds = {
      {{hcCollAllReduce, hcFloat32, OpKind::Sum, 1000}, [](Case& c) { c.op = OpKind::Max; }, "the reduction op"},
      {{hcCollAllReduce, hcFloat32, OpKind::Sum, 1000}, [](Case& c) { c.dt = hcInt32; }, "the datatype"},
      {{hcCollAllGather, hcFloat32, OpKind::Sum, 5000}, [](Case& c) { c.count = 5001; }, "the count"},
      {{hcCollBroadcast, hcFloat32, OpKind::Sum, 3000}, [](Case& c) { c.root = 1; }, "the root"},
      {{hcCollAllGather, hcFloat32, OpKind::Sum, 2000},
       [](Case& c) { c.coll = hcCollReduceScatter; },
       "the collective"},
  };
  for (const auto& labels : {std::vector<std::string>{"a", "a", "b", "b"}, std::vector<std::string>{"a", "b"},
                             std::vector<std::string>{"a", "a"}}) {
    for (const Mismatch& m : kinds) {
      RigOptions opt;
      opt.timeout_ms = 10000;
      EngineRig rig(labels, opt);
      const int W = rig.size(), odd = W - 1;
      std::vector<std::string> msg(W);
      std::vector<hcResult_t> code(W, hcSuccess);
      const auto t0 = std::chrono::steady_clock::now();
      rig.parallel([&](int r) {
        HostStream user(20000);
        Case c = m.base;
        if (r == odd) m.change(c);
        Buffers b = prepare(c, r, W, user);
        try {
          rig.engine(r).enqueue(collArgs(c, b, user));
          rig.engine(r).drain();
        } catch (const hicoll::Error& e) {
          code[r] = e.code();
          msg[r] = e.what();
        }
        user.synchronize();
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string where = std::to_string(W) + " ranks, " + m.what;
      EXPECT_LT(s, 5.0) << where;
      EXPECT_EQ(rig.stuck(), "") << where;
      int named = 0;
      for (int r = 0; r < W; ++r) {
        EXPECT_TRUE(code[r] == hcInvalidUsage || code[r] == hcRemoteError) << where << ", rank " << r << ": " << msg[r];
        if (code[r] == hcInvalidUsage) {
          ++named;
          EXPECT_NE(msg[r].find(m.what), std::string::npos) << where << ": " << msg[r];
          const std::string odd_named =
              r == odd ? "where rank " + std::to_string(odd) + " called" : "rank " + std::to_string(odd) + " (node";
          EXPECT_NE(msg[r].find(odd_named), std::string::npos) << msg[r];
        }
      }
      EXPECT_GE(named, 2) << where;  // the odd rank and a peer that compares with it
    }
  }
}

TEST(Engine, AbortReleasesEveryWait) {
  EngineRig rig({"a", "a", "b", "b"});
  HostStream user(5000);
  Case c{hcCollAllReduce, hcFloat32, OpKind::Sum, 100000};
  Buffers b = prepare(c, 0, 4, user);
  rig.engine(0).enqueue(collArgs(c, b, user));  // the others never join
  rig.engine(0).abort(hcRemoteError, "test abort");
  user.synchronize();
  EXPECT_FALSE(user.stuck());
  EXPECT_THROW(rig.engine(0).drain(), hicoll::Error);
}

}  // namespace
