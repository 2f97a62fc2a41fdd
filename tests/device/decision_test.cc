// The plan of a call (plan/plan.h) and the fallback decision table of the device path: which
// calls go to NCCL and why. Decisions follow the plan's typed path and rule, never its text.
#include <gtest/gtest.h>

#include <map>

#include "device/decision.h"
#include "plan/plan.h"
#include "transport/shm/shm_transport.h"

namespace {

using hicoll::CollArgs;
using hicoll::CollPlan;
using hicoll::Rule;
using hicoll::dev::decide;
using hicoll::dev::DeviceChoice;
using hicoll::dev::EngineStatus;

EngineStatus ok() {
  return EngineStatus{true, ""};
}

CollPlan planOf(hcPath_t path, Rule rule, std::string reason) {
  CollPlan p;
  p.path = path;
  p.rule = rule;
  p.reason = std::move(reason);
  return p;
}

TEST(DeviceDecision, PureTable) {
  CollPlan hier;
  DeviceChoice d = decide(hier, ok(), "");
  EXPECT_FALSE(d.fallback);
  EXPECT_EQ(d.reason, "");

  CollPlan forced = planOf(hcPathFallback, Rule::Forced, "HICOLL_FORCE_FALLBACK=allgather");
  d = decide(forced, ok(), "");
  EXPECT_TRUE(d.fallback);
  EXPECT_EQ(d.reason, "HICOLL_FORCE_FALLBACK=allgather");

  // The host rules come first, then the engine's setup, then what the engine cannot run.
  d = decide(forced, EngineStatus{false, "ranks 0 and 1 of node a share a process"}, "too small");
  EXPECT_EQ(d.reason, "HICOLL_FORCE_FALLBACK=allgather");
  d = decide(hier, EngineStatus{false, "ranks 0 and 1 of node a share a process"}, "");
  EXPECT_TRUE(d.fallback);
  EXPECT_EQ(d.reason, "ranks 0 and 1 of node a share a process");
  d = decide(hier, EngineStatus{false, ""}, "");
  EXPECT_TRUE(d.fallback);
  EXPECT_FALSE(d.reason.empty()) << "a fallback always has a reason";
  d = decide(hier, ok(), "device staging buffers too small");
  EXPECT_TRUE(d.fallback);
  EXPECT_EQ(d.reason, "device staging buffers too small");
}

// What planCall reads of a communicator (its identity and plan context: configuration,
// topology, model); what the transports can do comes in as Capabilities.
struct FakeComm {
  hicoll::Identity id;
  hicoll::PlanContext c;
  FakeComm(const std::vector<std::string>& labels, std::map<std::string, std::string> env) {
    c.cfg = hicoll::Config::from([&](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
    id.nranks = static_cast<int>(labels.size());
    id.topo = hicoll::Topology::build(labels, std::vector<std::string>(labels.size(), "h"));
  }
};

CollArgs call(hcColl_t coll, size_t count, hcDataType_t dt = hcFloat32) {
  CollArgs a;
  a.coll = coll;
  a.count = count;
  a.dtype = dt;
  return a;
}

TEST(DeviceDecision, WithTheCommunicatorsConfiguration) {
  {
    FakeComm f({"a", "a", "b", "b"}, {{"HICOLL_FORCE_FALLBACK", "allgather"}});
    DeviceChoice d = decide(f.id, f.c, call(hcCollAllGather, 10), ok(), nullptr);
    EXPECT_TRUE(d.fallback);
    EXPECT_NE(d.reason.find("HICOLL_FORCE_FALLBACK"), std::string::npos) << d.reason;
  }
  {
    FakeComm f({"a", "a", "b", "b"}, {{"HICOLL_FORCE_FALLBACK", "all"}});
    for (hcColl_t c : {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce, hcCollBroadcast})
      EXPECT_TRUE(decide(f.id, f.c, call(c, 10), ok(), nullptr).fallback) << hicoll::collName(c);
  }
  {
    FakeComm f({"a", "a", "b", "b"}, {{"HICOLL_ALGO", "ring"}});
    EXPECT_FALSE(decide(f.id, f.c, call(hcCollAllGather, 10), ok(), nullptr).fallback)
        << "HICOLL_ALGO is for host buffers";
  }
  {
    FakeComm f({"a", "a", "b"}, {});
    DeviceChoice d = decide(f.id, f.c, call(hcCollAllGather, 10), ok(), nullptr);
    EXPECT_TRUE(d.fallback);
    EXPECT_NE(d.reason.find("uneven"), std::string::npos) << d.reason;
  }
  {
    FakeComm f({"a", "a", "b", "b"}, {{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "8192"}});
    EXPECT_FALSE(decide(f.id, f.c, call(hcCollAllGather, 2048), ok(), nullptr).fallback) << "8 KiB block fits";
    DeviceChoice d = decide(f.id, f.c, call(hcCollAllGather, 2049), ok(), nullptr);
    EXPECT_TRUE(d.fallback);
    EXPECT_NE(d.reason.find("SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES"), std::string::npos) << d.reason;
  }
  {
    FakeComm f({"a", "b", "c", "d"}, {{"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", "16384"}});
    EXPECT_FALSE(decide(f.id, f.c, call(hcCollAllGather, 1024), ok(), nullptr).fallback) << "4 x 4 KiB fits";
    DeviceChoice d = decide(f.id, f.c, call(hcCollAllGather, 1025), ok(), nullptr);
    EXPECT_TRUE(d.fallback);
    EXPECT_NE(d.reason.find("SMDDP_AG_SORT_BUFFER_SIZE_BYTES"), std::string::npos) << d.reason;
    d = decide(f.id, f.c, call(hcCollReduceScatter, 1025), ok(), nullptr);
    EXPECT_TRUE(d.fallback) << "ReduceScatter receives N partial blocks into the sort buffer";
    EXPECT_NE(d.reason.find("SMDDP_AG_SORT_BUFFER_SIZE_BYTES"), std::string::npos) << d.reason;
  }
  {
    FakeComm f({"a", "a"}, {});
    DeviceChoice d =
        decide(f.id, f.c, call(hcCollAllGather, 10), EngineStatus{false, "CUDA IPC: no peer access"}, nullptr);
    EXPECT_TRUE(d.fallback);
    EXPECT_EQ(d.reason, "CUDA IPC: no peer access");
  }
}

// The host rules about host memory (HICOLL_ALGO=ring, single-copy reads) never send a device
// call to NCCL: the device plans with its own capabilities.
// A quantized call on device buffers quantizes from 2 nodes on (or HICOLL_QUANT_MIN_NODES), and
// the rules judge the images an AllGather moves: an 8 KiB scratch holds the image of 8000 fp32
// elements (8000 codes + 32 fp32 scales), not their 32000 bytes.
TEST(DeviceDecision, QuantizedAllGatherIsJudgedByItsImages) {
  CollArgs q = call(hcCollAllGather, 8000);
  q.quant = hicoll::QuantArgs{.block = 256, .dtype = hcFloat32, .count = 8000};
  {
    FakeComm f({"a", "a", "b", "b"}, {{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "8192"}});
    EXPECT_EQ(hicoll::dev::exactInstead(f.id, f.c, q), "");
    EXPECT_TRUE(decide(f.id, f.c, call(hcCollAllGather, 8000), ok(), nullptr).fallback) << "32000 exact bytes";
    const CollArgs wire = hicoll::dev::planArgs(q);
    EXPECT_EQ(wire.count, 8128u);
    EXPECT_EQ(wire.dtype, hcUint8);
    EXPECT_FALSE(decide(f.id, f.c, wire, ok(), nullptr).fallback) << "the 8128-byte image fits";
  }
  {
    FakeComm f({"a", "a"}, {});
    EXPECT_NE(hicoll::dev::exactInstead(f.id, f.c, q).find("exact on 1 node"), std::string::npos);
  }
  {
    FakeComm f({"a", "a"}, {{"HICOLL_QUANT_MIN_NODES", "1"}});
    EXPECT_EQ(hicoll::dev::exactInstead(f.id, f.c, q), "");
  }
  {
    FakeComm f({"a", "b"}, {});
    CollArgs rs = call(hcCollReduceScatter, 8000);
    rs.quant = q.quant;
    EXPECT_EQ(hicoll::dev::exactInstead(f.id, f.c, rs), "");
    EXPECT_EQ(hicoll::dev::planArgs(rs).count, 8000u) << "the ReduceScatter's chunks hold its images";
    FakeComm one({"a", "a"}, {});
    EXPECT_NE(hicoll::dev::exactInstead(one.id, one.c, rs).find("exact on 1 node"), std::string::npos);
  }
}

TEST(DeviceDecision, HostOnlyRulesDoNotApplyToDeviceBuffers) {
  using hicoll::Capabilities;
  {
    FakeComm f({"a", "a", "b", "b"}, {{"HICOLL_ALGO", "ring"}});
    EXPECT_EQ(hicoll::planCall(f.id, f.c, call(hcCollAllGather, 10), Capabilities{}).path, hcPathRing);
    EXPECT_FALSE(decide(f.id, f.c, call(hcCollAllGather, 10), ok(), nullptr).fallback);
  }
  {
    FakeComm f({"a", "a", "b", "b"}, {});
    Capabilities no_cma;
    no_cma.single_copy_reads = false;
    for (hcColl_t c : {hcCollReduceScatter, hcCollBroadcast}) {
      const CollPlan host = hicoll::planCall(f.id, f.c, call(c, 100000), no_cma);
      EXPECT_EQ(host.rule, Rule::NoSingleCopyReads) << hicoll::collName(c);
      EXPECT_TRUE(host.fallback());
      EXPECT_FALSE(decide(f.id, f.c, call(c, 100000), ok(), nullptr).fallback) << hicoll::collName(c);
    }
  }
}

// Reword every reason the planner gives: no decision of the device path changes.
TEST(DeviceDecision, RewordedReasonsChangeNoDecision) {
  std::vector<std::pair<std::vector<std::string>, std::map<std::string, std::string>>> configs = {
      {{"a", "a", "b", "b"}, {}},
      {{"a", "a", "b", "b"}, {{"HICOLL_FORCE_FALLBACK", "allgather,broadcast"}}},
      {{"a", "a", "b", "b"}, {{"HICOLL_ALGO", "ring"}}},
      {{"a", "a", "b"}, {}},
      {{"a", "b", "c", "d"},
       {{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "8192"}, {"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", "16384"}}},
  };
  int decisions = 0, fallbacks = 0;
  for (auto& [labels, env] : configs) {
    FakeComm f(labels, env);
    for (hcColl_t c : {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce, hcCollBroadcast})
      for (size_t count : {size_t{10}, size_t{1025}, size_t{4096}, size_t{1} << 20}) {
        const CollPlan plan = hicoll::planCall(f.id, f.c, call(c, count), hicoll::dev::deviceCapabilities());
        for (const std::string& engine : {std::string(), std::string("staging too small")}) {
          const DeviceChoice as_is = decide(plan, ok(), engine);
          CollPlan reworded = plan;
          reworded.reason = "<" + std::string(hicoll::ruleName(plan.rule)) + " said differently>";
          const DeviceChoice other = decide(reworded, ok(), engine);
          EXPECT_EQ(as_is.fallback, other.fallback) << hicoll::collName(c) << " " << count;
          ++decisions;
          fallbacks += as_is.fallback;
        }
      }
  }
  EXPECT_GT(fallbacks, 0);
  EXPECT_LT(fallbacks, decisions);
}

// The AllReduce split has one definition: the plan's, which the device engine asks too.
TEST(Plan, AllReduceSplitHasOneDefinition) {
  FakeComm f({"a", "a", "b", "b"}, {{"HICOLL_ALLREDUCE_SMALL_BYTES", "4096"}});
  const hicoll::Capabilities host{}, dev = hicoll::dev::deviceCapabilities();
  CollPlan p = hicoll::planCall(f.id, f.c, call(hcCollAllReduce, 1024), host);
  EXPECT_TRUE(p.allreduce_small);  // 4 KiB
  p = hicoll::planCall(f.id, f.c, call(hcCollAllReduce, 1025), host);
  EXPECT_FALSE(p.allreduce_small);
  EXPECT_EQ(p.allreduce_block, 256u);  // the host rounds down (the tail goes the small way)
  p = hicoll::planCall(f.id, f.c, call(hcCollAllReduce, 1025), dev);
  EXPECT_EQ(p.allreduce_block, 257u);  // the device rounds up and pads
  EXPECT_EQ(p.block_bytes, 257u * 4);
  EXPECT_EQ(hicoll::allReduceIsSmall(1025, 4, 4, 4096, host), p.allreduce_small);
  EXPECT_TRUE(hicoll::planCall(f.id, f.c, call(hcCollAllReduce, 3), host).allreduce_small)
      << "fewer elements than ranks";
}

// On one node with single-copy reads the host AllGather reads every block where it lies: a
// block larger than the scratch buffer stays hierarchical in one piece (it took the ring at
// 64 MiB on 1x2). Across nodes, without CMA, or for blocks small enough to stage, the block
// streams through scratch in pieces; under HICOLL_SCRATCH_STRICT=1 the seed's rule holds.
TEST(Plan, OneNodeAllGatherNeedsNoScratchForItsBlock) {
  using hicoll::Capabilities;
  Capabilities no_cma;
  no_cma.single_copy_reads = false;
  for (const char* strict : {"0", "1"}) {
    const bool seed = strict[0] == '1';
    const Rule staged = seed ? Rule::ScratchTooSmall : Rule::Hierarchical;
    const std::map<std::string, std::string> small_scratch{{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "8192"},
                                                           {"HICOLL_SCRATCH_STRICT", strict}};
    {
      FakeComm f({"a", "a"}, small_scratch);
      CollPlan p = hicoll::planCall(f.id, f.c, call(hcCollAllGather, 4096), Capabilities{});
      EXPECT_EQ(p.path, hcPathHierarchical);
      EXPECT_EQ(p.pieces, 1u) << "read in place: no scratch needed";
      EXPECT_EQ(hicoll::planCall(f.id, f.c, call(hcCollAllReduce, 100000), Capabilities{}).path, hcPathHierarchical);
      p = hicoll::planCall(f.id, f.c, call(hcCollAllGather, 4096), no_cma);
      EXPECT_EQ(p.rule, staged) << strict;
      if (!seed) EXPECT_EQ(p.pieces, 2u);
      if (!seed) EXPECT_EQ(p.piece_bytes, 8192u);
    }
    {
      FakeComm f({"a", "a"}, {{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "8192"},
                              {"HICOLL_SHM_EAGER_BYTES", "65536"},
                              {"HICOLL_SCRATCH_STRICT", strict}});
      const CollPlan p = hicoll::planCall(f.id, f.c, call(hcCollAllGather, 4096), Capabilities{});
      EXPECT_EQ(p.rule, staged) << "a 16 KiB block within the eager size is staged";
      if (!seed) EXPECT_EQ(p.pieces, 2u);
    }
    {
      FakeComm f({"a", "b"}, small_scratch);
      const CollPlan p = hicoll::planCall(f.id, f.c, call(hcCollAllGather, 4096), Capabilities{});
      EXPECT_EQ(p.rule, staged) << strict;
      if (!seed) EXPECT_EQ(p.pieces, 2u);
    }
  }
}

// HICOLL_ALGO=auto: the plan's path and AllReduce split are the ones the cost model predicts
// fastest (from values alike on every rank, never the in-place flag), and its prediction is
// the chosen path's.
TEST(Plan, AutoTakesWhatTheModelPredictsFastest) {
  using hicoll::Algo;
  hicoll::MachineFigures m;  // 1 Gbit/s links, as calibrated on the emulator
  m.net_Bps = 122e6;
  m.net_alpha_s = 33e-6;
  m.net_cpu_s_per_B = 0.37e-9;
  int ring_chosen = 0, checked = 0;
  for (const auto& labels : {std::vector<std::string>{"a", "b"}, {"a", "a", "b", "b"}, {"a", "b", "c", "d"}})
    for (double reduce_Bps : {8e9, 1e6}) {  // a slow sum makes the ring's fewer sums win somewhere
      FakeComm f(labels, {});
      f.c.model = m;
      f.c.model.reduce_Bps = reduce_Bps;
      for (hcColl_t coll : {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce})
        for (size_t count = 16; count <= (size_t{16} << 20); count *= 8) {
          const CollPlan p = hicoll::planCall(f.id, f.c, call(coll, count), hicoll::Capabilities{});
          ASSERT_TRUE(p.modelled);
          const hicoll::Shape s = hicoll::modelShape(f.id, f.c, p.chunk_bytes, p.net_window);
          const size_t bytes = coll == hcCollAllReduce ? count * 4 : count * 4 * labels.size();
          auto t = [&](Algo a, bool small) { return predict(f.c.model, s, coll, a, bytes, false, small).total(); };
          if (coll == hcCollAllReduce && count >= labels.size())
            EXPECT_EQ(p.allreduce_small, t(Algo::Hier, true) < t(Algo::Hier, false)) << count;
          const bool ring = t(Algo::Ring, p.allreduce_small) < t(Algo::Hier, p.allreduce_small);
          EXPECT_EQ(p.path, ring ? hcPathRing : hcPathHierarchical) << coll << " " << count;
          if (ring) {
            EXPECT_EQ(p.rule, Rule::ModelChoseRing);
            EXPECT_NE(p.reason.find("cost model: ring"), std::string::npos) << p.reason;
          }
          ring_chosen += ring;
          ++checked;
        }
    }
  EXPECT_GT(ring_chosen, 0) << "the ring never won: the test would not see a wrong choice";
  EXPECT_LT(ring_chosen, checked);

  // The fixed rules: HICOLL_ALGO=hier keeps the hierarchical path and the configured split.
  FakeComm fixed({"a", "a", "b", "b"}, {{"HICOLL_ALGO", "hier"}});
  fixed.c.model = m;
  CollPlan p = hicoll::planCall(fixed.id, fixed.c, call(hcCollAllReduce, 16384), hicoll::Capabilities{});
  EXPECT_EQ(p.path, hcPathHierarchical);
  EXPECT_TRUE(p.allreduce_small) << "64 KiB is within HICOLL_ALLREDUCE_SMALL_BYTES";
  // auto on the same 2x2: RS + AG (half the bytes per link) is predicted faster at 64 KiB,
  // unless the threshold is set by hand.
  FakeComm autom({"a", "a", "b", "b"}, {});
  autom.c.model = m;
  EXPECT_FALSE(
      hicoll::planCall(autom.id, autom.c, call(hcCollAllReduce, 16384), hicoll::Capabilities{}).allreduce_small);
  FakeComm pinned({"a", "a", "b", "b"}, {{"HICOLL_ALLREDUCE_SMALL_BYTES", "65536"}});
  pinned.c.model = m;
  EXPECT_TRUE(
      hicoll::planCall(pinned.id, pinned.c, call(hcCollAllReduce, 16384), hicoll::Capabilities{}).allreduce_small);
}

// HICOLL_ALGO=auto with the default net chunk: the plan runs the chunk and window the model
// picks (modelChunking, up to the communicator's cap), and predicts the call at them; a chunk
// set by hand, the fixed rules, a cap at the default, or a link that bounds the call keep
// HICOLL_NET_CHUNK_SIZE.
TEST(Plan, AutoTakesTheModelsChunk) {
  hicoll::MachineFigures fast;  // 400 Gbit/s, per-message work as measured on tcp
  fast.net_Bps = 50e9;
  fast.net_alpha_s = 15e-6;
  fast.net_cpu_s_per_B = 0;
  fast.net_msg_s = 15e-6;
  fast.copy_Bps = 100e9;
  const size_t count = 1u << 20;  // 4 MiB per rank
  auto plan = [&](std::map<std::string, std::string> env, const hicoll::MachineFigures& m, size_t cap) {
    FakeComm f({"a", "a", "b", "b"}, std::move(env));
    f.c.model = m;
    f.c.net_chunk_cap = cap;
    const CollPlan p = hicoll::planCall(f.id, f.c, call(hcCollAllGather, count), hicoll::Capabilities{});
    EXPECT_TRUE(p.modelled);
    EXPECT_EQ(p.path, hcPathHierarchical);
    const hicoll::Shape s = hicoll::modelShape(f.id, f.c, p.chunk_bytes, p.net_window);
    // (rank 0 with null buffers: an in-place call)
    EXPECT_DOUBLE_EQ(p.predicted.total(), predict(m, s, hcCollAllGather, hicoll::Algo::Hier, count * 16, true).total());
    EXPECT_EQ(p.net_window, hicoll::modelWindow(m, s, 4));
    return p;
  };
  const size_t floor = 256u << 10, cap = 1u << 20;
  EXPECT_EQ(plan({}, fast, cap).chunk_bytes, cap);
  EXPECT_EQ(plan({{"HICOLL_NET_CHUNK_SIZE", "262144"}}, fast, cap).chunk_bytes, floor) << "set by hand";
  EXPECT_EQ(plan({}, fast, floor).chunk_bytes, floor) << "rxm's eager limit at the default";
  EXPECT_EQ(plan({}, fast, 0).chunk_bytes, floor) << "no cap: not an auto communicator";
  hicoll::MachineFigures slow = fast;  // 1 Gbit/s
  slow.net_Bps = 122e6;
  slow.net_alpha_s = 33e-6;
  EXPECT_EQ(plan({}, slow, cap).chunk_bytes, floor);
  FakeComm fixed({"a", "a", "b", "b"}, {{"HICOLL_ALGO", "hier"}});
  fixed.c.model = fast;
  fixed.c.net_chunk_cap = cap;
  EXPECT_EQ(hicoll::planCall(fixed.id, fixed.c, call(hcCollAllGather, count), hicoll::Capabilities{}).chunk_bytes,
            floor);
}

}  // namespace
