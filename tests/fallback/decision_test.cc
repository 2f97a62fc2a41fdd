// The fallback decision table of the device path: which calls go to NCCL and why.
#include <gtest/gtest.h>

#include <map>

#include "core/comm.h"
#include "device/decision.h"
#include "transport/shm/shm_transport.h"

namespace {

using hicoll::CollArgs;
using hicoll::PathChoice;
using hicoll::dev::decide;
using hicoll::dev::DeviceChoice;
using hicoll::dev::EngineStatus;

EngineStatus ok() { return EngineStatus{true, ""}; }

TEST(DeviceDecision, PureTable) {
  PathChoice hier;
  DeviceChoice d = decide(hier, ok(), "");
  EXPECT_FALSE(d.fallback);
  EXPECT_EQ(d.reason, "");

  PathChoice forced{hcPathFallback, "HICOLL_FORCE_FALLBACK=allgather"};
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

TEST(DeviceDecision, HostOnlyRulesDoNotApplyToDeviceBuffers) {
  PathChoice ring{hcPathRing, ""};  // HICOLL_ALGO=ring
  EXPECT_TRUE(hicoll::dev::hostOnlyRule(ring));
  EXPECT_FALSE(decide(ring, ok(), "").fallback);
  PathChoice cma{hcPathFallback, "no single-copy intra-node reads (HICOLL_SHM_CMA=0 or process_vm_readv not permitted)"};
  EXPECT_TRUE(hicoll::dev::hostOnlyRule(cma));
  EXPECT_FALSE(decide(cma, ok(), "").fallback);
  PathChoice scratch{hcPathFallback, "SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES=8192 < per-rank block 16384 bytes"};
  EXPECT_FALSE(hicoll::dev::hostOnlyRule(scratch));
  EXPECT_TRUE(decide(scratch, ok(), "").fallback);
}

// A communicator with just what choosePath reads (configuration, topology, buffer sizes). It
// has no shm transport: only cases decided before choosePath asks about single-copy reads.
struct FakeComm {
  hcComm c;
  FakeComm(const std::vector<std::string>& labels, std::map<std::string, std::string> env) {
    c.cfg = hicoll::Config::from([&](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
    c.nranks = static_cast<int>(labels.size());
    c.topo = hicoll::Topology::build(labels, std::vector<std::string>(labels.size(), "h"));
    c.scratch_bytes = static_cast<size_t>(c.cfg.num(hicoll::Knob::ScratchBytes));
    c.sort_bytes = static_cast<size_t>(c.cfg.num(hicoll::Knob::SortBytes));
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
    DeviceChoice d = decide(f.c, call(hcCollAllGather, 10), ok(), nullptr);
    EXPECT_TRUE(d.fallback);
    EXPECT_NE(d.reason.find("HICOLL_FORCE_FALLBACK"), std::string::npos) << d.reason;
  }
  {
    FakeComm f({"a", "a", "b", "b"}, {{"HICOLL_FORCE_FALLBACK", "all"}});
    for (hcColl_t c : {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce, hcCollBroadcast})
      EXPECT_TRUE(decide(f.c, call(c, 10), ok(), nullptr).fallback) << hicoll::collName(c);
  }
  {
    FakeComm f({"a", "a", "b", "b"}, {{"HICOLL_ALGO", "ring"}});
    EXPECT_FALSE(decide(f.c, call(hcCollAllGather, 10), ok(), nullptr).fallback) << "HICOLL_ALGO is for host buffers";
  }
  {
    FakeComm f({"a", "a", "b"}, {});
    DeviceChoice d = decide(f.c, call(hcCollAllGather, 10), ok(), nullptr);
    EXPECT_TRUE(d.fallback);
    EXPECT_NE(d.reason.find("uneven"), std::string::npos) << d.reason;
  }
  {
    FakeComm f({"a", "a", "b", "b"}, {{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "8192"}});
    EXPECT_FALSE(decide(f.c, call(hcCollAllGather, 2048), ok(), nullptr).fallback) << "8 KiB block fits";
    DeviceChoice d = decide(f.c, call(hcCollAllGather, 2049), ok(), nullptr);
    EXPECT_TRUE(d.fallback);
    EXPECT_NE(d.reason.find("SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES"), std::string::npos) << d.reason;
  }
  {
    FakeComm f({"a", "b", "c", "d"}, {{"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", "16384"}});
    EXPECT_FALSE(decide(f.c, call(hcCollAllGather, 1024), ok(), nullptr).fallback) << "4 x 4 KiB fits";
    DeviceChoice d = decide(f.c, call(hcCollAllGather, 1025), ok(), nullptr);
    EXPECT_TRUE(d.fallback);
    EXPECT_NE(d.reason.find("SMDDP_AG_SORT_BUFFER_SIZE_BYTES"), std::string::npos) << d.reason;
    d = decide(f.c, call(hcCollReduceScatter, 1025), ok(), nullptr);
    EXPECT_TRUE(d.fallback) << "ReduceScatter receives N partial blocks into the sort buffer";
    EXPECT_NE(d.reason.find("SMDDP_AG_SORT_BUFFER_SIZE_BYTES"), std::string::npos) << d.reason;
  }
  {
    FakeComm f({"a", "a"}, {});
    DeviceChoice d = decide(f.c, call(hcCollAllGather, 10), EngineStatus{false, "CUDA IPC: no peer access"}, nullptr);
    EXPECT_TRUE(d.fallback);
    EXPECT_EQ(d.reason, "CUDA IPC: no peer access");
  }
}

}  // namespace
