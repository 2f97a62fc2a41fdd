// AllToAll(v): every rank sends one block to every rank. No level of the hierarchy can
// aggregate such blocks (each has a single destination, where an AllGather's block is wanted
// by every rank), so the exchange is flat and pairwise: a block crosses the network at most
// once, straight to its rank, and a block for a rank of this node is copied once.
//  1. The node agrees on the call (board post, which carries this rank's send buffer), the
//     network on the descriptor (the Agreement of host.cc).
//  2. Sizes, pair by pair: each rank tells each peer what it sends it, from where, and what it
//     expects back. A pair whose counts differ fails on both of its ranks, naming both; a
//     length mismatch of a data message would name one side only, and chunk counts that
//     differ would leave messages unmatched.
//  3. Data: step s sends to rank me+s and receives from rank me-s (the pairwise order MPI and
//     NCCL use: at each step every rank has one sender and one receiver), in chunks. A block
//     from a local peer above HICOLL_SHM_EAGER_BYTES is read from the peer's buffer where it
//     lies (single-copy read, or plain loads from node memory); smaller ones and everything
//     without such reads go as messages through the shared segment.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {
namespace {

struct PairHeader {  // what a rank tells a peer, in bytes
  uint64_t sends, from, expects, unused;
};

// One chunk of a block to or from a peer.
struct Item {
  int peer;
  size_t off, len;  // within the block
};

}  // namespace

void allToAll(Run& r) {
  hcComm& c = r.comm;
  const CollArgs& a = r.a;
  const int W = c.nranks, me = c.rank;
  const size_t e = r.esize;
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  std::vector<size_t> soff(W), roff(W);
  for (size_t p = 0, sp = 0, rp = 0; p < static_cast<size_t>(W); ++p) {
    soff[p] = (a.send_displs ? a.send_displs[p] : sp) * e;
    roff[p] = (a.recv_displs ? a.recv_displs[p] : rp) * e;
    sp = soff[p] / e + a.send_counts[p];
    rp = roff[p] / e + a.recv_counts[p];
  }
  auto sendLen = [&](int p) { return a.send_counts[p] * e; };
  auto recvLen = [&](int p) { return a.recv_counts[p] * e; };

  r.beginPhase();
  r.post(in, hcCollAllToAll);
  r.waitAllPosted();

  // Sizes, every pair at once.
  std::vector<PairHeader> mine(W), theirs(W);
  Run::Pending ctl;
  for (int p = 0; p < W; ++p) {
    if (p == me) continue;
    mine[p] = {sendLen(p), soff[p], recvLen(p), 0};
    r.recv(ctl, p, &theirs[p], sizeof(PairHeader), r.tag(0, 0), p);
    r.send(ctl, p, &mine[p], sizeof(PairHeader), r.tag(0, 0), p, /*payload=*/false);
  }
  r.waitAll(ctl, "exchanging the AllToAll's sizes");
  std::string differ;
  int ndiffer = 0;
  auto pairDiffers = [&](int from, int to, uint64_t sends, uint64_t expects) {
    if (++ndiffer > 4) return;
    differ += fmt::format("{}{} sends {} elements to {}, which expects {} (its recvcounts[{}])", differ.empty() ? "" : "; ",
                          c.who(from), sends / e, c.who(to), expects / e, from);
  };
  for (int p = 0; p < W; ++p) {
    if (p == me) continue;
    if (theirs[p].sends != recvLen(p)) pairDiffers(p, me, theirs[p].sends, recvLen(p));
    if (theirs[p].expects != sendLen(p)) pairDiffers(me, p, sendLen(p), theirs[p].expects);
  }
  if (ndiffer)
    HC_THROW(hcInvalidUsage, "the counts of {} pair(s) differ: {}{}", ndiffer, differ, ndiffer > 4 ? "; ..." : "");

  // Which local blocks are read where they lie: both ranks of a pair decide alike, from the
  // agreed length and the sender's post.
  const size_t eager = static_cast<size_t>(c.cfg.num(Knob::ShmEagerBytes));
  const Topology& t = c.topo;
  auto inNodeMemory = [&](int sender_local, size_t off, size_t len) {
    const NodeMemRef& ref = r.board.postedMem(sender_local, r.seq);
    const uint64_t at = reinterpret_cast<uint64_t>(r.postedAddr(sender_local)) + off;
    return ref.valid() && at >= ref.base && at + len <= ref.base + ref.size;
  };
  auto readInPlace = [&](int sender, int receiver, size_t off, size_t len) {
    if (len <= eager || sender == receiver || t.node_of[sender] != t.node_of[receiver]) return false;
    return r.shm.directRead() || inNodeMemory(t.local_of[sender], off, len);
  };

  const size_t C = std::max<size_t>(r.chunkBytes(), 1);
  std::vector<Item> sends_todo, recvs_todo, reads_todo;
  bool peers_read_me = false;
  for (int s = 1; s < W; ++s) {
    const int to = (me + s) % W, from = (me - s + W) % W;
    if (readInPlace(me, to, soff[to], sendLen(to)))
      peers_read_me = true;
    else
      for (size_t off = 0; off < sendLen(to); off += C) sends_todo.push_back({to, off, std::min(C, sendLen(to) - off)});
    auto& todo = readInPlace(from, me, theirs[from].from, recvLen(from)) ? reads_todo : recvs_todo;
    for (size_t off = 0; off < recvLen(from); off += C) todo.push_back({from, off, std::min(C, recvLen(from) - off)});
  }
  if (sendLen(me)) std::memcpy(out + roff[me], in + soff[me], sendLen(me));

  auto tag = [&](const Item& i) {
    const size_t k = i.off / C;
    return r.tag(1 + static_cast<unsigned>(k >> 20), static_cast<unsigned>(k & 0xfffff));
  };
  const size_t send_window = std::max<size_t>(r.netWindow(), 1) * static_cast<size_t>(std::min(W - 1, 4));
  const size_t recv_ahead = 1024;
  size_t ns = 0, nr = 0, nd = 0;
  Run::Pending sends, recvs;
  Backoff backoff;
  while (ns < sends_todo.size() || nr < recvs_todo.size() || nd < reads_todo.size() || !sends.empty() ||
         !recvs.empty()) {
    bool moved = false;
    // Receives in step order: an unposted one is always later than every posted one.
    for (; nr < recvs_todo.size() && recvs.size() < recv_ahead; ++nr) {
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
      const size_t from = theirs[i.peer].from + i.off;
      if (inNodeMemory(l, from, i.len))
        r.readPosted(l, from, out + roff[i.peer] + i.off, i.len);
      else
        r.shm.read(l, r.postedAddr(l) + from, out + roff[i.peer] + i.off, i.len);
      c.countBytes(a.coll, i.peer, i.len);
      moved = true;
    }
    r.idle(moved, backoff, "in the AllToAll");
  }
  r.finishNode(/*peers_read_only_segment=*/!peers_read_me);
}

}  // namespace hicoll
