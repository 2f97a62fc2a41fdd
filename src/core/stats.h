// What a communicator counts for hcCommGetStats: calls per path, bytes per level, the plan's
// figures. Calls run on one thread at a time, but hcCommGetStats may read from another.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "base/identity.h"
#include "hicoll/hicoll.h"

namespace hicoll {

class Stats {
 public:
  explicit Stats(const Identity& id) : id_(id) {}

  // The identity's fields of hcStats (rank, nodes, ...), once it is known.
  void start();
  void countCall(hcColl_t c, hcPath_t path, const std::string& fallback_reason = "", double predicted_s = 0,
                 size_t chunk_bytes = 0, size_t net_window = 0);
  void countBytes(hcColl_t c, int peer, size_t bytes);
  // A host call's count and the bytes it moved per level, under one lock: a small call's
  // locks were a measurable part of its time.
  struct Call {
    hcColl_t coll;
    hcPath_t path;
    const std::string& fallback_reason;
    double predicted_s;
    size_t chunk_bytes, net_window;
    size_t bytes_intra, bytes_inter;
  };
  void count(const Call& call);
  void countNodeMemory(hcColl_t c, size_t bytes);  // of those, read from a peer's node memory
  // predicted_s > 0: the model's time of the whole quantized call (its pieces counted their own).
  void countQuantized(hcColl_t c, double predicted_s = 0);
  // A point-to-point operation completed; a message copied aside (algorithms/p2p.h).
  void countP2p(bool send, size_t bytes);
  void countP2pCopiedAside();
  // The cost model's figures in use (hcStats.model_*).
  void setModel(double net_Bps, const std::string& source);
  hcStats snapshot() const;

 private:
  const Identity& id_;
  mutable std::mutex mu_;
  hcStats s_{};
  // What every call or message updates lives outside s_: relaxed atomics written by the one
  // thread in a call, loaded by snapshot() on any thread (a lock per call cost a small call's
  // time). s_ keeps the rest, under mu_.
  struct Hot {
    std::atomic<uint64_t> calls[hcNumColls][hcNumPaths] = {};
    std::atomic<uint64_t> bytes_intra[hcNumColls] = {}, bytes_inter[hcNumColls] = {};
    std::atomic<double> predicted_us[hcNumColls] = {};
    std::atomic<uint64_t> chunk_bytes[hcNumColls] = {}, net_window[hcNumColls] = {};
    std::atomic<uint64_t> p2p[4] = {};  // sends, receives, bytes sent, bytes received
  } hot_;
};

}  // namespace hicoll
