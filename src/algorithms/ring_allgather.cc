// The flat ring AllGather (HICOLL_ALGO=ring, and the host fallback): W-1 steps over
// point-to-point messages, each neighbour reached by its own transport (shm on the node, ofi
// across nodes). Every block crosses every node boundary on its way round: (W-1)/W of the
// output per node.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {

void ringAllGather(Run& r, const void* send, void* recv, size_t count) {
  const Identity& id = r.id;
  const size_t b = count * r.esize;
  if (b == 0) return;
  r.beginPhase();
  const int W = id.nranks, me = id.rank;
  char* out = static_cast<char*>(recv);
  r.post(nullptr, hcCollAllGather);  // the node agrees on the call before data moves
  r.waitAllPosted();
  if (static_cast<const char*>(send) != out + static_cast<size_t>(me) * b)
    std::memcpy(out + static_cast<size_t>(me) * b, send, b);
  const int next = (me + 1) % W, prev = (me + W - 1) % W;
  // Pipelined in chunks: chunk k of step s goes on as soon as chunk k of step s-1 is here.
  // Whole blocks as single messages went through rxm's rendezvous and took twice the link
  // time in some calls (perf/results/2026-12-01.md).
  const size_t C = std::min(b, r.chunkBytes());
  const size_t K = (b + C - 1) / C;
  const size_t total = static_cast<size_t>(W - 1) * K;  // item i: chunk i % K of step i / K
  auto at = [&](int block, size_t k) { return out + static_cast<size_t>(block) * b + k * C; };
  auto len = [&](size_t k) { return std::min(C, b - k * C); };
  auto tag = [&](size_t i) { return r.tag(2 + static_cast<unsigned>(i >> 20), static_cast<unsigned>(i & 0xfffff)); };
  const size_t recv_ahead = std::min<size_t>(K + r.netWindow(), 1024), send_window = r.netWindow();
  std::vector<uint8_t> got(total, 0);
  size_t recv_posted = 0, recv_prefix = 0, sent = 0;
  Run::Pending recvs, sends;  // recvs keyed by item
  r.waitUntil("in the ring AllGather", [&] {
    if (!(recv_prefix < total || sent < total || !sends.empty())) return Progress::Done;
    bool moved = false;
    for (; recv_posted < total && recv_posted < recv_prefix + recv_ahead; ++recv_posted) {
      const int s = static_cast<int>(recv_posted / K);
      const size_t k = recv_posted % K;
      r.recv(recvs, prev, at((me - s - 1 + 2 * W) % W, k), len(k), tag(recv_posted), recv_posted);
    }
    moved |= r.poll(recvs, [&](size_t i) { got[i] = 1; }) > 0;
    while (recv_prefix < total && got[recv_prefix]) ++recv_prefix;
    moved |= r.poll(sends) > 0;
    // Step s sends the block received at step s-1 (step 0: this rank's own).
    for (; sent < total && sends.size() < send_window && (sent < K || got[sent - K]); ++sent, moved = true) {
      const int s = static_cast<int>(sent / K);
      const size_t k = sent % K;
      r.send(sends, next, at((me - s + W) % W, k), len(k), tag(sent));
    }
    return moved ? Progress::Moved : Progress::Idle;
  });
}

}  // namespace hicoll
