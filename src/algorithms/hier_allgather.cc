// Hierarchical AllGather (README.md, "How it works"): a rail-aligned one-hop inter-node exchange into the sort
// buffer, then the node's ranks read each other's sort buffers into rank order, pipelined in
// chunks so the sort of chunk k overlaps the exchange of chunk k+1. A block larger than the
// scratch or sort buffer goes through them in pieces (plan.h, Pieces), one phase each.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/node_small.h"
#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {
namespace {

// Per-call counters, on the stack for the usual sizes: small calls are latency-bound, and
// their profile showed the allocator.
class Counters {
 public:
  Counters(size_t n, size_t v) : p_(n <= kInline ? inline_ : (heap_.assign(n, v), heap_.data())) {
    if (n <= kInline) std::fill_n(inline_, n, v);
  }
  Counters(const Counters&) = delete;
  Counters& operator=(const Counters&) = delete;
  size_t& operator[](size_t i) { return p_[i]; }

 private:
  static constexpr size_t kInline = 32;
  size_t inline_[kInline];
  std::vector<size_t> heap_;
  size_t* p_;
};

// One phase: bytes [off, off + len) of every rank's block of b bytes (in: this rank's block;
// out: the rank-ordered output). The sort buffer holds a slot of len per node, the scratch
// buffer len.
void gatherPiece(Run& r, const char* block, char* out, size_t b, size_t off, size_t len) {
  const Identity& id = r.id;
  r.beginPhase();
  const Topology& t = id.topo;
  const int N = t.nnodes, L = r.shm.localSize(), n = id.node(), me = r.shm.localIndex();
  const size_t C = std::min(len, r.chunkBytes());
  const size_t K = (len + C - 1) / C;
  auto chunkLen = [&](size_t k) { return std::min(C, len - k * C); };
  const char* in = block + off;
  const bool in_place = block == out + static_cast<size_t>(id.rank) * b;
  out += off;  // each rank's block at out + rank * b
  // Small blocks go through the shared segment: two memcpys beat a system call per peer.
  const bool small = b <= static_cast<size_t>(r.cfg.num(Knob::ShmEagerBytes));
  bool direct = r.shm.directRead() && !small;
  // Without single-copy reads (or for small blocks), local peers read this rank's block from
  // its scratch buffer. Small blocks are staged before post(), in the half of the scratch
  // buffer this phase's parity owns: a peer may still be reading the other half (the previous
  // phase), never this one (two phases back), so peers can read as soon as they see the post.
  const size_t half = r.buf.scratch_bytes / 2;
  const bool early = !direct && len <= half && small;
  const Staged stage(r.shm, r.seq, half, len, N == 1);
  if (early) stageAllGather(stage, in, len);

  r.post(in, hcCollAllGather);
  r.waitAllPosted();
  // Every block in node memory (hcMemAlloc): peers read it where it is, with memcpy.
  if (!small && !direct && r.allPostedNodeMemory()) direct = true;
  // One node, every block staged before its post: all are readable now, nothing to pipeline.
  if (N == 1 && early) {
    r.countLocalBytes(readAllGather(stage, t, in, out, b, len));
    return r.finishNode(/*peers_read_only_segment=*/true);
  }

  // Inter-node: block of (m, my local index) for every other node m into sort slot m.
  Run::Pending sends, recvs;  // recvs keyed by chunk
  Counters chunk_left(K, N == 1 ? 0 : N - 1);
  char* my_sort = r.shm.sort(me);
  size_t staged = direct || early ? K : 0;  // chunks of my block in my scratch
  const char* src_net = direct ? in : early ? stage.mine() : r.shm.scratch(me);
  size_t sent_chunks = 0;
  // A few chunks in flight per rail peer, not all K at once: with every rank's whole block
  // outstanding, the links of a 2x2 emulated cluster idled in most repetitions.
  const size_t window = r.netWindow();
  auto postChunk = [&](size_t k) {
    for (int m = 0; m < N; ++m) {
      if (m == n) continue;
      int peer = t.rankAt(m, me);
      r.recv(recvs, peer, my_sort + m * len + k * C, chunkLen(k), r.tag(0, static_cast<unsigned>(k)), k);
      r.send(sends, peer, src_net + k * C, chunkLen(k), r.tag(0, static_cast<unsigned>(k)));
    }
  };

  // Intra-node work items: (local peer, chunk) for the sort blocks and the own-node blocks.
  Counters sort_done(L, 0), own_done(L, 0);
  size_t received_prefix = N == 1 ? K : 0;
  if (N == 1) r.publish(1, K);
  r.waitUntil("in the hierarchical AllGather", [&] {
    bool moved = false;
    // Stage my block (no CMA), then let the network send it.
    if (staged < K) {
      std::memcpy(r.shm.scratch(me) + staged * C, in + staged * C, chunkLen(staged));
      ++staged;
      r.publish(0, staged);
      moved = true;
    }
    while (N > 1 && sent_chunks < staged && sent_chunks < received_prefix + window)
      postChunk(sent_chunks++), moved = true;
    moved |= r.poll(sends) > 0;
    moved |= r.poll(recvs, [&](size_t k) { --chunk_left[k]; }) > 0;
    size_t prefix = received_prefix;
    while (prefix < K && chunk_left[prefix] == 0) ++prefix;
    if (prefix != received_prefix) {
      received_prefix = prefix;
      r.publish(1, received_prefix);
    }
    // Copy what the node has ready into rank order.
    bool all_done = true;
    for (int l = 0; l < L; ++l) {
      // Own-node block of local rank l.
      const int owner = t.rankAt(n, l);
      if (own_done[l] < K) {
        size_t avail = l == me || direct || early ? K : r.readyOf(l, 0);
        if (own_done[l] < avail) {
          size_t k = own_done[l]++;
          char* dst = out + static_cast<size_t>(owner) * b + k * C;
          if (l == me) {
            if (!in_place) r.copyOut(dst, in + k * C, chunkLen(k));
          } else if (direct) {
            r.readPosted(l, k * C, dst, chunkLen(k));
            r.countBytes(owner, chunkLen(k));
          } else {
            r.copyOut(dst, (early ? stage.of(l) : r.shm.scratch(l)) + k * C, chunkLen(k));
            r.countBytes(owner, chunkLen(k));
          }
          moved = true;
        }
      }
      // Blocks local rank l received from the other nodes.
      if (N > 1 && sort_done[l] < K) {
        size_t avail = l == me ? received_prefix : r.readyOf(l, 1);
        if (sort_done[l] < avail) {
          size_t k = sort_done[l]++;
          const char* sort = r.shm.sort(l);
          for (int m = 0; m < N; ++m) {
            if (m == n) continue;
            r.copyOut(out + static_cast<size_t>(t.rankAt(m, l)) * b + k * C, sort + m * len + k * C, chunkLen(k));
          }
          if (l != me) r.countBytes(t.rankAt(n, l), chunkLen(k) * (N - 1));
          moved = true;
        }
      }
      all_done = all_done && own_done[l] == K && (N == 1 || sort_done[l] == K);
    }
    if (all_done && sends.empty() && recvs.empty()) return Progress::Done;
    return moved ? Progress::Moved : Progress::Idle;
  });
  // Peers that read this rank's user buffer, or its scratch beyond this phase's parity half
  // (blocks staged from its start), are waited for: the next phase may write that half before
  // it posts (small blocks, AllToAll tables), and a peer still copying would see them change.
  r.finishNode(/*peers_read_only_segment=*/early);
}

}  // namespace

void hierAllGather(Run& r, const void* send, void* recv, size_t count) {
  const size_t b = count * r.esize;
  if (b == 0) return;
  // Every rank cuts alike: the knobs agree across ranks and the count is the call's.
  const size_t cap = pieceCapBytes(hcCollAllGather, b, r.id.topo.nnodes, r.cfg, r.shm.directRead());
  const Pieces pieces = splitBlock(count, r.esize, cap);
  HC_CHECK(pieces.count > 0, hcInternalError, "AllGather block of {} bytes: no piece fits {} bytes", b, cap);
  // Pieces run one after the other: the next one's receives land in the sort slots local
  // peers read until they post it (the board's phase rule).
  for (size_t p = 0; p < pieces.count; ++p)
    gatherPiece(r, static_cast<const char*>(send), static_cast<char*>(recv), b, p * pieces.elems * r.esize,
                pieces.lenOf(p, count) * r.esize);
}

}  // namespace hicoll
