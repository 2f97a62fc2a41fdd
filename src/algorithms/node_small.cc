#include "algorithms/node_small.h"

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

size_t runRingBroadcast(ShmTransport& shm, NodeBoard& board, const Identity& id, uint64_t& seq, UncheckedPhases& u,
                        const CallDesc& desc, int root, const void* send, void* recv, size_t bytes) {
  const uint64_t s = ++seq;
  // Before this rank writes slot s: its peers finished the slot's last phase (they posted the
  // one after it).
  if (s >= Board::kSlots && u.from && u.from <= s - Board::kSlots + 1) board.settle(u, s - Board::kSlots + 1, s - 1);
  const Staged st(shm, s, 0, bytes, /*one_node=*/true, /*ring=*/true);
  const bool is_root = id.rank == root;
  const int rl = id.topo.local_of[root];
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

}  // namespace

bool runNodeSmall(hcComm& c, const CollArgs& a) {
  const Identity& id = c.id;
  if (id.topo.nnodes != 1 || id.nranks < 2 || a.stream || a.quant.block || a.count == 0) return false;
  const CollPlan* p = memoizedPlan(id, c.plan, a, hostCapabilities(c));
  const size_t esize = typeSize(a.dtype);
  if (!p || p->path != hcPathHierarchical || !stages(c, a, *p, esize)) return false;
  HC_TRACE("{}: path hierarchical (staged on the node)", describe(a));

  ShmTransport& shm = *c.links.shm;
  const Topology& t = id.topo;
  const size_t b = a.count * esize;
  const size_t staged = a.coll == hcCollReduceScatter ? static_cast<size_t>(shm.localSize()) * b : b;
  const CallDesc desc = CallDesc::of(a).withPhase(a.coll);
  const Deadline deadline = Deadline::fromFirstCheck(c.health.timeout_ms);
  NodeBoard board(shm, id, deadline, c.health.timeout_ms, c.links.peerCheck());
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  size_t read = 0;
  try {
    if (a.coll == hcCollBroadcast && ringBroadcast(b, c.plan.cfg)) {
      read = runRingBroadcast(shm, board, id, c.links.seq, c.links.unchecked, desc, a.root, in, out, b);
      c.stats.count(
          {a.coll, p->path, p->reason, p->modelled ? p->predicted.total() : 0, p->chunk_bytes, p->net_window, read, 0});
      return true;
    }
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
  } catch (const Error& e) {
    if (e.symptom()) c.links.explainSymptom(250);  // the failure notice of the peer behind it
    throw Error(e.code(), fmt::format("{}: {}", describe(a), e.what()), Error::kFatal);
  }
  c.stats.count(
      {a.coll, p->path, p->reason, p->modelled ? p->predicted.total() : 0, p->chunk_bytes, p->net_window, read, 0});
  return true;
}

void settleUnchecked(hcComm& c) {
  if (!c.links.unchecked.from) return;
  const Deadline deadline = Deadline::fromFirstCheck(c.health.timeout_ms);
  NodeBoard board(*c.links.shm, c.id, deadline, c.health.timeout_ms, c.links.peerCheck());
  board.settle(c.links.unchecked, ~0ull, 0, /*wait=*/false);
}

}  // namespace hicoll
