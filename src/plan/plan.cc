#include "plan/plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/comm.h"

namespace hicoll {

const char* ruleName(Rule r) {
  switch (r) {
    case Rule::Hierarchical: return "hierarchical";
    case Rule::RingRequested: return "ring requested";
    case Rule::Forced: return "forced fallback";
    case Rule::UnevenNodes: return "uneven nodes";
    case Rule::ScratchTooSmall: return "scratch buffer too small";
    case Rule::SortTooSmall: return "sort buffer too small";
    case Rule::NoSingleCopyReads: return "no single-copy reads";
  }
  return "?";
}

namespace {

CollPlan fallback(CollPlan p, Rule r, std::string reason) {
  p.path = hcPathFallback;
  p.rule = r;
  p.reason = std::move(reason);
  return p;
}

}  // namespace

bool allReduceIsSmall(size_t count, size_t e, int nranks, size_t small_bytes, const Capabilities& caps) {
  // The host's block rounds down: with fewer elements than ranks there is no block at all.
  return (count * e <= small_bytes || (!caps.device && count < static_cast<size_t>(nranks))) &&
         nranks <= caps.max_reduce_inputs;
}

size_t allReduceBlock(size_t count, int nranks, const Capabilities& caps) {
  const size_t W = static_cast<size_t>(nranks);
  return caps.device ? (count + W - 1) / W : count / W;
}

CollPlan planCall(const hcComm& c, const CollArgs& a, const Capabilities& caps) {
  CollPlan p;
  const size_t e = hcTypeSize(a.dtype);
  const Topology& t = c.topo;
  const size_t N = static_cast<size_t>(t.nnodes);
  int64_t chunk = c.cfg.num(Knob::ChunkBytes);
  if (N > 1) chunk = std::min(chunk, c.cfg.num(Knob::NetChunkBytes));
  p.chunk_bytes = static_cast<size_t>(chunk);
  p.net_window = static_cast<size_t>(c.cfg.num(Knob::NetWindow));

  if (a.coll == hcCollAllReduce) {
    p.allreduce_small = allReduceIsSmall(a.count, e, c.nranks,
                                         static_cast<size_t>(c.cfg.num(Knob::AllReduceSmallBytes)), caps);
    p.allreduce_block = allReduceBlock(a.count, c.nranks, caps);
    p.block_bytes = p.allreduce_small ? a.count * e : p.allreduce_block * e;
  } else if (a.coll == hcCollAllGather || a.coll == hcCollReduceScatter) {
    p.block_bytes = a.count * e;
  }

  if (c.cfg.forceFallbackMask() & (1u << a.coll))
    return fallback(p, Rule::Forced, fmt::format("HICOLL_FORCE_FALLBACK={}", c.cfg.str(Knob::ForceFallback)));
  if (!caps.device && c.cfg.algoRing() && a.coll != hcCollBarrier) {
    p.path = hcPathRing;
    p.rule = Rule::RingRequested;
    return p;
  }
  if (!t.uniform) {
    std::string counts;
    for (int n = 0; n < t.nnodes; ++n) counts += fmt::format("{}{}={}", n ? ", " : "", t.labels[n], t.localSize(n));
    return fallback(p, Rule::UnevenNodes, fmt::format("uneven ranks per node ({})", counts));
  }
  if (a.coll == hcCollBarrier) return p;
  const char* no_cma = "no single-copy intra-node reads (HICOLL_SHM_CMA=0 or process_vm_readv not permitted)";
  if (a.coll == hcCollBroadcast) {
    if (!caps.device && !caps.single_copy_reads) return fallback(p, Rule::NoSingleCopyReads, no_cma);
    return p;
  }
  const size_t b = p.block_bytes;
  // ReduceScatter stages outgoing partials through scratch in chunk-sized slots, so any
  // scratch size works; only its received partials (N blocks) need the sort buffer. Across
  // nodes the AllGather's block is what the network sends (the seed's registered buffer); on
  // one node the host AllGather stages it there only when peers cannot read it where it lies
  // (no single-copy reads, or blocks up to HICOLL_SHM_EAGER_BYTES).
  const bool stages_block = caps.device || N > 1 || !caps.single_copy_reads ||
                            b <= static_cast<size_t>(c.cfg.num(Knob::ShmEagerBytes));
  if (c.scratch_bytes < b && a.coll != hcCollReduceScatter && stages_block)
    return fallback(p, Rule::ScratchTooSmall,
                    fmt::format("SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES={} < per-rank block {} bytes", c.scratch_bytes, b));
  if (c.sort_bytes < N * b)
    return fallback(p, Rule::SortTooSmall,
                    fmt::format("SMDDP_AG_SORT_BUFFER_SIZE_BYTES={} < {} nodes x per-rank block {} bytes = {}",
                                c.sort_bytes, N, b, N * b));
  // Across nodes the host ReduceScatter reads local peers' inputs in place; on one node it
  // pushes through scratch and the AllGather has bounce buffers, so neither needs CMA there.
  const bool reads_in_place = a.coll == hcCollReduceScatter || (a.coll == hcCollAllReduce && !p.allreduce_small);
  if (!caps.device && N > 1 && !caps.single_copy_reads && reads_in_place)
    return fallback(p, Rule::NoSingleCopyReads, no_cma);
  return p;
}

}  // namespace hicoll
