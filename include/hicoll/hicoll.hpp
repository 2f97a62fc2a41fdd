// A thin C++ layer over hicoll.h: RAII communicators and exceptions instead of status codes.
// Header-only, so it adds nothing to the C ABI.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include "hicoll/hicoll.h"

namespace hicoll {

class CommError : public std::runtime_error {
 public:
  CommError(hcResult_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  hcResult_t code() const { return code_; }

 private:
  hcResult_t code_;
};

inline void check(hcResult_t r, const char* call) {
  if (r != hcSuccess)
    throw CommError(r, std::string(call) + ": " + hcGetErrorString(r) + ": " + hcGetLastError(nullptr));
}

class Comm {
 public:
  Comm() = default;
  explicit Comm(hcComm_t c) : c_(c) {}
  Comm(Comm&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  Comm& operator=(Comm&& o) noexcept {
    if (this != &o) {
      reset();
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() { reset(); }

  // config: per-communicator overrides of the environment (nullptr: none).
  static Comm fromEnv(const hcConfig_t* config = nullptr) {
    hcComm_t c = nullptr;
    check(hcCommInitFromEnvConfig(&c, config), "hcCommInitFromEnv");
    return Comm(c);
  }
  static Comm fromUniqueId(int nranks, const hcUniqueId& id, int rank, const hcConfig_t* config = nullptr) {
    hcComm_t c = nullptr;
    check(hcCommInitRankConfig(&c, nranks, id, rank, config), "hcCommInitRank");
    return Comm(c);
  }
  static Comm fromStore(int nranks, int rank, const hcStoreOps& store, const char* prefix = "hc",
                        const hcConfig_t* config = nullptr) {
    hcComm_t c = nullptr;
    check(hcCommInitRankStoreConfig(&c, nranks, rank, &store, prefix, config), "hcCommInitRankStore");
    return Comm(c);
  }

  // An empty Comm for ranks that passed HC_SPLIT_NOCOLOR. The child inherits this
  // communicator's configuration, with config's overrides on top.
  Comm split(int color, int key, const hcConfig_t* config = nullptr) const {
    hcComm_t c = nullptr;
    check(hcCommSplitConfig(c_, color, key, &c, config), "hcCommSplit");
    return Comm(c);
  }

  hcConfig_t config() const {
    hcConfig_t cfg = HC_CONFIG_INITIALIZER;
    check(hcCommGetConfig(c_, &cfg), "hcCommGetConfig");
    return cfg;
  }

  int rank() const {
    int r = -1;
    check(hcCommUserRank(c_, &r), "hcCommUserRank");
    return r;
  }
  int size() const {
    int n = 0;
    check(hcCommCount(c_, &n), "hcCommCount");
    return n;
  }
  hcStats stats() const {
    hcStats s = HC_STATS_INITIALIZER;
    check(hcCommGetStats(c_, &s), "hcCommGetStats");
    return s;
  }

  void allGather(const void* send, void* recv, size_t sendcount, hcDataType_t t, hcStream_t s = nullptr) {
    check(hcAllGather(send, recv, sendcount, t, c_, s), "hcAllGather");
  }
  void reduceScatter(const void* send, void* recv, size_t recvcount, hcDataType_t t, hcRedOp_t op,
                     hcStream_t s = nullptr) {
    check(hcReduceScatter(send, recv, recvcount, t, op, c_, s), "hcReduceScatter");
  }
  void allReduce(const void* send, void* recv, size_t count, hcDataType_t t, hcRedOp_t op, hcStream_t s = nullptr) {
    check(hcAllReduce(send, recv, count, t, op, c_, s), "hcAllReduce");
  }
  void broadcast(const void* send, void* recv, size_t count, hcDataType_t t, int root, hcStream_t s = nullptr) {
    check(hcBroadcast(send, recv, count, t, root, c_, s), "hcBroadcast");
  }
  void barrier() { check(hcBarrier(c_), "hcBarrier"); }

  hcComm_t get() const { return c_; }
  explicit operator bool() const { return c_ != nullptr; }
  // Marks the communicator failed for the peers, then frees it.
  void abort() {
    if (c_) hcCommAbort(std::exchange(c_, nullptr));
  }

 private:
  void reset() {
    if (c_) hcCommDestroy(std::exchange(c_, nullptr));
  }
  hcComm_t c_ = nullptr;
};

}  // namespace hicoll
