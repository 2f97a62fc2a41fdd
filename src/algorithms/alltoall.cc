// AllToAll(v): every rank sends one block to every rank. No level of the hierarchy can
// aggregate such blocks (each has a single destination, where an AllGather's block is wanted
// by every rank), so the exchange is flat and pairwise: a block crosses the network at most
// once, straight to its rank, and a block for a rank of this node is copied once.
//  1. The node agrees on the call (board post, which carries this rank's send buffer), the
//     network on the descriptor (the Agreement of host.cc).
//  2. Each rank tells each peer what it sends it, from where, and what it expects back: a pair
//     whose counts differ fails on both of its ranks, naming both (a length mismatch of a
//     data message would name one side only; chunk counts that differ would leave messages
//     unmatched). Local peers read this from their slot in the sender's scratch buffer (no
//     message, no system call; algorithms/node_small.h, which also runs a call whose blocks
//     all stage without this path); a remote peer gets it in the first message, which also
//     carries the block when it is small (one message each way for small blocks).
//  3. Data, in step order (step s sends to rank me+s and receives from rank me-s, the order
//     MPI and NCCL use), in chunks. Local blocks up to HICOLL_SHM_EAGER_BYTES wait in the
//     sender's scratch; larger ones are read where they lie (single-copy reads, or plain
//     loads from node memory), else go as messages through the segment. A remote block
//     larger than what the first message carries follows it in chunks, posted by the
//     receiver once the sizes are checked.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/node_small.h"
#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {
namespace {

constexpr size_t kCarryMax = 16384;  // a remote block up to this rides in the first message
using PairHeader = AllToAllPair;

struct Item {  // one chunk of a block to or from a peer
  int peer;
  size_t off, len;  // within the block
  size_t src = 0;   // reads in place: where the chunk lies in the sender's posted buffer
};

}  // namespace

void allToAll(Run& r) {
  const Identity& id = r.id;
  const CollArgs& a = r.a;
  const Topology& t = id.topo;
  const int W = id.nranks, me = id.rank, L = r.shm.localSize(), my_local = r.shm.localIndex();
  const size_t e = r.esize;
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  std::vector<size_t> soff(W), roff(W), slen(W), rlen(W);
  allToAllLayout(a, e, soff.data(), roff.data(), slen.data(), rlen.data(), W);
  auto sendLen = [&](int p) { return slen[p]; };
  auto recvLen = [&](int p) { return rlen[p]; };
  auto local = [&](int p) { return t.node_of[p] == id.node(); };
  // h: what peer p told this rank; either direction of the pair may differ.
  auto check = [&](int p, const PairHeader& h) { checkAllToAllPair(id, p, h, sendLen(p), recvLen(p), e); };

  r.beginPhase();
  const size_t eager = static_cast<size_t>(r.cfg.num(Knob::ShmEagerBytes));
  // This rank's slots for its local peers, and their small blocks, in the half of its scratch
  // this phase's parity owns, before the post (as hierAllGather's small blocks: a peer may
  // still read the other half, the previous phase's, never this one): the post publishes them.
  const size_t half = r.buf.scratch_bytes / 2, base = (r.seq & 1) * half;
  const size_t node_slot = allToAllSlot(L, half, eager);
  HC_CHECK(static_cast<size_t>(L) * node_slot <= half, hcUnsupported,
           "AllToAll: {} ranks on this node need {} bytes of table in half the scratch buffer "
           "(SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES={})",
           L, static_cast<size_t>(L) * node_slot, r.buf.scratch_bytes);
  auto mine = [&](int l) -> const PairHeader& { return allToAllPair(r.shm, my_local, base, node_slot, l); };
  stageAllToAll(r.shm, base, half, eager, in, soff.data(), slen.data(), rlen.data());
  r.post(in, hcCollAllToAll);
  r.waitAllPosted();

  // Local blocks above the eager size are read where they lie when the node can: both ranks of
  // a pair decide alike, from the agreed length and the sender's post.
  auto inNodeMemory = [&](int sender_local, size_t off, size_t len) {
    const NodeMemRef& ref = r.board.postedMem(sender_local, r.seq);
    const uint64_t at = reinterpret_cast<uint64_t>(r.postedAddr(sender_local)) + off;
    return ref.valid() && at >= ref.base && at + len <= ref.base + ref.size;
  };
  auto readInPlace = [&](int sender, size_t off, size_t len) {
    return len > eager && (r.shm.directRead() || inNodeMemory(t.local_of[sender], off, len));
  };

  bool peers_read_me = false;  // then they read this rank's buffer: wait for them at the end
  for (int l = 0; l < L; ++l)
    if (r.shm.commRank(l) != me && mine(l).staged == kNotStaged && readInPlace(me, mine(l).from, mine(l).sends))
      peers_read_me = true;

  // The first message to each remote peer: its header, and the block when it fits.
  const size_t carry =
      W > 1 ? std::min<size_t>(kCarryMax, (size_t{1} << 20) / static_cast<size_t>(W - 1)) & ~size_t{63} : 0;
  const size_t slot = sizeof(PairHeader) + carry;
  std::vector<int> remote;
  for (int s = 1; s < W; ++s)
    if (!local((me - s + W) % W)) remote.push_back((me - s + W) % W);
  // Receive slots, send slots, received lengths: in the communicator's workspace, which
  // outlives a failed call's receives (the transports close first).
  char* first_in = r.buf.workspace(2 * remote.size() * slot + remote.size() * sizeof(size_t));
  char* first_out = first_in + remote.size() * slot;
  size_t* got = reinterpret_cast<size_t*>(first_out + remote.size() * slot);
  Run::Pending firsts, sends, recvs;
  for (size_t i = 0; i < remote.size(); ++i)
    r.recvUpTo(firsts, remote[i], first_in + i * slot, slot, r.tag(0, 0), &got[i], i);

  const size_t C = std::max<size_t>(r.chunkBytes(), 1);
  std::vector<Item> sends_todo, recvs_todo, reads_todo;
  size_t out_slot = 0;
  for (int s = 1; s < W; ++s) {
    const int to = (me + s) % W;
    const size_t len = sendLen(to);
    if (!local(to)) {
      char* m = first_out + out_slot++ * slot;
      const bool carried = len <= carry;
      const PairHeader h{len, soff[to], recvLen(to), 0};
      std::memcpy(m, &h, sizeof h);
      if (carried && len) std::memcpy(m + sizeof h, in + soff[to], len);
      r.send(sends, to, m, sizeof h + (carried ? len : 0), r.tag(0, 0), 0, /*payload=*/false);
      if (carried) {
        r.countBytes(to, len);
        continue;
      }
    } else if (len == 0 || mine(t.local_of[to]).staged != kNotStaged || readInPlace(me, soff[to], len)) {
      continue;  // staged in scratch, or read in place
    }
    for (size_t off = 0; off < len; off += C) sends_todo.push_back({to, off, std::min(C, len - off)});
  }
  if (sendLen(me)) std::memcpy(out + roff[me], in + soff[me], sendLen(me));

  auto tag = [&](const Item& i) {
    const size_t k = i.off / C;
    return r.tag(1 + static_cast<unsigned>(k >> 20), static_cast<unsigned>(k & 0xfffff));
  };
  auto plan = [&](int from, size_t len) {
    for (size_t off = 0; off < len; off += C) recvs_todo.push_back({from, off, std::min(C, len - off)});
  };
  // Local peers' tables (their posts published them), in step order.
  for (int s = 1; s < W; ++s) {
    const int p = (me - s + W) % W, l = t.local_of[p];
    if (!local(p)) continue;
    const PairHeader h = allToAllPair(r.shm, l, base, node_slot, my_local);
    check(p, h);
    if (h.staged != kNotStaged) {
      std::memcpy(out + roff[p], r.shm.scratch(l) + h.staged, h.sends);
      r.countBytes(p, h.sends);
    } else if (readInPlace(p, h.from, h.sends)) {
      for (size_t off = 0; off < h.sends; off += C)
        reads_todo.push_back({p, off, std::min(C, h.sends - off), h.from + off});
    } else {
      plan(p, h.sends);
    }
  }
  const size_t send_window = std::max<size_t>(r.netWindow(), 1) * static_cast<size_t>(std::min(W - 1, 4));
  const size_t recv_ahead = 1024;
  size_t ns = 0, nr = 0, nd = 0;
  r.waitUntil("in the AllToAll", [&] {
    if (!(!firsts.empty() || ns < sends_todo.size() || nr < recvs_todo.size() || nd < reads_todo.size() ||
          !sends.empty() || !recvs.empty()))
      return Progress::Done;
    bool moved = r.poll(firsts, [&](size_t i) {
      const int p = remote[i];
      PairHeader h;
      std::memcpy(&h, first_in + i * slot, sizeof h);
      check(p, h);
      if (h.sends <= carry) {
        HC_CHECK(got[i] == sizeof h + h.sends, hcInternalError,
                 "AllToAll: the first message of {} has {} bytes, not {}", id.who(p), got[i], sizeof h + h.sends);
        if (h.sends) std::memcpy(out + roff[p], first_in + i * slot + sizeof h, h.sends);
      } else {
        plan(p, h.sends);
      }
    }) > 0;
    // Receives in the order they became known; a sender never waits on a receive it has
    // not been told to expect.
    for (; nr < recvs_todo.size() && recvs.size() < recv_ahead; ++nr, moved = true) {
      const Item& i = recvs_todo[nr];
      r.recv(recvs, i.peer, out + roff[i.peer] + i.off, i.len, tag(i));
    }
    moved |= r.poll(recvs) > 0;
    moved |= r.poll(sends) > 0;
    for (; ns < sends_todo.size() && sends.size() < send_window; ++ns, moved = true) {
      const Item& i = sends_todo[ns];
      r.send(sends, i.peer, in + soff[i.peer] + i.off, i.len, tag(i));
    }
    if (nd < reads_todo.size()) {  // one chunk per pass: the network keeps moving meanwhile
      const Item& i = reads_todo[nd++];
      const int l = t.local_of[i.peer];
      if (inNodeMemory(l, i.src, i.len)) r.readPosted(l, i.src, out + roff[i.peer] + i.off, i.len);
      else r.shm.read(l, r.postedAddr(l) + i.src, out + roff[i.peer] + i.off, i.len);
      r.countBytes(i.peer, i.len);
      moved = true;
    }
    return moved ? Progress::Moved : Progress::Idle;
  });
  r.finishNode(/*peers_read_only_segment=*/!peers_read_me);
}

}  // namespace hicoll
