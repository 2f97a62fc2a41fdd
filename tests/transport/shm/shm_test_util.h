// Ranks as threads of one process over the shared-memory transport (the way
// tests/transport/ofi runs the libfabric one): one in-memory store, one Bootstrap and one
// ShmTransport per thread; the threads share one mapping of every segment.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../../common/thread_ranks.h"
#include "base/deadline.h"
#include "base/error.h"
#include "base/identity.h"
#include "base/topology.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/store.h"
#include "transport/shm/shm_transport.h"
#include "transport/transport.h"

namespace hicoll {
namespace shmtest {

using Clock = std::chrono::steady_clock;
constexpr long kTimeoutMs = 5000;

inline double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline uint8_t pattern(size_t i, uint32_t seed) {
  return static_cast<uint8_t>(((i + 1) * 2654435761u + seed * 40503u) >> 11);
}
inline std::vector<uint8_t> makeData(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(i, seed);
  return v;
}
// Index of the first byte that differs from the pattern, or -1.
inline long firstWrong(const uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != pattern(i, seed)) return static_cast<long>(i);
  return -1;
}

inline void waitReqs(Transport& t, std::vector<ReqId> reqs, long ms = kTimeoutMs) {
  waitAll(t, reqs, Deadline(ms), "shm test");
}

struct Rank {
  int rank, size;
  Bootstrap& bs;
  std::unique_ptr<ShmTransport>& tp;  // fn may reset it (a rank that destroys its communicator)
  const Identity& id;
  bool close_at_once = false;  // set by fn to skip the final barrier
  ShmTransport& t() { return *tp; }
};

// Runs fn on n threads, each a rank with its own ShmTransport over the ranks of its node
// (node[r]: the node of rank r; empty: all on node 0). Exceptions become test failures. The
// ranks meet at a barrier before destroying their transports: a receiver may still be copying
// from a sender's buffer.
inline void runRanks(int n, const std::function<void(Rank&)>& fn, const ShmOptions& opt = {},
                     std::vector<int> node = {}) {
  if (node.empty()) node.assign(n, 0);
  std::vector<std::string> labels, hosts(n, "host");
  for (int r = 0; r < n; ++r) labels.push_back("n" + std::to_string(node[r]));
  hctest::onRankThreads(n, "shm-test", kTimeoutMs, [&](int r, Bootstrap& bs) {
    Identity id;
    id.rank = r;
    id.nranks = n;
    id.topo = Topology::build(labels, hosts);
    std::vector<int> local;
    for (int p = 0; p < n; ++p)
      if (node[p] == node[r]) local.push_back(p);
    auto t = std::make_unique<ShmTransport>(bs, local, opt);
    Rank ctx{r, n, bs, t, id};
    fn(ctx);
    if (!ctx.close_at_once) bs.barrier();
  });
}

using hctest::expectError;

// Every rank's value, in rank order.
template <class T>
std::vector<T> allgatherValue(Bootstrap& bs, const T& mine) {
  std::vector<T> all(bs.size());
  bs.allgather(&mine, all.data(), sizeof(T));
  return all;
}

// shm_transport.cc: kBounceBytes (the ring per ordered pair), kQueueDepth (descriptors).
constexpr size_t kBounce = 256 << 10;
constexpr int kQueueDepth = 64;

// Tests run with both copy paths: direct (ranks are threads: memcpy from the sender's buffer)
// and the bounce ring (HICOLL_SHM_CMA=0: kBounce per ordered pair, two copies).
class ShmCopyModes : public ::testing::TestWithParam<std::string> {
 protected:
  ShmOptions opt() const {
    ShmOptions o;
    o.cma = GetParam();
    o.timeout_ms = kTimeoutMs;
    return o;
  }
};
inline std::string copyModeName(const ::testing::TestParamInfo<std::string>& p) {
  return p.param == "0" ? "bounce" : "direct";
}

}  // namespace shmtest
}  // namespace hicoll
