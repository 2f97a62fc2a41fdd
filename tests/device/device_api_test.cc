// Device calls through the public API on a machine without a GPU: the device engine is created
// collectively at the first call with a stream and every rank gets a clear error status (no
// CUDA in the build: hcUnsupported; CUDA but no device: hcSystemError), never a hang or a
// crash. On a machine with a GPU the GPU tests (tests/gpu) cover these calls instead.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hicoll/hicoll.h"
#ifdef HICOLL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

// An in-memory key-value store for hcCommInitRankStore (ranks are threads).
struct MemStore {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<char>> kv;

  static int set(void* ctx, const char* key, const void* value, size_t len) {
    auto* s = static_cast<MemStore*>(ctx);
    {
      std::lock_guard<std::mutex> lk(s->mu);
      s->kv[key].assign(static_cast<const char*>(value), static_cast<const char*>(value) + len);
    }
    s->cv.notify_all();
    return 0;
  }
  static int get(void* ctx, const char* key, void* value, size_t len, int timeout_ms) {
    auto* s = static_cast<MemStore*>(ctx);
    std::unique_lock<std::mutex> lk(s->mu);
    if (!s->cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return s->kv.count(key) > 0; })) return 1;
    const auto& v = s->kv[key];
    if (v.size() != len) return 1;
    std::memcpy(value, v.data(), len);
    return 0;
  }
};

TEST(DeviceApi, WithoutAGpuEveryRankGetsAClearError) {
#ifdef HICOLL_HAVE_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) GTEST_SKIP() << "a GPU is here: tests/gpu covers it";
  const hcResult_t want = hcSystemError;
#else
  const hcResult_t want = hcUnsupported;
#endif
  constexpr int kRanks = 2;
  MemStore store;
  hcStoreOps ops{sizeof(hcStoreOps), &store, &MemStore::set, &MemStore::get};
  std::vector<hcResult_t> first(kRanks, hcSuccess), second(kRanks, hcSuccess);
  std::vector<std::string> msg(kRanks);
  std::vector<std::thread> ts;
  for (int r = 0; r < kRanks; ++r)
    ts.emplace_back([&, r] {
      hcComm_t comm = nullptr;
      ASSERT_EQ(hcCommInitRankStore(&comm, kRanks, r, &ops, "devapi/"), hcSuccess) << hcGetLastError(nullptr);
      std::vector<float> buf(kRanks * 16);
      void* fake_stream = reinterpret_cast<void*>(0x1234);
      first[r] = hcAllGather(buf.data() + r * 16, buf.data(), 16, hcFloat32, comm, fake_stream);
      msg[r] = hcGetLastError(comm);
      second[r] = hcReduceScatter(buf.data(), buf.data() + r * 16, 16, hcFloat32, hcSum, comm, fake_stream);
      hcCommDestroy(comm);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(first[r], want) << "rank " << r << ": " << msg[r];
    EXPECT_FALSE(msg[r].empty()) << "rank " << r;
    EXPECT_NE(second[r], hcSuccess) << "rank " << r << ": a later device call fails too";
  }
}

}  // namespace
