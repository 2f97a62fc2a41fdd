#include "core/net_probe.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/error.h"
#include "transport/tags.h"

namespace hicoll {
namespace {

// Its own class (transport/tags.h): a peer already in its first call cannot match these.
uint64_t probeTag(uint64_t round, size_t k) {
  return tags::make(tags::Class::Probe, round << 32 | k);
}

}  // namespace

std::vector<double> nodeSpans(const Topology& t, const std::vector<double>& ends) {
  std::vector<double> span(static_cast<size_t>(t.nnodes));
  for (int m = 0; m < t.nnodes; ++m) {
    double first = ends[2 * static_cast<size_t>(t.ranks_of[m][0])], last = first;
    for (int r : t.ranks_of[m]) {
      first = std::min(first, ends[2 * static_cast<size_t>(r)]);
      last = std::max(last, ends[2 * static_cast<size_t>(r) + 1]);
    }
    span[static_cast<size_t>(m)] = last - first;
  }
  return span;
}

double roundFigure(const Topology& t, size_t bytes, const std::vector<double>& ends) {
  double sum = 0;
  for (double s : nodeSpans(t, ends)) sum += s;
  return sum > 0 ? static_cast<double>(bytes) * t.localSize(0) * t.nnodes / sum : 0;
}

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
      reqs.push_back(net.irecv(from, static_cast<char*>(p.recv) + off, len, probeTag(round, k)));
      reqs.push_back(net.isend(to, static_cast<char*>(p.send) + off, len, probeTag(round, k)));
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
  // One timed round of `bytes` per rank: every rank's start and end, from every rank.
  auto now = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  std::vector<double> all(static_cast<size_t>(id.nranks)), ends(2 * static_cast<size_t>(id.nranks));
  auto timed = [&](size_t bytes, uint64_t round) {
    double mine[2] = {now(), 0};
    exchange(bytes, round);
    mine[1] = now();
    bs.allgather(mine, ends.data(), sizeof mine, p.while_blocked);
    return ends;
  };
  exchange(std::min<size_t>(C, 4096), 0);  // opens the connections
  // Small messages: each rank's first quartile, then the ranks' median (see kLatencyRounds).
  uint64_t round = 1;
  std::vector<double> small;
  for (int i = 0; i < kLatencyRounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    exchange(std::min<size_t>(C, 64), round++);
    small.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(small.begin(), small.begin() + kLatencyRounds / 4, small.end());
  const double quartile = small[kLatencyRounds / 4];
  bs.allgather(&quartile, all.data(), sizeof quartile, p.while_blocked);
  std::nth_element(all.begin(), all.begin() + id.nranks / 2, all.end());
  LinkFigures f;
  f.alpha_s = all[static_cast<size_t>(id.nranks / 2)];
  size_t bytes = p.bytes;
  const size_t most = std::min(std::max(p.max_bytes, p.bytes), p.bytes * kProbeGrowth);
  for (;;) {  // every rank sees the same times, so all grow alike
    const std::vector<double> span = nodeSpans(t, timed(bytes, round++));
    const double longest = *std::max_element(span.begin(), span.end());
    if (longest >= kProbeRoundSeconds || bytes >= most) break;
    const double scale = longest > 0 ? kProbeRoundSeconds / longest : double(kProbeGrowth);
    bytes = std::min(most, std::max(bytes * 2, static_cast<size_t>(static_cast<double>(bytes) * scale * 1.25)));
  }
  // Two rounds at the final size; the one less disturbed (a stall only lengthens a round).
  const double first = roundFigure(t, bytes, timed(bytes, round++));
  f.Bps = std::max(first, roundFigure(t, bytes, timed(bytes, round++)));
  return f;
}

namespace {
std::mutex g_links_mu;
std::map<std::string, LinkFigures>& links() {
  static std::map<std::string, LinkFigures> m;  // a few entries: one per set of nodes
  return m;
}
}  // namespace

std::string linkKey(const Topology& t, const std::string& provider, const std::string& iface) {
  std::vector<std::string> nodes;
  for (int n = 0; n < t.nnodes; ++n) nodes.push_back(t.labels[n] + "*" + std::to_string(t.localSize(n)));
  std::sort(nodes.begin(), nodes.end());
  std::string key = provider + "|" + iface;
  for (const std::string& n : nodes) key += "|" + n;
  return key;
}

LinkFigures recallLink(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_links_mu);
  auto it = links().find(key);
  return it == links().end() ? LinkFigures{} : it->second;
}

void rememberLink(const std::string& key, const LinkFigures& f) {
  std::lock_guard<std::mutex> lock(g_links_mu);
  links()[key] = f;
}

}  // namespace hicoll
