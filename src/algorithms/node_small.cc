#include "algorithms/node_small.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/host.h"
#include "base/error.h"
#include "base/log.h"
#include "core/comm.h"
#include "plan/plan.h"
#include "transport/shm/board.h"

namespace hicoll {

namespace {
constexpr int kStackSources = 16;  // sources of a reduction kept on the stack (more: the heap)

uint64_t allInputs(int n) {
  return n >= 64 ? ~0ull : ((1ull << n) - 1);
}
}  // namespace

size_t readAllGather(const Staged& s, const Topology& t, const void* in, char* out, size_t stride, size_t len) {
  const int L = s.shm.localSize(), me = s.shm.localIndex();
  size_t read = 0;
  for (int l = 0; l < L; ++l) {
    char* dst = out + static_cast<size_t>(t.rankAt(0, l)) * stride;
    if (l != me) {
      std::memcpy(dst, s.of(l), len);
      read += len;
    } else if (dst != in) {
      std::memcpy(dst, in, len);
    }
  }
  return read;
}

void stageReduceScatter(const Staged& s, const Topology& t, const char* in, size_t b) {
  const int L = s.shm.localSize(), me = s.shm.localIndex();
  for (int m = 0; m < L; ++m)
    if (m != me) std::memcpy(s.mine() + static_cast<size_t>(m) * b, in + static_cast<size_t>(t.rankAt(0, m)) * b, b);
}

size_t sumReduceScatter(const Staged& s, const Topology& t, const ReduceSpec& spec, const char* in, void* out,
                        size_t count, size_t esize) {
  const int L = s.shm.localSize(), me = s.shm.localIndex();
  const size_t b = count * esize;
  const void* stack[kStackSources];
  std::vector<const void*> heap;
  const void** srcs = L <= kStackSources ? stack : (heap.resize(static_cast<size_t>(L)), heap.data());
  for (int l = 0; l < L; ++l)
    srcs[l] = l == me ? static_cast<const void*>(in + static_cast<size_t>(t.rankAt(0, me)) * b)
                      : s.of(l) + static_cast<size_t>(me) * b;
  ReduceSpec sp = spec;
  sp.premul_mask = allInputs(L);
  reduceN(sp, out, srcs, L, count);
  return static_cast<size_t>(L - 1) * b;
}

size_t sumAllReduce(const Staged& s, const Topology& t, const ReduceSpec& spec, const void* send, void* recv,
                    size_t count, size_t esize) {
  const int L = s.shm.localSize(), me = s.shm.localIndex();
  const void* stack[kStackSources];
  std::vector<const void*> heap;
  const void** srcs = L <= kStackSources ? stack : (heap.resize(static_cast<size_t>(L)), heap.data());
  for (int l = 0; l < L; ++l) srcs[t.rankAt(0, l)] = l == me ? send : s.of(l);
  ReduceSpec sp = spec;
  sp.premul_mask = allInputs(L);
  reduceN(sp, recv, srcs, L, count);
  return static_cast<size_t>(L - 1) * count * esize;
}

size_t readBroadcast(const Staged& s, bool is_root, int root_local, const void* send, void* recv, size_t bytes) {
  if (!is_root) {
    std::memcpy(recv, s.of(root_local), bytes);
    return bytes;
  }
  if (send != recv) std::memcpy(recv, send, bytes);
  return 0;
}

void allToAllLayout(const CollArgs& a, size_t esize, size_t* send_off, size_t* recv_off, size_t* send_len,
                    size_t* recv_len, int nranks) {
  for (size_t p = 0, sp = 0, rp = 0; p < static_cast<size_t>(nranks); ++p) {
    send_off[p] = (a.send_displs ? a.send_displs[p] : sp) * esize;
    recv_off[p] = (a.recv_displs ? a.recv_displs[p] : rp) * esize;
    send_len[p] = a.send_counts[p] * esize;
    recv_len[p] = a.recv_counts[p] * esize;
    sp = send_off[p] / esize + a.send_counts[p];
    rp = recv_off[p] / esize + a.recv_counts[p];
  }
}

void stageAllToAll(ShmTransport& shm, size_t base, size_t half, size_t eager, const char* in, const size_t* send_off,
                   const size_t* send_len, const size_t* recv_len) {
  const int L = shm.localSize(), me = shm.localIndex();
  char* scratch = shm.scratch(me);
  const bool stages = stagesAllToAll(L, half, eager);
  const size_t slot = allToAllSlot(L, half, eager);
  for (int l = 0; l < L; ++l) {
    const int p = shm.commRank(l);
    if (l == me) continue;
    const size_t at = base + static_cast<size_t>(l) * slot;
    AllToAllPair h{send_len[p], send_off[p], recv_len[p], kNotStaged};
    if (stages && h.sends && h.sends <= eager) {
      h.staged = at + sizeof h;
      std::memcpy(scratch + h.staged, in + h.from, h.sends);
    }
    std::memcpy(scratch + at, &h, sizeof h);
  }
}

void checkAllToAllPair(const Identity& id, int peer, const AllToAllPair& h, size_t sends_to_peer,
                       size_t expects_from_peer, size_t esize) {
  const bool in_differs = h.sends != expects_from_peer, out_differs = h.expects != sends_to_peer;
  if (!in_differs && !out_differs) return;
  auto way = [&](int from, int to, uint64_t sends, uint64_t expects) {
    return fmt::format("{} sends {} elements to {}, which expects {} (its recvcounts[{}])", id.who(from), sends / esize,
                       id.who(to), expects / esize, from);
  };
  HC_THROW(hcInvalidUsage, "the counts of a pair differ: {}{}{}",
           in_differs ? way(peer, id.rank, h.sends, expects_from_peer) : "", in_differs && out_differs ? "; " : "",
           out_differs ? way(id.rank, peer, sends_to_peer, h.expects) : "");
}

size_t runRingBroadcast(ShmTransport& shm, NodeBoard& board, const Identity& id, uint64_t& seq, UncheckedPhases& u,
                        const CallDesc& desc, int root, const void* send, void* recv, size_t bytes) {
  const uint64_t s = ++seq;
  // Before this rank writes slot s: its peers finished the slot's last phase (they posted the
  // one after it).
  if (s >= Board::kSlots && u.from && u.from <= s - Board::kSlots + 1) board.settle(u, s - Board::kSlots + 1, s - 1);
  const Staged st(shm, s, 0, bytes, /*one_node=*/true, /*ring=*/true);
  const bool is_root = id.rank == root;
  const int rl = id.topo.local_of[root];
  if (!st.in_post) shm.mapBoardRing(rl);  // its data in the ring (board.h)
  if (is_root) {
    stageBroadcast(st, send, bytes);
    board.post(s, desc, nullptr);
    u.add(s);
  } else {
    board.post(s, desc, nullptr);  // nothing of this rank's is read: no node memory lookup
    if (!board.postedSame(rl, s, desc)) board.waitPosted(rl, s, desc);
    if (shm.localSize() > 2) u.add(s);  // the other peers' posts
  }
  const size_t read = readBroadcast(st, is_root, rl, send, recv, bytes);
  board.finish(s, /*peers_read_only_segment=*/true);
  return read;
}

namespace {

// Whether the general path would run a on one node through the staged steps, with plan p.
bool stages(const hcComm& c, const CollArgs& a, const CollPlan& p, size_t esize) {
  const size_t b = a.count * esize, half = c.buf.scratch_bytes / 2;
  const Config& cfg = c.plan.cfg;
  switch (a.coll) {
    case hcCollAllGather: return stagesAllGather(b, half, cfg);
    // A ReduceScatter whose inputs are all in node memory sums them in place instead: this
    // rank's in node memory sends it to the general path, which asks the others.
    case hcCollReduceScatter:
      return stagesReduceScatter(b, c.links.shm->localSize(), half, cfg) && !nodeMemFind(a.send).valid();
    case hcCollAllReduce: return p.allreduce_small && stagesAllReduce(b, half);
    case hcCollBroadcast: return stagesBroadcast(b, half, cfg, c.plan.oversubscribed());
    default: return false;
  }
}

// A lean call's statistics, as the general path counts them (Run's destructor).
void countLean(hcComm& c, const CollArgs& a, const CollPlan& p, size_t read) {
  c.stats.count({a.coll, p.path, p.reason, p.modelled ? p.predicted.total() : 0, p.chunk_bytes, p.net_window, read, 0});
}
// A lean call's error: named with the call, fatal to the communicator (as midway through any).
[[noreturn]] void failLean(hcComm& c, const CollArgs& a, const Error& e) {
  if (e.symptom()) c.links.explainSymptom(250);  // the failure notice of the peer behind it
  throw Error(e.code(), fmt::format("{}: {}", describe(a), e.what()), Error::kFatal);
}

// Runs a lean call's steps, body(board, desc, in, out) returning the bytes it read from peers,
// on the node's board with the call's deadline; then counts it. Returns true (it ran).
template <class Body>
bool runLean(hcComm& c, const CollArgs& a, const CollPlan& p, hcColl_t phase, Body&& body) {
  const CallDesc desc = CallDesc::of(a).withPhase(phase);
  const Deadline deadline = Deadline::fromFirstCheck(c.health.timeout_ms);
  NodeBoard board(*c.links.shm, c.id, deadline, c.health.timeout_ms, c.links.peerCheck());
  size_t read = 0;
  try {
    read = body(board, desc, static_cast<const char*>(a.send), static_cast<char*>(a.recv));
  } catch (const Error& e) {
    failLean(c, a, e);
  }
  countLean(c, a, p, read);
  return true;
}

// The lean entry's AllToAll: on one node, with every block of this rank's both ways staged
// (alltoall.cc takes the same steps for them, so the ranks may take either entry).
bool runNodeAllToAll(hcComm& c, const CollArgs& a) {
  const Identity& id = c.id;
  ShmTransport& shm = *c.links.shm;
  const int W = id.nranks, me = id.rank, my_local = shm.localIndex();
  const size_t e = typeSize(a.dtype), half = c.buf.scratch_bytes / 2;
  const size_t eager = static_cast<size_t>(c.plan.cfg.num(Knob::ShmEagerBytes));
  if (!stagesAllToAll(W, half, eager)) return false;
  constexpr int kStackRanks = 16;
  size_t stack[4 * kStackRanks];
  std::vector<size_t> heap;
  size_t* soff = W <= kStackRanks ? stack : (heap.resize(4 * static_cast<size_t>(W)), heap.data());
  size_t *roff = soff + W, *slen = roff + W, *rlen = slen + W;
  allToAllLayout(a, e, soff, roff, slen, rlen, W);
  size_t most = 0;  // the longest block this rank receives
  for (int q = 0; q < W; ++q) {
    if (slen[q] > eager || rlen[q] > eager) return false;
    if (q != id.rank) most = std::max(most, rlen[q]);
  }
  const CollPlan* p = memoizedPlan(id, c.plan, a, hostCapabilities(c));
  if (!p || p->path != hcPathRing) return false;
  HC_TRACE("{}: path ring (staged on the node)", describe(a));

  return runLean(c, a, *p, hcCollAllToAll, [&](NodeBoard& board, const CallDesc& desc, const char* in, char* out) {
    size_t read = 0;
    board.settle(c.links.unchecked);
    const uint64_t seq = ++c.links.seq;
    const size_t base = (seq & 1) * half, slot = allToAllStagedSlot(eager);
    stageAllToAll(shm, base, half, eager, in, soff, slen, rlen);
    board.post(seq, desc, in);
    board.waitAllPosted(seq, desc, {base + static_cast<size_t>(my_local) * slot, sizeof(AllToAllPair) + most});
    if (slen[me]) std::memcpy(out + roff[me], in + soff[me], slen[me]);
    for (int s = 1; s < W; ++s) {  // in step order, as alltoall.cc checks them
      const int q = (me - s + W) % W, l = id.topo.local_of[q];
      const AllToAllPair h = allToAllPair(shm, l, base, slot, my_local);
      checkAllToAllPair(id, q, h, slen[q], rlen[q], e);
      if (!h.sends) continue;
      HC_CHECK(h.staged != kNotStaged, hcInternalError, "AllToAll: {} did not stage its block of {} bytes", id.who(q),
               h.sends);
      std::memcpy(out + roff[q], shm.scratch(l) + h.staged, h.sends);
      read += h.sends;
    }
    board.finish(seq, /*peers_read_only_segment=*/true);
    return read;
  });
}

}  // namespace

bool runNodeSmall(hcComm& c, const CollArgs& a) {
  const Identity& id = c.id;
  if (id.topo.nnodes != 1 || id.nranks < 2 || a.stream || a.quant.block) return false;
  if (a.coll == hcCollAllToAll) return runNodeAllToAll(c, a);
  if (a.count == 0) return false;
  const CollPlan* p = memoizedPlan(id, c.plan, a, hostCapabilities(c));
  const size_t esize = typeSize(a.dtype);
  if (!p || p->path != hcPathHierarchical || !stages(c, a, *p, esize)) return false;
  HC_TRACE("{}: path hierarchical (staged on the node)", describe(a));

  ShmTransport& shm = *c.links.shm;
  const Topology& t = id.topo;
  const size_t b = a.count * esize;
  const size_t staged = a.coll == hcCollReduceScatter ? static_cast<size_t>(shm.localSize()) * b : b;
  return runLean(c, a, *p, a.coll, [&](NodeBoard& board, const CallDesc& desc, const char* in, char* out) {
    if (a.coll == hcCollBroadcast && ringBroadcast(b, c.plan.cfg))
      return runRingBroadcast(shm, board, id, c.links.seq, c.links.unchecked, desc, a.root, in, out, b);
    size_t read = 0;
    board.settle(c.links.unchecked);
    const Staged s(shm, ++c.links.seq, c.buf.scratch_bytes / 2, staged, /*one_node=*/true);
    switch (a.coll) {
      case hcCollAllGather:
        stageAllGather(s, in, b);
        board.post(s.seq, desc, in);
        board.waitAllPosted(s.seq, desc, s.lines(0, b));
        read = readAllGather(s, t, in, out, b, b);
        break;
      case hcCollReduceScatter:
        stageReduceScatter(s, t, in, b);
        board.post(s.seq, desc, in);
        board.waitAllPosted(s.seq, desc, s.lines(static_cast<size_t>(shm.localIndex()) * b, b));
        read = sumReduceScatter(s, t, reduceSpecOf(a, id.nranks, 0, true), in, out, a.count, esize);
        break;
      case hcCollAllReduce:
        stageAllReduce(s, in, b);
        board.post(s.seq, desc, in);
        board.waitAllPosted(s.seq, desc, s.lines(0, b));
        read = sumAllReduce(s, t, reduceSpecOf(a, id.nranks, 0, true), in, out, a.count, esize);
        break;
      default: {  // hcCollBroadcast
        const bool root = id.rank == a.root;
        if (root) stageBroadcast(s, in, b);
        board.post(s.seq, desc, root ? in : out);
        if (rootLeavesUnchecked(root, c.plan.cfg)) c.links.unchecked.add(s.seq);
        else board.waitAllPosted(s.seq, desc);
        read = readBroadcast(s, root, t.local_of[a.root], in, out, b);
        break;
      }
    }
    board.finish(s.seq, /*peers_read_only_segment=*/true);
    return read;
  });
}

void settleUnchecked(hcComm& c) {
  if (!c.links.unchecked.from) return;
  const Deadline deadline = Deadline::fromFirstCheck(c.health.timeout_ms);
  NodeBoard board(*c.links.shm, c.id, deadline, c.health.timeout_ms, c.links.peerCheck());
  board.settle(c.links.unchecked, ~0ull, 0, /*wait=*/false);
}

}  // namespace hicoll
