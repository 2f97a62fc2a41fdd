// Tier 2: ranks as threads, bootstrapped through the injectable store (hcCommInitRankStore)
// and through hcGetUniqueId / hcCommInitRank.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "../mp/checks.h"
#include "hicoll/hicoll.hpp"

namespace {

// A key-value store as a c10d Store would be handed in: C callbacks over a map.
struct MapStore {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;
  static int set(void* ctx, const char* key, const void* v, size_t len) {
    auto* s = static_cast<MapStore*>(ctx);
    {
      std::lock_guard<std::mutex> l(s->mu);
      s->kv[key] = std::string(static_cast<const char*>(v), len);
    }
    s->cv.notify_all();
    return 0;
  }
  static int get(void* ctx, const char* key, void* v, size_t len, int timeout_ms) {
    auto* s = static_cast<MapStore*>(ctx);
    std::unique_lock<std::mutex> l(s->mu);
    if (!s->cv.wait_for(l, std::chrono::milliseconds(timeout_ms), [&] { return s->kv.count(key) > 0; })) return 1;
    const std::string& x = s->kv[key];
    if (x.size() != len) return 2;
    std::memcpy(v, x.data(), len);
    return 0;
  }
  static int del(void* ctx, const char* key) {
    auto* s = static_cast<MapStore*>(ctx);
    std::lock_guard<std::mutex> l(s->mu);
    s->kv.erase(key);
    return 0;
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return kv.size();
  }
  hcStoreOps ops() { return hcStoreOps{sizeof(hcStoreOps), this, &MapStore::set, &MapStore::get, &MapStore::del}; }
};

void onThreads(int n, const std::function<void(int, hcComm_t)>& body) {
  MapStore store;
  hcStoreOps ops = store.ops();
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      hcComm_t c = nullptr;
      ASSERT_EQ(hcCommInitRankStore(&c, n, r, &ops, "test"), hcSuccess) << hcGetLastError(nullptr);
      body(r, c);
      EXPECT_EQ(hcCommDestroy(c), hcSuccess);
    });
  for (auto& t : ts) t.join();
}

// A stale handle is refused, not used: after destroy, every call (destroy and abort included)
// returns hcInvalidArgument and says why.
TEST(Api, DestroyedHandlesAreRefused) {
  MapStore store;
  hcStoreOps ops = store.ops();
  hcComm_t c = nullptr;
  ASSERT_EQ(hcCommInitRankStore(&c, 1, 0, &ops, "stale"), hcSuccess);
  ASSERT_EQ(hcCommDestroy(c), hcSuccess);
  int n = 0;
  float x = 1;
  EXPECT_EQ(hcCommCount(c, &n), hcInvalidArgument);
  EXPECT_EQ(hcAllReduce(&x, &x, 1, hcFloat32, hcSum, c, nullptr), hcInvalidArgument);
  EXPECT_NE(std::string(hcGetLastError(nullptr)).find("destroyed"), std::string::npos) << hcGetLastError(nullptr);
  EXPECT_EQ(hcCommDestroy(c), hcInvalidArgument);
  EXPECT_EQ(hcCommAbort(c), hcInvalidArgument);
  hcComm_t sub = nullptr;
  EXPECT_EQ(hcCommSplit(c, 0, 0, &sub), hcInvalidArgument);
  EXPECT_EQ(hcBarrier(nullptr), hcInvalidArgument);
}

// The bootstrap deletes the keys nobody reads any more: the store does not grow with the
// number of bootstrap operations (creation, splits).
TEST(Api, BootstrapKeysAreFreed) {
  MapStore store;
  hcStoreOps ops = store.ops();
  std::vector<size_t> sizes(3);
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] {
      hcComm_t c = nullptr;
      ASSERT_EQ(hcCommInitRankStore(&c, 3, r, &ops, "gc"), hcSuccess) << hcGetLastError(nullptr);
      for (int i = 0; i < 20; ++i) {
        hcComm_t sub = nullptr;
        ASSERT_EQ(hcCommSplit(c, r % 2, r, &sub), hcSuccess);
        hcCommDestroy(sub);
      }
      hcBarrier(c);
      sizes[r] = store.size();
      hcCommDestroy(c);
    });
  for (auto& t : ts) t.join();
  // Each split's group creation runs several bootstrap exchanges; without deletion the
  // store held hundreds of keys by now.
  for (size_t s : sizes) EXPECT_LE(s, 12u) << "keys left in the store";
}

// A per-communicator configuration overrides the environment for that communicator only, a
// split inherits its parent's (with its own overrides on top), and bad values name the field.
TEST(Api, PerCommunicatorConfiguration) {
  MapStore store;
  hcStoreOps ops = store.ops();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      auto fail = [&](const std::string& m) { errors[r] += m + "; "; };
      hcConfig_t cfg = HC_CONFIG_INITIALIZER;
      cfg.algo = "ring";
      cfg.netWindow = 7;
      cfg.name = "cfgtest";
      hcComm_t c = nullptr;
      if (hcCommInitRankStoreConfig(&c, 2, r, &ops, "cfg", &cfg) != hcSuccess) return fail(hcGetLastError(nullptr));
      hcConfig_t got = HC_CONFIG_INITIALIZER;
      if (hcCommGetConfig(c, &got) != hcSuccess) fail("get");
      if (std::string(got.algo) != "ring" || got.netWindow != 7 || std::string(got.name) != "cfgtest")
        fail("overrides");
      if (got.timeoutMs != 120000 || got.chunkBytes != 1 << 20) fail("defaults from the environment");
      float x = 1;
      if (hcAllReduce(&x, &x, 1, hcFloat32, hcSum, c, nullptr) != hcSuccess || x != 2) fail("allreduce");
      hcStats st = HC_STATS_INITIALIZER;
      hcCommGetStats(c, &st);
      if (st.coll[hcCollAllReduce].calls[hcPathRing] != 1) fail("the ring ran");
      // The split inherits, and its own config goes on top.
      hcConfig_t child_cfg = HC_CONFIG_INITIALIZER;
      child_cfg.chunkBytes = 65536;
      hcComm_t child = nullptr;
      if (hcCommSplitConfig(c, 0, r, &child, &child_cfg) != hcSuccess) return fail(hcGetLastError(nullptr));
      hcConfig_t cg = HC_CONFIG_INITIALIZER;
      hcCommGetConfig(child, &cg);
      if (std::string(cg.algo) != "ring" || cg.netWindow != 7 || cg.chunkBytes != 65536) fail("inherited");
      // A bad value: the variable's check, naming the field, on this communicator only.
      hcConfig_t bad = HC_CONFIG_INITIALIZER;
      bad.netWindow = 0;
      hcComm_t none = nullptr;
      if (hcCommSplitConfig(c, 0, r, &none, &bad) != hcInvalidArgument) fail("netWindow 0 accepted");
      const std::string msg = hcGetLastError(nullptr);
      if (msg.find("netWindow") == std::string::npos || msg.find("HICOLL_NET_WINDOW") == std::string::npos) fail(msg);
      // An older, shorter hcConfig_t (a caller built against a previous header) is read as far as it goes.
      hcConfig_t old = HC_CONFIG_INITIALIZER;
      old.size = offsetof(hcConfig_t, topoNode);
      old.timeoutMs = 1;  // beyond its size: not read
      hcComm_t o = nullptr;
      if (hcCommSplitConfig(c, 0, r, &o, &old) != hcSuccess) fail("short config");
      hcConfig_t og = HC_CONFIG_INITIALIZER;
      hcCommGetConfig(o, &og);
      if (og.timeoutMs != 120000) fail("read past size");
      hcCommDestroy(o);
      hcCommDestroy(child);
      hcCommDestroy(c);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// A split where one rank's configuration is rejected: that rank still takes part, so every rank
// of its new group fails the split at once (naming it and its reason) instead of waiting out the
// timeout, the other group's split succeeds, and the parent stays usable on every rank. An
// unknown hcConfig_t.version is such a rejection too.
TEST(Api, SplitWithOneRejectedConfigFailsItsGroupFastAndKeepsTheParent) {
  MapStore store;
  hcStoreOps ops = store.ops();
  std::vector<std::string> errors(4);
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r)
    ts.emplace_back([&, r] {
      auto fail = [&](const std::string& m) { errors[r] += m + "; "; };
      hcConfig_t pcfg = HC_CONFIG_INITIALIZER;
      pcfg.timeoutMs = 5000;
      hcComm_t c = nullptr;
      if (hcCommInitRankStoreConfig(&c, 4, r, &ops, "splitcfg", &pcfg) != hcSuccess)
        return fail(hcGetLastError(nullptr));
      auto allReduceWorks = [&](const char* when) {
        float x = 1;
        if (hcAllReduce(&x, &x, 1, hcFloat32, hcSum, c, nullptr) != hcSuccess || x != 4)
          fail(std::string("the parent failed ") + when + ": " + hcGetLastError(c));
      };
      // Groups {0, 2} and {1, 3}; rank 1's window is out of range.
      hcConfig_t cfg = HC_CONFIG_INITIALIZER;
      cfg.chunkBytes = 65536;
      if (r == 1) cfg.netWindow = 0;
      hcComm_t child = nullptr;
      auto t0 = std::chrono::steady_clock::now();
      const hcResult_t res = hcCommSplitConfig(c, r % 2, r, &child, &cfg);
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string msg = hcGetLastError(nullptr);
      if (took > 2.0) fail("the split took " + std::to_string(took) + " s");
      if (r % 2 == 0) {
        if (res != hcSuccess) fail("the other group's split: " + msg);
        hcCommDestroy(child);
      } else {
        if (res != hcInvalidArgument || child) fail("a split with a rejected config: " + msg);
        if (msg.find("netWindow") == std::string::npos) fail("the reason is not named: " + msg);
        if (r == 3 && msg.find("rank 1") == std::string::npos) fail("the rejecting rank is not named: " + msg);
      }
      allReduceWorks("after a rejected split");
      // A version no header of this library had: every rank rejects it, naming the field.
      hcConfig_t stranger = HC_CONFIG_INITIALIZER;
      stranger.version = 0xdeadbeef;
      if (hcCommSplitConfig(c, 0, r, &child, &stranger) != hcInvalidArgument || child)
        fail("hcConfig_t.version 0xdeadbeef accepted");
      else if (std::string(hcGetLastError(nullptr)).find("hcConfig_t.version") == std::string::npos)
        fail(std::string("the version is not named: ") + hcGetLastError(nullptr));
      allReduceWorks("after an unknown version");
      hcCommDestroy(c);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(Api, MatrixOnThreeThreads) {
  onThreads(3, [](int, hcComm_t c) { EXPECT_EQ(hctest::checkMatrix(c, {0, 1, 17, 1000}), 0); });
}

TEST(Api, UniqueIdRendezvous) {
  hcUniqueId id;
  ASSERT_EQ(hcGetUniqueId(&id), hcSuccess);
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r)
    ts.emplace_back([&, r] {
      hcComm_t c = nullptr;
      ASSERT_EQ(hcCommInitRank(&c, 4, id, r), hcSuccess) << hcGetLastError(nullptr);
      EXPECT_EQ(hctest::checkAllReduce(c, hcFloat32, hcSum, 999, false, 1), 0);
      EXPECT_EQ(hcBarrier(c), hcSuccess);
      hcCommDestroy(c);
    });
  for (auto& t : ts) t.join();
}

TEST(Api, InvalidArgumentsAreRejectedWithAMessage) {
  onThreads(2, [](int rank, hcComm_t c) {
    std::vector<float> buf(64);
    EXPECT_EQ(hcAllGather(buf.data(), buf.data(), 4, static_cast<hcDataType_t>(42), c, nullptr), hcInvalidArgument);
    EXPECT_NE(std::string(hcGetLastError(c)).find("datatype"), std::string::npos);
    EXPECT_EQ(hcAllGather(nullptr, buf.data(), 4, hcFloat32, c, nullptr), hcInvalidArgument);
    // Overlapping, but not the in-place position.
    EXPECT_EQ(hcAllGather(buf.data() + 1, buf.data(), 4, hcFloat32, c, nullptr), hcInvalidArgument);
    EXPECT_NE(std::string(hcGetLastError(c)).find("in place"), std::string::npos);
    EXPECT_EQ(hcReduceScatter(buf.data(), buf.data() + 1, 4, hcFloat32, hcSum, c, nullptr), hcInvalidArgument);
    EXPECT_EQ(hcAllReduce(buf.data(), buf.data() + 1, 4, hcFloat32, hcSum, c, nullptr), hcInvalidArgument);
    EXPECT_EQ(hcBroadcast(buf.data(), buf.data(), 4, hcFloat32, 7, c, nullptr), hcInvalidArgument);
    EXPECT_EQ(hcAllReduce(buf.data(), buf.data(), 4, hcFloat32, static_cast<hcRedOp_t>(77), c, nullptr),
              hcInvalidArgument);
    // A stream in a build without CUDA, or device work on host memory: never silently wrong.
    hcResult_t r = hcAllGather(buf.data(), buf.data() + 32, 4, hcFloat32, c, reinterpret_cast<void*>(1));
    EXPECT_NE(r, hcSuccess);
    // A count whose bytes (times the ranks) overflow size_t; the largest that does not passes
    // that check (and is then refused for its NULL buffer, not its size).
    const size_t over = SIZE_MAX / 4 / 2 + 1;
    EXPECT_EQ(hcAllGather(nullptr, buf.data(), over, hcFloat32, c, nullptr), hcInvalidArgument);
    EXPECT_NE(std::string(hcGetLastError(c)).find("count " + std::to_string(over) + " overflows"), std::string::npos)
        << hcGetLastError(c);
    EXPECT_EQ(hcAllGather(nullptr, buf.data(), over - 1, hcFloat32, c, nullptr), hcInvalidArgument);
    EXPECT_NE(std::string(hcGetLastError(c)).find("NULL buffer"), std::string::npos) << hcGetLastError(c);
    // Zero counts complete at once, even with NULL buffers.
    EXPECT_EQ(hcAllGather(nullptr, nullptr, 0, hcFloat32, c, nullptr), hcSuccess);
    EXPECT_EQ(hcReduceScatter(nullptr, nullptr, 0, hcFloat32, hcSum, c, nullptr), hcSuccess);
    // Still usable afterwards.
    EXPECT_EQ(hctest::checkAllGather(c, hcInt64, 10, rank == 0, 3), 0);
  });
}

// Point-to-point arguments this rank can see are wrong: refused with a message, nothing posted,
// the communicator still usable (a send and receive between the two threads then work).
TEST(Api, PointToPointArgumentsAreRejectedWithAMessage) {
  onThreads(2, [](int rank, hcComm_t c) {
    std::vector<int32_t> buf(16, rank), in(16, -1);
    const int peer = 1 - rank;
    auto last = [&] { return std::string(hcGetLastError(c)); };
    EXPECT_EQ(hcSend(buf.data(), 16, hcInt32, 2, c, nullptr), hcInvalidArgument);
    EXPECT_NE(last().find("peer 2 is outside [0, 2)"), std::string::npos) << last();
    EXPECT_EQ(hcRecv(buf.data(), 16, hcInt32, -1, c, nullptr), hcInvalidArgument);
    EXPECT_EQ(hcSend(nullptr, 16, hcInt32, peer, c, nullptr), hcInvalidArgument);
    EXPECT_NE(last().find("NULL buffer"), std::string::npos) << last();
    EXPECT_EQ(hcSend(buf.data(), 16, static_cast<hcDataType_t>(42), peer, c, nullptr), hcInvalidArgument);
    // Device buffers go to NCCL: what NCCL cannot do is refused before anything is created.
    void* stream = reinterpret_cast<void*>(1);
    EXPECT_EQ(hcSendTag(buf.data(), 16, hcInt32, peer, 3, c, stream), hcUnsupported);
    EXPECT_NE(last().find("no tags"), std::string::npos) << last();
    EXPECT_EQ(hcSend(buf.data(), 16, hcInt32, rank, c, stream), hcInvalidUsage);
    EXPECT_NE(last().find("must be in a group"), std::string::npos) << last();
    // Then the device path: no CUDA in this build, or no device on this machine.
    EXPECT_NE(hcSend(buf.data(), 16, hcInt32, peer, c, stream), hcSuccess);
    EXPECT_TRUE(last().find("no CUDA support") != std::string::npos || last().find("CUDA device") != std::string::npos)
        << last();
    hcRequest_t r = nullptr;
    EXPECT_EQ(hcIsend(buf.data(), 16, hcInt32, peer, c, nullptr), hcInvalidArgument);
    EXPECT_EQ(hcIrecv(buf.data(), 16, hcInt32, -3, c, &r), hcInvalidArgument);
    EXPECT_EQ(r, nullptr);
    int done = 0;
    EXPECT_EQ(hcTest(nullptr, &done), hcInvalidArgument);
    EXPECT_EQ(hcWait(nullptr), hcInvalidArgument);
    EXPECT_EQ(hcGroupEnd(), hcInvalidUsage);
    EXPECT_NE(std::string(hcGetLastError(nullptr)).find("hcGroupStart"), std::string::npos);
    EXPECT_EQ(hcSend(buf.data(), 16, hcInt32, peer, nullptr, nullptr), hcInvalidArgument);
    // Still usable: one exchange, values checked.
    EXPECT_EQ(hcGroupStart(), hcSuccess);
    EXPECT_EQ(hcSend(buf.data(), 16, hcInt32, peer, c, nullptr), hcSuccess);
    EXPECT_EQ(hcRecv(in.data(), 16, hcInt32, peer, c, nullptr), hcSuccess);
    EXPECT_EQ(hcGroupEnd(), hcSuccess) << last();
    EXPECT_EQ(in, std::vector<int32_t>(16, peer));
  });
  // A destroyed communicator is refused by name.
  MapStore store;
  hcStoreOps ops = store.ops();
  hcComm_t c = nullptr;
  ASSERT_EQ(hcCommInitRankStore(&c, 1, 0, &ops, "p2pstale"), hcSuccess);
  int32_t x = 1;
  hcRequest_t r = nullptr;
  ASSERT_EQ(hcIrecv(&x, 1, hcInt32, 0, c, &r), hcSuccess);
  ASSERT_EQ(hcCommDestroy(c), hcSuccess);
  EXPECT_EQ(hcSend(&x, 1, hcInt32, 0, c, nullptr), hcInvalidArgument);
  EXPECT_NE(std::string(hcGetLastError(nullptr)).find("destroyed"), std::string::npos) << hcGetLastError(nullptr);
  EXPECT_EQ(hcWait(r), hcInvalidArgument);  // frees the request all the same
}

TEST(Api, PreMulSumLifecycle) {
  onThreads(2, [](int, hcComm_t c) {
    float s = 0.25f;
    hcRedOp_t op;
    ASSERT_EQ(hcRedOpCreatePreMulSum(&op, &s, hcFloat32, c), hcSuccess);
    EXPECT_GE(static_cast<int>(op), static_cast<int>(hcNumOps));
    std::vector<float> in(10, 4.0f), out(10);
    ASSERT_EQ(hcAllReduce(in.data(), out.data(), 10, hcFloat32, op, c, nullptr), hcSuccess);
    for (float v : out) EXPECT_EQ(v, 2.0f);  // 0.25 * (4 + 4)
    EXPECT_EQ(hcRedOpDestroy(op, c), hcSuccess);
    EXPECT_EQ(hcRedOpDestroy(op, c), hcInvalidArgument);
    EXPECT_EQ(hcAllReduce(in.data(), out.data(), 10, hcFloat32, op, c, nullptr), hcInvalidArgument);
  });
}

TEST(Api, StatsCountCallsByPath) {
  onThreads(2, [](int, hcComm_t c) {
    std::vector<float> in(100, 1), out(200);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(hcAllGather(in.data(), out.data(), 100, hcFloat32, c, nullptr), hcSuccess);
    hcStats s = HC_STATS_INITIALIZER;
    ASSERT_EQ(hcCommGetStats(c, &s), hcSuccess);
    EXPECT_EQ(s.nranks, 2);
    EXPECT_EQ(s.nnodes, 1);
    EXPECT_EQ(s.coll[hcCollAllGather].calls[hcPathHierarchical], 3u);
    EXPECT_EQ(s.coll[hcCollAllGather].bytes_inter, 0u);
    EXPECT_EQ(s.coll[hcCollAllGather].bytes_intra, 3u * 400);  // one peer's block per call
  });
}

TEST(Api, CppRaiiWrapper) {
  MapStore store;
  hcStoreOps ops = store.ops();
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      hicoll::Comm comm = hicoll::Comm::fromStore(2, r, ops, "raii");
      std::vector<int32_t> in{r + 1}, out(2);
      comm.allGather(in.data(), out.data(), 1, hcInt32);
      EXPECT_EQ(out, (std::vector<int32_t>{1, 2}));
      hicoll::Comm sub = comm.split(0, -r);
      EXPECT_EQ(sub.rank(), 1 - r);
      try {
        comm.allReduce(in.data(), out.data(), 1, static_cast<hcDataType_t>(42), hcSum);
        ADD_FAILURE() << "no exception";
      } catch (const hicoll::CommError& e) {
        EXPECT_EQ(e.code(), hcInvalidArgument);
      }
    });
  for (auto& t : ts) t.join();
}

}  // namespace
