// Which path a host collective takes, and why. Every input of the decision agrees across
// ranks (configuration checked at creation, counts required equal), so all ranks choose alike.
#include <algorithm>
#include <cctype>

#include "algorithms/host.h"
#include "algorithms/run.h"
#include "base/error.h"
#include "base/log.h"

namespace hicoll {
namespace {

// Per-rank block of the hierarchical phases of a collective, in bytes.
size_t blockBytes(const hcComm& c, const CollArgs& a) {
  const size_t e = hcTypeSize(a.dtype);
  switch (a.coll) {
    case hcCollAllGather:
    case hcCollReduceScatter: return a.count * e;
    case hcCollAllReduce:
      if (a.count * e <= static_cast<size_t>(c.cfg.num(Knob::AllReduceSmallBytes))) return a.count * e;
      return (a.count + c.nranks - 1) / c.nranks * e;
    default: return 0;
  }
}

}  // namespace

PathChoice choosePath(const hcComm& c, const CollArgs& a) {
  PathChoice p;
  if (c.cfg.forceFallbackMask() & (1u << a.coll)) {
    p.path = hcPathFallback;
    p.reason = fmt::format("HICOLL_FORCE_FALLBACK={}", c.cfg.str(Knob::ForceFallback));
    return p;
  }
  if (a.coll == hcCollBarrier) return p;
  if (c.cfg.algoRing()) {
    p.path = hcPathRing;
    return p;
  }
  const Topology& t = c.topo;
  if (!t.uniform) {
    std::string counts;
    for (int n = 0; n < t.nnodes; ++n)
      counts += fmt::format("{}{}={}", n ? ", " : "", t.labels[n], t.localSize(n));
    p.path = hcPathFallback;
    p.reason = fmt::format("uneven ranks per node ({})", counts);
    return p;
  }
  if (a.coll == hcCollBroadcast) {
    if (!c.shm->directRead()) {
      p.path = hcPathFallback;
      p.reason = "no single-copy intra-node reads (HICOLL_SHM_CMA=0 or process_vm_readv not permitted)";
    }
    return p;
  }
  const size_t b = blockBytes(c, a);
  const size_t N = static_cast<size_t>(t.nnodes);
  // ReduceScatter stages outgoing partials through scratch in chunk-sized slots, so any
  // scratch size works; only its received partials (N blocks) need the sort buffer.
  if (c.scratch_bytes < b && a.coll != hcCollReduceScatter) {
    p.path = hcPathFallback;
    p.reason = fmt::format("SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES={} < per-rank block {} bytes", c.scratch_bytes, b);
  } else if (c.sort_bytes < N * b) {
    p.path = hcPathFallback;
    p.reason = fmt::format("SMDDP_AG_SORT_BUFFER_SIZE_BYTES={} < {} nodes x per-rank block {} bytes = {}",
                           c.sort_bytes, N, b, N * b);
  } else if (a.coll != hcCollAllGather && N > 1 && !c.shm->directRead() &&
             !(a.coll == hcCollAllReduce && a.count * hcTypeSize(a.dtype) <=
                                                static_cast<size_t>(c.cfg.num(Knob::AllReduceSmallBytes)))) {
    // Across nodes the ReduceScatter reads local peers' inputs in place; on one node it
    // pushes through scratch and the AllGather has bounce buffers, so neither needs CMA there.
    p.path = hcPathFallback;
    p.reason = "no single-copy intra-node reads (HICOLL_SHM_CMA=0 or process_vm_readv not permitted)";
  }
  return p;
}

namespace {

// Whether the call's first message to every agreement peer can carry the descriptor: the
// hierarchical paths on uniform nodes exchange with every rail peer at once, and the block
// (which bounds that message) is small.
bool piggybacks(const hcComm& c, const CollArgs& a, hcPath_t path) {
  if (path != hcPathHierarchical || !c.topo.uniform || c.topo.nnodes < 2) return false;
  switch (a.coll) {
    case hcCollAllGather:
    case hcCollReduceScatter:
    case hcCollAllReduce: return Agreement::canPiggyback(blockBytes(c, a));
    case hcCollBarrier: return true;
    default: return false;
  }
}

void runPath(hcComm& c, const CollArgs& a, bool hier, Run& r) {
  switch (a.coll) {
    case hcCollAllGather:
      hier ? hierAllGather(r, a.send, a.recv, a.count) : ringAllGather(r, a.send, a.recv, a.count);
      break;
    case hcCollReduceScatter:
      hier ? hierReduceScatter(r, a.send, a.recv, a.count) : ringReduceScatter(r, a.send, a.recv, a.count);
      break;
    case hcCollAllReduce: allReduce(r, a.send, a.recv, a.count, hier); break;
    case hcCollBroadcast:
      hier ? hierBroadcast(r, a.send, a.recv, a.count, a.root) : chainBroadcast(r, a.send, a.recv, a.count, a.root);
      break;
    case hcCollBarrier: {
      // A barrier is a one-byte AllGather: it crosses every node and notices dead peers.
      std::vector<uint8_t> all(c.nranks);
      uint8_t one = 1;
      hier && c.topo.uniform ? hierAllGather(r, &one, all.data(), 1) : ringAllGather(r, &one, all.data(), 1);
      break;
    }
    default: HC_THROW(hcInvalidArgument, "unknown collective {}", static_cast<int>(a.coll));
  }
}

}  // namespace

void runHostCollective(hcComm& c, const CollArgs& a) {
  PathChoice p = choosePath(c, a);
  if (p.path == hcPathFallback) HC_INFO("fallback: {} takes the flat ring: {}", describe(a), p.reason);
  HC_TRACE("{}: path {}", describe(a), p.path == hcPathHierarchical ? "hierarchical" : "ring");
  c.countCall(a.coll, p.path, p.reason);
  try {
    Agreement ag(c, CallDesc::of(a), "", piggybacks(c, a, p.path));
    Run r(c, a, &ag);
    try {
      runPath(c, a, p.path == hcPathHierarchical, r);
      ag.finish(r);
    } catch (const Error& e) {
      ag.explain(200);  // a disagreement explains a size mismatch or a timeout better
      if (e.symptom()) c.explainSymptom(250);  // so does the failure notice of the peer behind it
      throw;
    }
  } catch (const Error& e) {
    // Midway through a call: the communicator cannot go on, whatever the code.
    throw Error(e.code(), fmt::format("{}: {}", describe(a), e.what()), Error::kFatal);
  }
}

void rejectCall(hcComm& c, const CollArgs& a, const std::string& why) {
  const CallDesc mine = CallDesc::of(a, CallDesc::kInvalid);
  bool others_valid = false;
  try {
    c.shm->setReason(why);
    Agreement ag(c, mine, why);
    Run r(c, a, &ag);
    r.beginPhase();
    r.post(nullptr, a.coll, CallDesc::kInvalid);
    for (int l = 0; l < c.shm->localSize(); ++l)
      if (l != c.shm->localIndex()) others_valid |= r.waitPosted(l, /*collect=*/true);
    ag.finish(r, /*collect=*/true);
    others_valid |= ag.anyValid();
  } catch (const Error& e) {
    // A peer failed the call (it had valid arguments) or died: the communicator is gone.
    throw Error(hcInvalidArgument, fmt::format("{} (and the call failed on other ranks too: {})", why, e.what()),
                Error::kFatal);
  }
  // Every rank rejected its arguments: nothing moved, the communicator goes on.
  if (!others_valid) throw Error(hcInvalidArgument, why);
  throw Error(hcInvalidArgument, fmt::format("{} (its peers were told: their call fails too)", why), Error::kFatal);
}

}  // namespace hicoll
