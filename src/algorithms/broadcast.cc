// Broadcast. Hierarchical: the root sends to its rail peer on every other node (one hop), then
// each node's holder exposes its buffer and the node's ranks read it chunk by chunk as it
// arrives (one copy). The flat path (HICOLL_ALGO=ring, the fallback): a chain from the root in
// ring order, pipelined in chunks.
#include <algorithm>
#include <cstring>

#include "algorithms/node_small.h"
#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {

void hierBroadcast(Run& r, const void* send, void* recv, size_t count, int root) {
  const Identity& id = r.id;
  const size_t bytes = count * r.esize;
  if (bytes == 0) return;
  if (id.topo.nnodes == 1 && ringBroadcast(bytes, r.cfg))
    return r.countLocalBytes(runRingBroadcast(r.shm, r.board, id, r.links.seq, r.links.unchecked,
                                              r.desc.withPhase(hcCollBroadcast), root, send, recv, bytes));
  r.beginPhase();
  const Topology& t = id.topo;
  const int N = t.nnodes, L = r.shm.localSize(), n = id.node(), me = r.shm.localIndex();
  const int rn = t.node_of[root], rl = t.local_of[root];
  const size_t C = std::min(bytes, r.chunkBytes());
  const size_t K = (bytes + C - 1) / C;
  auto chunkLen = [&](size_t k) { return std::min(C, bytes - k * C); };
  char* out = static_cast<char*>(recv);
  const bool holder = me == rl;  // this node's copy arrives here first
  const char* exposed = id.rank == root ? static_cast<const char*>(send) : out;
  // One node, a small buffer: the root stages it in the half of its scratch buffer this
  // phase's parity owns (no peer reads it: the phase rule, as the AllGather's eager staging),
  // and its peers copy it from there. No single-copy read (a system call) and no wait for
  // the peers to finish reading the root's user buffer; the root need not even wait for
  // them to start (rootLeavesUnchecked).
  const Staged stage(r.shm, r.seq, r.buf.scratch_bytes / 2, bytes, N == 1);
  if (N == 1 && stagesBroadcast(bytes, stage.half, r.cfg, r.oversubscribed)) {
    if (id.rank == root) stageBroadcast(stage, send, bytes);
    r.post(exposed, hcCollBroadcast);
    if (rootLeavesUnchecked(id.rank == root, r.cfg)) r.leaveUnchecked();
    else r.waitAllPosted();
    r.countLocalBytes(readBroadcast(stage, id.rank == root, rl, send, recv, bytes));
    return r.finishNode(/*peers_read_only_segment=*/true);
  }
  r.post(exposed, hcCollBroadcast);
  r.waitAllPosted();  // every rank, the holder too: a different root is found here

  Run::Pending sends, recvs;
  size_t have = 0;  // chunks available at the holder
  if (holder) {
    if (id.rank == root) {
      have = K;
      r.publish(1, K);
      for (size_t k = 0; k < K; ++k)
        for (int m = 0; m < N; ++m)
          if (m != rn) r.send(sends, t.rankAt(m, rl), exposed + k * C, chunkLen(k), r.tag(5, static_cast<unsigned>(k)));
    }
  }
  size_t copied = 0;
  r.waitUntil("in the hierarchical Broadcast", [&] {
    bool moved = false;
    if (holder && id.rank != root && have < K) {
      // Receive chunks in order; publish each as it lands.
      if (recvs.empty()) r.recv(recvs, root, out + have * C, chunkLen(have), r.tag(5, static_cast<unsigned>(have)));
      if (r.poll(recvs)) {
        r.publish(1, ++have);
        moved = true;
      }
    }
    if (!sends.empty()) moved |= r.poll(sends) > 0;
    if (holder) {
      if (id.rank == root && send != recv && copied < K) {
        r.copyOut(out + copied * C, exposed + copied * C, chunkLen(copied));
        ++copied;
        moved = true;
      } else if (id.rank != root || send == recv) {
        copied = K;
      }
    } else {
      size_t avail = r.readyOf(rl, 1);
      if (copied < avail) {
        r.readPosted(rl, copied * C, out + copied * C, chunkLen(copied));
        r.countBytes(t.rankAt(n, rl), chunkLen(copied));
        ++copied;
        moved = true;
      }
    }
    if (copied == K && (!holder || have == K) && sends.empty()) return Progress::Done;
    return moved ? Progress::Moved : Progress::Idle;
  });
  (void)L;
  r.finishNode();
}

void chainBroadcast(Run& r, const void* send, void* recv, size_t count, int root) {
  const Identity& id = r.id;
  const size_t bytes = count * r.esize;
  if (bytes == 0) return;
  r.beginPhase();
  const int W = id.nranks, me = id.rank;
  char* out = static_cast<char*>(recv);
  r.post(nullptr, hcCollBroadcast);
  r.waitAllPosted();
  if (me == root && send != recv) std::memcpy(out, send, bytes);
  if (W == 1) return;
  // A chain from the root in ring order, pipelined in chunks.
  const int pos = (me - root + W) % W;
  const int next = (me + 1) % W, prev = (me + W - 1) % W;
  const size_t C = std::min(bytes, r.chunkBytes());
  const size_t K = (bytes + C - 1) / C;
  Run::Pending sends;
  for (size_t k = 0; k < K; ++k) {
    const size_t len = std::min(C, bytes - k * C);
    if (pos > 0) {
      Run::Pending p;
      r.recv(p, prev, out + k * C, len, r.tag(4, static_cast<unsigned>(k)));
      r.waitAll(p, "in the chain Broadcast");
    }
    if (pos < W - 1) r.send(sends, next, out + k * C, len, r.tag(4, static_cast<unsigned>(k)));
    r.poll(sends);
  }
  r.waitAll(sends, "in the chain Broadcast");
}

}  // namespace hicoll
