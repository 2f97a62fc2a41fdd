#include "core/net_probe.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "base/deadline.h"
#include "base/error.h"

namespace hicoll {
namespace {

// Bit 62: no collective (below 2^60), agreement (bit 60), point-to-point (bit 61) or device
// message (below 2^57) carries it, so a peer already in its first call cannot match these.
constexpr uint64_t kProbeTag = uint64_t{1} << 62;

}  // namespace

LinkFigures probeLink(const Identity& id, Transport& net, Bootstrap& bs, const LinkProbe& p) {
  const Topology& t = id.topo;
  const int N = t.nnodes, n = id.node(), l = id.localRank();
  const int to = t.rankAt((n + 1) % N, l), from = t.rankAt((n + N - 1) % N, l);
  const size_t C = std::max<size_t>(1, std::min(p.chunk, p.bytes));
  const Deadline deadline(p.timeout_ms);
  auto exchange = [&](size_t bytes, uint64_t round) {
    std::vector<ReqId> reqs;
    for (size_t off = 0; off < bytes; off += C) {
      const size_t len = std::min(C, bytes - off), k = off / C;
      reqs.push_back(net.irecv(from, static_cast<char*>(p.recv) + off, len, kProbeTag | round << 32 | k));
      reqs.push_back(net.isend(to, static_cast<char*>(p.send) + off, len, kProbeTag | round << 32 | k));
    }
    waitUntil(
        [&] {
          for (ReqId& r : reqs)
            if (r && net.test(r)) r = 0;
          return std::all_of(reqs.begin(), reqs.end(), [](ReqId r) { return r == 0; });
        },
        deadline, [&] { p.check_peers(); },
        [&] {
          HC_THROW(hcTimeout,
                   "timed out after {} ms measuring the link with rank {} and rank {} (HICOLL_NET_PROBE_BYTES)",
                   p.timeout_ms, to, from);
        });
  };
  // One timed round of `bytes` per rank: every rank's time, from every rank.
  std::vector<double> all(static_cast<size_t>(id.nranks));
  auto timed = [&](size_t bytes, uint64_t round) {
    const auto t0 = std::chrono::steady_clock::now();
    exchange(bytes, round);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bs.allgather(&s, all.data(), sizeof s, p.while_blocked);
    return all;
  };
  // A node's link carried its ranks' bytes in its slowest rank's time; the slowest node bounds.
  auto figureOf = [&](size_t bytes, const std::vector<double>& times) {
    double figure = 0;
    for (int m = 0; m < N; ++m) {
      double slowest = 0;
      for (int r : t.ranks_of[m]) slowest = std::max(slowest, times[static_cast<size_t>(r)]);
      const double bps = slowest > 0 ? static_cast<double>(bytes) * t.localSize(m) / slowest : 0;
      figure = m == 0 ? bps : std::min(figure, bps);
    }
    return figure;
  };
  exchange(std::min<size_t>(C, 4096), 0);  // opens the connections
  // Small messages: each rank's median round, then the slowest rank's.
  uint64_t round = 1;
  std::vector<double> small;
  for (int i = 0; i < kLatencyRounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    exchange(std::min<size_t>(C, 64), round++);
    small.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(small.begin(), small.begin() + kLatencyRounds / 2, small.end());
  const double median = small[kLatencyRounds / 2];
  bs.allgather(&median, all.data(), sizeof median, p.while_blocked);
  LinkFigures f;
  f.alpha_s = *std::max_element(all.begin(), all.end());
  size_t bytes = p.bytes;
  const size_t most = std::min(std::max(p.max_bytes, p.bytes), p.bytes * kProbeGrowth);
  for (;;) {  // every rank sees the same times, so all grow alike
    const std::vector<double> times = timed(bytes, round++);
    const double longest = *std::max_element(times.begin(), times.end());
    if (longest >= kProbeRoundSeconds || bytes >= most) break;
    const double scale = longest > 0 ? kProbeRoundSeconds / longest : double(kProbeGrowth);
    bytes = std::min(most, std::max(bytes * 2, static_cast<size_t>(static_cast<double>(bytes) * scale * 1.25)));
  }
  // Two rounds at the final size, each rank's best.
  std::vector<double> best = timed(bytes, round++);
  const std::vector<double> again = timed(bytes, round++);
  for (size_t r = 0; r < best.size(); ++r) best[r] = std::min(best[r], again[r]);
  f.Bps = figureOf(bytes, best);
  return f;
}

}  // namespace hicoll
