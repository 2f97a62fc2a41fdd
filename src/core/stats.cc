#include "core/stats.h"

#include <cstdio>

namespace hicoll {

void Stats::start() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.size = sizeof(hcStats);
  s_.rank = id_.rank;
  s_.nranks = id_.nranks;
  s_.nnodes = id_.topo.nnodes;
  s_.local_ranks = id_.topo.uniform ? id_.topo.localSize(0) : 0;
  s_.node = id_.node();
  s_.local_rank = id_.localRank();
}

void Stats::countCall(hcColl_t c, hcPath_t path, const std::string& reason, double predicted_s, size_t chunk_bytes,
                      size_t net_window) {
  std::lock_guard<std::mutex> lock(mu_);
  countCallLocked(c, path, reason, predicted_s, chunk_bytes, net_window);
}

void Stats::countCallLocked(hcColl_t c, hcPath_t path, const std::string& reason, double predicted_s,
                            size_t chunk_bytes, size_t net_window) {
  s_.coll[c].calls[path]++;
  s_.predicted_us[c] = predicted_s * 1e6;
  s_.chunk_bytes[c] = chunk_bytes;
  s_.net_window[c] = net_window;
  if (path == hcPathFallback && !reason.empty())  // a ring the model chose is no fallback
    std::snprintf(s_.coll[c].last_fallback_reason, sizeof s_.coll[c].last_fallback_reason, "%s", reason.c_str());
}

void Stats::count(const Call& k) {
  std::lock_guard<std::mutex> lock(mu_);
  countCallLocked(k.coll, k.path, k.fallback_reason, k.predicted_s, k.chunk_bytes, k.net_window);
  s_.coll[k.coll].bytes_intra += k.bytes_intra;
  s_.coll[k.coll].bytes_inter += k.bytes_inter;
}

void Stats::countQuantized(hcColl_t c, double predicted_s) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.quantized_calls[c]++;
  if (predicted_s > 0) s_.predicted_us[c] = predicted_s * 1e6;
}

void Stats::countP2p(bool send, size_t bytes) {
  auto bump = [](std::atomic<uint64_t>& a, uint64_t n) {
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  };
  bump(p2p_[send ? 0 : 1], 1);
  bump(p2p_[send ? 2 : 3], bytes);
}

void Stats::countP2pCopiedAside() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.p2p_copied_aside++;
}

void Stats::countNodeMemory(hcColl_t c, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.bytes_node_memory[c] += bytes;
}

void Stats::countBytes(hcColl_t c, int peer, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id_.sameNode(peer)) {
    s_.coll[c].bytes_intra += bytes;
  } else {
    s_.coll[c].bytes_inter += bytes;
  }
}

hcStats Stats::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  hcStats s = s_;
  s.p2p_sends = p2p_[0].load(std::memory_order_relaxed);
  s.p2p_recvs = p2p_[1].load(std::memory_order_relaxed);
  s.p2p_bytes_sent = p2p_[2].load(std::memory_order_relaxed);
  s.p2p_bytes_received = p2p_[3].load(std::memory_order_relaxed);
  return s;
}

}  // namespace hicoll
