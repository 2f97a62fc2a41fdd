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

namespace {
// One writer at a time: no read-modify-write needed, only an atomic store for the readers.
void bump(std::atomic<uint64_t>& a, uint64_t n) {
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
}  // namespace

void Stats::countCall(hcColl_t c, hcPath_t path, const std::string& reason, double predicted_s, size_t chunk_bytes,
                      size_t net_window) {
  bump(hot_.calls[c][path], 1);
  hot_.predicted_us[c].store(predicted_s * 1e6, std::memory_order_relaxed);
  hot_.chunk_bytes[c].store(chunk_bytes, std::memory_order_relaxed);
  hot_.net_window[c].store(net_window, std::memory_order_relaxed);
  if (path == hcPathFallback && !reason.empty()) {  // a ring the model chose is no fallback
    std::lock_guard<std::mutex> lock(mu_);
    std::snprintf(s_.coll[c].last_fallback_reason, sizeof s_.coll[c].last_fallback_reason, "%s", reason.c_str());
  }
}

void Stats::count(const Call& k) {
  countCall(k.coll, k.path, k.fallback_reason, k.predicted_s, k.chunk_bytes, k.net_window);
  bump(hot_.bytes_intra[k.coll], k.bytes_intra);
  bump(hot_.bytes_inter[k.coll], k.bytes_inter);
}

void Stats::countQuantized(hcColl_t c, double predicted_s) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.quantized_calls[c]++;
  if (predicted_s > 0) hot_.predicted_us[c].store(predicted_s * 1e6, std::memory_order_relaxed);
}

void Stats::countP2p(bool send, size_t bytes) {
  bump(hot_.p2p[send ? 0 : 1], 1);
  bump(hot_.p2p[send ? 2 : 3], bytes);
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
  bump(id_.sameNode(peer) ? hot_.bytes_intra[c] : hot_.bytes_inter[c], bytes);
}

void Stats::setModel(double net_Bps, const std::string& source) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.model_net_Bps = net_Bps;
  std::snprintf(s_.model_source, sizeof s_.model_source, "%s", source.c_str());
}

hcStats Stats::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  hcStats s = s_;
  auto get = [](const auto& a) { return a.load(std::memory_order_relaxed); };
  for (int c = 0; c < hcNumColls; ++c) {
    for (int p = 0; p < hcNumPaths; ++p) s.coll[c].calls[p] = get(hot_.calls[c][p]);
    s.coll[c].bytes_intra = get(hot_.bytes_intra[c]);
    s.coll[c].bytes_inter = get(hot_.bytes_inter[c]);
    s.predicted_us[c] = get(hot_.predicted_us[c]);
    s.chunk_bytes[c] = get(hot_.chunk_bytes[c]);
    s.net_window[c] = get(hot_.net_window[c]);
  }
  s.p2p_sends = get(hot_.p2p[0]);
  s.p2p_recvs = get(hot_.p2p[1]);
  s.p2p_bytes_sent = get(hot_.p2p[2]);
  s.p2p_bytes_received = get(hot_.p2p[3]);
  return s;
}

}  // namespace hicoll
