#include "plan/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "base/quant_format.h"
#include "plan/paths.h"

namespace hicoll {

size_t callBytes(const Identity& id, const CollArgs& a) {
  const size_t b = a.count * typeSize(a.dtype);
  return a.coll == hcCollAllReduce || a.coll == hcCollAllToAll ? b : b * static_cast<size_t>(id.nranks);
}

const char* ruleName(Rule r) {
  switch (r) {
    case Rule::Hierarchical: return "hierarchical";
    case Rule::RingRequested: return "ring requested";
    case Rule::Forced: return "forced fallback";
    case Rule::UnevenNodes: return "uneven nodes";
    case Rule::ScratchTooSmall: return "scratch buffer too small";
    case Rule::SortTooSmall: return "sort buffer too small";
    case Rule::NoSingleCopyReads: return "no single-copy reads";
    case Rule::ModelChoseRing: return "cost model";
    case Rule::Pairwise: return "pairwise exchange";
  }
  return "?";
}

namespace {

// The communicator as the planner sees it, with the figures it predicts by: timed (refined
// from timed calls, on the measured link) or the untimed ones.
struct View {
  const Identity& id;
  const PlanContext& ctx;
  bool timed = true;
  const MachineFigures& figures(size_t bytes) const { return timed ? ctx.figures(bytes) : ctx.untimed(); }
};

// The view whose figures decide what changes a call's result (a reduction's order of sums,
// quantizing or not): under HICOLL_REPRODUCIBLE the untimed ones, as timings differ between
// runs and the refinement changes the figures mid-run (a resumed job would sum otherwise).
View deciding(const View& c, bool changes_result) {
  return View{c.id, c.ctx, c.timed && !(changes_result && c.ctx.cfg.flag(Knob::Reproducible))};
}
bool sums(hcColl_t coll) {
  return coll == hcCollReduceScatter || coll == hcCollAllReduce;
}

CollPlan fallback(CollPlan p, Rule r, std::string reason) {
  p.path = hcPathFallback;
  p.rule = r;
  p.reason = std::move(reason);
  return p;
}

// What the model chooses for (path, AllReduce split, window) and what it predicts.
bool modelledColl(hcColl_t coll) {
  return coll == hcCollAllGather || coll == hcCollReduceScatter || coll == hcCollAllReduce;
}
bool predictedColl(hcColl_t coll) {
  return modelledColl(coll) || coll == hcCollAllToAll;
}

bool inPlace(const View& c, const CollArgs& a) {
  const size_t b = a.count * typeSize(a.dtype);
  const char* s = static_cast<const char*>(a.send);
  const char* r = static_cast<const char*>(a.recv);
  const size_t off = static_cast<size_t>(c.id.rank) * b;
  switch (a.coll) {
    case hcCollAllGather: return s == r + off;
    case hcCollReduceScatter: return s + off == r;
    default: return s == r;
  }
}

size_t callBytes(const View& c, const CollArgs& a) {
  return hicoll::callBytes(c.id, a);
}

// Whether a is a quantized ReduceScatter that quantizes (the images of a quantized AllGather
// are gathered by exact calls).
bool quantizesHere(const CollArgs& a) {
  return a.coll == hcCollReduceScatter && a.quant.block && !a.quant.exact;
}

Algo algoOf(const CollPlan& p) {
  return p.path == hcPathHierarchical ? Algo::Hier : Algo::Ring;
}

// The model's time of a on a path (a quantized ReduceScatter that quantizes as such).
Prediction predictFor(const View& c, const CollArgs& a, const Shape& s, Algo algo, bool in_place,
                      bool allreduce_small) {
  const size_t bytes = callBytes(c, a);
  if (quantizesHere(a))
    return predictQuantized(c.figures(bytes), s, a.coll, algo, bytes, in_place, typeSize(a.dtype), a.quant.block);
  return predict(c.figures(bytes), s, a.coll, algo, bytes, in_place, allreduce_small);
}

// HICOLL_ALGO=auto on a path the rules allow: the model picks the split of an AllReduce (when
// HICOLL_ALLREDUCE_SMALL_BYTES is not set and both are possible), then hierarchical or ring.
// Under HICOLL_REPRODUCIBLE a reduction's path and split follow the untimed figures (its
// chunking, which sums alike, the timed ones).
void modelChoice(const View& c, const CollArgs& a, const Capabilities& caps, CollPlan& p) {
  const size_t bytes = callBytes(c, a), e = typeSize(a.dtype);
  const View d = deciding(c, sums(a.coll));
  const size_t N = static_cast<size_t>(c.id.topo.nnodes);
  const size_t window_floor = static_cast<size_t>(c.ctx.cfg.num(Knob::NetWindow));
  const bool window_free = c.ctx.cfg.isDefault(Knob::NetWindow);
  // The split is predicted at the window the deciding figures choose (planRules's, when timed).
  const Shape at_floor = modelShape(c.id, c.ctx, p.chunk_bytes, window_floor);
  const Shape s = modelShape(c.id, c.ctx, p.chunk_bytes,
                             window_free ? modelWindow(d.figures(bytes), at_floor, window_floor) : window_floor);
  if (a.coll == hcCollAllReduce && c.ctx.cfg.isDefault(Knob::AllReduceSmallBytes) &&
      a.count >= static_cast<size_t>(c.id.nranks) && c.id.nranks <= caps.max_reduce_inputs) {
    // The latency path stages the whole buffer as the block: only where the buffers hold it.
    const bool small_fits = bytes <= c.ctx.scratchBytes() && N * bytes <= c.ctx.sortBytes();
    const bool small = small_fits && predict(d.figures(bytes), s, a.coll, Algo::Hier, bytes, false, true).total() <
                                         predict(d.figures(bytes), s, a.coll, Algo::Hier, bytes, false, false).total();
    // Across nodes without single-copy reads the RS + AG split cannot run (it reads in place).
    const bool large_fits = caps.single_copy_reads || N == 1;
    if (small != p.allreduce_small && (small || large_fits)) {
      p.allreduce_small = small;
      p.block_bytes = small ? bytes : p.allreduce_block * e;
    }
  }
  // Each path with its own chunking: under the defaults the model may raise the chunk (and
  // with it the window) where per-message costs bound the call.
  const bool chunk_free = N > 1 && c.ctx.cfg.isDefault(Knob::NetChunkBytes) && c.ctx.net_chunk_cap > p.chunk_bytes;
  auto chunking = [&](const View& v, Algo algo) {
    return modelChunking(v.figures(bytes), at_floor, chunk_free ? c.ctx.net_chunk_cap : p.chunk_bytes, window_free,
                         [&](const Shape& at) { return predictFor(v, a, at, algo, false, p.allreduce_small); });
  };
  const Chunking h = chunking(c, Algo::Hier), r = chunking(c, Algo::Ring);
  double hier = h.predicted.total(), ring = r.predicted.total();
  const bool untimed = &d.figures(bytes) != &c.figures(bytes);
  if (untimed) {
    hier = chunking(d, Algo::Hier).predicted.total();
    ring = chunking(d, Algo::Ring).predicted.total();
  }
  const Chunking& best = ring < hier ? r : h;
  p.chunk_bytes = best.chunk;
  p.net_window = best.window;
  if (ring < hier) {
    p.path = hcPathRing;
    p.rule = Rule::ModelChoseRing;
    p.reason = fmt::format("cost model: ring {:.1f} us < hierarchical {:.1f} us{}", ring * 1e6, hier * 1e6,
                           untimed ? " (untimed figures: HICOLL_REPRODUCIBLE)" : "");
  }
}

// The prediction of the path the plan takes (for the statistics and the logs).
void modelPrediction(const View& c, const CollArgs& a, CollPlan& p) {
  if (!predictedColl(a.coll) || !c.id.topo.uniform) return;
  const Shape s = modelShape(c.id, c.ctx, p.chunk_bytes, p.net_window);
  p.predicted = predictFor(c, a, s, algoOf(p), inPlace(c, a), p.allreduce_small);
  p.modelled = true;
}

}  // namespace

Observation observationOf(const Identity& id, const PlanContext& ctx, const CollArgs& a, const CollPlan& p,
                          double seconds) {
  const View c{id, ctx};
  Observation o;
  o.shape = modelShape(id, ctx, p.chunk_bytes, p.net_window);
  o.coll = a.coll;
  o.algo = algoOf(p);
  o.bytes = callBytes(c, a);
  o.in_place = inPlace(c, a);
  o.allreduce_small = p.allreduce_small;
  if (quantizesHere(a)) {
    o.quant_elem = typeSize(a.dtype);
    o.quant_block = a.quant.block;
  }
  o.seconds = seconds;
  return o;
}

Shape modelShape(const Identity& id, const PlanContext& ctx, size_t chunk_bytes, size_t net_window) {
  const View c{id, ctx};
  Shape s;
  s.nodes = c.id.topo.nnodes;
  s.local = c.id.topo.uniform ? c.id.topo.localSize(0) : 1;
  s.host_ranks = c.ctx.host_ranks;
  s.cores = c.ctx.host_cores;
  s.ring_cross = c.ctx.ring_cross;
  s.chunk = chunk_bytes;
  s.window = net_window;
  s.scratch = c.ctx.scratchBytes();
  return s;
}

bool allReduceIsSmall(size_t count, size_t e, int nranks, size_t small_bytes, const Capabilities& caps) {
  // The host's block rounds down: with fewer elements than ranks there is no block at all.
  return (count * e <= small_bytes || (!caps.device && count < static_cast<size_t>(nranks))) &&
         nranks <= caps.max_reduce_inputs;
}

size_t allReduceBlock(size_t count, int nranks, const Capabilities& caps) {
  const size_t W = static_cast<size_t>(nranks);
  return caps.device ? (count + W - 1) / W : count / W;
}

size_t pieceCapBytes(hcColl_t phase, size_t b, int nnodes, const Config& cfg, bool single_copy_reads) {
  size_t cap = SIZE_MAX;
  // Across nodes the AllGather's block is what the network sends (the seed's registered
  // buffer); on one node it is staged only where peers cannot read it in place (no single-copy
  // reads, or blocks up to HICOLL_SHM_EAGER_BYTES). ReduceScatter stages chunk slots: any size.
  const bool stages = nnodes > 1 || !single_copy_reads || b <= static_cast<size_t>(cfg.num(Knob::ShmEagerBytes));
  if (phase == hcCollAllGather && stages) cap = static_cast<size_t>(cfg.num(Knob::ScratchBytes));
  // Received blocks land in the sort buffer, a slot per node (one node receives none).
  if (nnodes > 1) cap = std::min(cap, static_cast<size_t>(cfg.num(Knob::SortBytes)) / static_cast<size_t>(nnodes));
  return cap;
}

Pieces splitBlock(size_t count, size_t esize, size_t cap_bytes) {
  const size_t cap = cap_bytes / esize;
  if (count <= cap) return {count, 1};
  if (cap == 0) return {0, 0};
  const size_t n = (count + cap - 1) / cap;
  const size_t elems = (count + n - 1) / n;  // even pieces: none much shorter than the others
  return {elems, (count + elems - 1) / elems};
}

namespace {

// The cap of a hierarchical call's pieces: the smallest of its phases' (an AllReduce runs a
// ReduceScatter and an AllGather on its block, each cut by its own cap: the plan shows the
// finer; its latency split runs one AllGather).
size_t callPieceCap(const View& c, const CollArgs& a, const Capabilities& caps, const CollPlan& p) {
  const int N = c.id.topo.nnodes;
  const size_t ag = pieceCapBytes(hcCollAllGather, p.block_bytes, N, c.ctx.cfg, caps.single_copy_reads);
  const size_t rs = pieceCapBytes(hcCollReduceScatter, p.block_bytes, N, c.ctx.cfg, caps.single_copy_reads);
  switch (a.coll) {
    case hcCollAllGather: return ag;
    case hcCollReduceScatter: return rs;
    case hcCollAllReduce: return p.allreduce_small ? ag : std::min(ag, rs);
    default: return SIZE_MAX;
  }
}

// The pieces of a hierarchical plan's block (the device path runs whole blocks: its rules
// refuse what does not fit).
void planPieces(const View& c, const CollArgs& a, const Capabilities& caps, CollPlan& p) {
  p.pieces = 1;
  p.piece_bytes = p.block_bytes;
  if (caps.device || p.path != hcPathHierarchical || p.block_bytes == 0) return;
  const size_t e = typeSize(a.dtype);
  const Pieces s = splitBlock(p.block_bytes / e, e, callPieceCap(c, a, caps, p));
  p.pieces = s.count;
  p.piece_bytes = s.elems * e;
}

// What the rules allow, and under HICOLL_ALGO=auto what the model chooses among it.
CollPlan planRules(const View& c, const CollArgs& a, const Capabilities& caps) {
  CollPlan p;
  const size_t e = typeSize(a.dtype);
  const Topology& t = c.id.topo;
  const size_t N = static_cast<size_t>(t.nnodes);
  int64_t chunk = c.ctx.cfg.num(Knob::ChunkBytes);
  if (N > 1) chunk = std::min(chunk, c.ctx.cfg.num(Knob::NetChunkBytes));
  p.chunk_bytes = static_cast<size_t>(chunk);
  p.net_window = static_cast<size_t>(c.ctx.cfg.num(Knob::NetWindow));
  const bool model_decides = !caps.device && c.ctx.cfg.algoAuto() && t.uniform && modelledColl(a.coll);
  if (model_decides && c.ctx.cfg.isDefault(Knob::NetWindow))
    p.net_window =
        modelWindow(c.figures(callBytes(c, a)), modelShape(c.id, c.ctx, p.chunk_bytes, p.net_window), p.net_window);

  if (a.coll == hcCollAllReduce) {
    p.allreduce_small =
        allReduceIsSmall(a.count, e, c.id.nranks, static_cast<size_t>(c.ctx.cfg.num(Knob::AllReduceSmallBytes)), caps);
    p.allreduce_block = allReduceBlock(a.count, c.id.nranks, caps);
    p.block_bytes = p.allreduce_small ? a.count * e : p.allreduce_block * e;
  } else if (a.coll == hcCollAllGather || a.coll == hcCollReduceScatter) {
    p.block_bytes = a.count * e;
  }

  if (a.coll == hcCollAllToAll) {
    // No level aggregates an AllToAll's blocks (each has one destination): one flat path, on
    // any topology and buffer size, with no scratch or sort buffer (device buffers: the engine
    // has none and sends it to NCCL).
    if (c.ctx.cfg.forceFallbackMask() & (1u << a.coll))
      return fallback(p, Rule::Forced, fmt::format("HICOLL_FORCE_FALLBACK={}", c.ctx.cfg.str(Knob::ForceFallback)));
    p.path = hcPathRing;
    p.rule = Rule::Pairwise;
    return p;
  }
  // The paths in their order of preference: the first whose rules allow the call takes it. A
  // preferred path refused by a rule (not by a preference) is why the call falls back, unless
  // the user asked for the ring.
  Verdict refused;
  const PathInfo* taken = nullptr;
  const PlanInput in{c.id, c.ctx, a, caps, p};
  for (const PathInfo& path : pathTable()) {
    if (!path.allows || !runsOn(path, a.coll, caps)) continue;
    Verdict v = path.allows(in);
    if (v.ok()) {
      taken = &path;
      break;
    }
    if (refused.ok() && v.rule != Rule::Hierarchical) refused = std::move(v);
  }
  HC_CHECK(taken, hcInternalError, "no path runs {} on {} buffers", collName(a.coll), caps.device ? "device" : "host");
  if (!refused.ok()) {
    if (refused.rule != Rule::RingRequested) return fallback(p, refused.rule, std::move(refused.reason));
    p.path = hcPathRing;
    p.rule = refused.rule;
    return p;
  }
  p.path = taken->counted_as;
  if (model_decides) modelChoice(c, a, caps, p);
  planPieces(c, a, caps, p);
  return p;
}

}  // namespace

Verdict hierarchicalRules(const Identity& id, const PlanContext& ctx, const CollArgs& a, const Capabilities& caps,
                          const CollPlan& p) {
  const View c{id, ctx};
  const Topology& t = id.topo;
  const size_t N = static_cast<size_t>(t.nnodes);
  auto no = [](Rule r, std::string why) { return Verdict{r, std::move(why)}; };
  if (!t.uniform) {
    std::string counts;
    for (int n = 0; n < t.nnodes; ++n) counts += fmt::format("{}{}={}", n ? ", " : "", t.labels[n], t.localSize(n));
    return no(Rule::UnevenNodes, fmt::format("uneven ranks per node ({})", counts));
  }
  if (a.coll == hcCollBarrier) return {};
  const char* no_cma = "no single-copy intra-node reads (HICOLL_SHM_CMA=0 or process_vm_readv not permitted)";
  if (a.coll == hcCollBroadcast) {
    if (!caps.device && !caps.single_copy_reads) return no(Rule::NoSingleCopyReads, no_cma);
    return {};
  }
  const size_t b = p.block_bytes;
  if (caps.device || c.ctx.cfg.flag(Knob::ScratchStrict)) {
    // The seed's rule (HICOLL_SCRATCH_STRICT=1; the device engine runs whole blocks): the
    // block must fit. ReduceScatter stages outgoing partials through scratch in chunk-sized
    // slots, so any scratch size works; only its received partials (N blocks) need the sort
    // buffer. The host AllGather on one node stages its block only where pieceCapBytes says.
    const bool stages_block =
        caps.device || N > 1 || !caps.single_copy_reads || b <= static_cast<size_t>(c.ctx.cfg.num(Knob::ShmEagerBytes));
    if (c.ctx.scratchBytes() < b && a.coll != hcCollReduceScatter && stages_block)
      return no(Rule::ScratchTooSmall, fmt::format("SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES={} < per-rank block {} bytes",
                                                   c.ctx.scratchBytes(), b));
    if (c.ctx.sortBytes() < N * b)
      return no(Rule::SortTooSmall,
                fmt::format("SMDDP_AG_SORT_BUFFER_SIZE_BYTES={} < {} nodes x per-rank block {} bytes = {}",
                            c.ctx.sortBytes(), N, b, N * b));
  } else if (const size_t e = typeSize(a.dtype); b && splitBlock(b / e, e, callPieceCap(c, a, caps, p)).count == 0) {
    // Larger blocks stream through the buffers in pieces; not one element per node's slot
    // is what cannot.
    return no(Rule::SortTooSmall, fmt::format("SMDDP_AG_SORT_BUFFER_SIZE_BYTES={} holds less than one {}-byte "
                                              "element per node ({} nodes)",
                                              c.ctx.sortBytes(), e, N));
  }
  // Across nodes the host ReduceScatter reads local peers' inputs in place; on one node it
  // pushes through scratch and the AllGather has bounce buffers, so neither needs CMA there.
  const bool reads_in_place = a.coll == hcCollReduceScatter || (a.coll == hcCollAllReduce && !p.allreduce_small);
  if (!caps.device && N > 1 && !caps.single_copy_reads && reads_in_place) return no(Rule::NoSingleCopyReads, no_cma);
  return {};
}

CollPlan planCall(const Identity& id, const PlanContext& ctx, const CollArgs& a, const Capabilities& caps) {
  const View c{id, ctx};
  if (caps.device) return planRules(c, a, caps);
  // Host calls repeat their shape (a training step's buckets): the last plan per collective is
  // kept, as the model's few predictions cost more than a small call's other work.
  if (const CollPlan* last = memoizedPlan(id, ctx, a, caps)) return *last;
  CollPlan p = planRules(c, a, caps);
  modelPrediction(c, a, p);
  const size_t qb = quantizesHere(a) ? a.quant.block : 0;
  ctx.memo.of[a.coll] =
      PlanMemo{true, a.count, a.dtype, qb, inPlace(c, a), caps.single_copy_reads, caps.max_reduce_inputs, p};
  return p;
}

const CollPlan* memoizedPlan(const Identity& id, const PlanContext& ctx, const CollArgs& a, const Capabilities& caps) {
  const PlanMemo& m = ctx.memo.of[a.coll];
  const size_t qb = quantizesHere(a) ? a.quant.block : 0;
  if (m.valid && m.count == a.count && m.dtype == a.dtype && m.quant_block == qb &&
      m.in_place == inPlace(View{id, ctx}, a) && m.single_copy_reads == caps.single_copy_reads &&
      m.max_reduce_inputs == caps.max_reduce_inputs)
    return &m.plan;
  return nullptr;
}

int64_t quantizeFromNodes(const PlanContext& ctx, bool model_may_decide) {
  const int64_t min_nodes = ctx.cfg.num(Knob::QuantMinNodes);
  return min_nodes > 0 ? min_nodes : model_may_decide ? 0 : 2;
}

QuantPlan planQuantized(const Identity& id, const PlanContext& ctx, const CollArgs& a, const Capabilities& caps) {
  const View c{id, ctx};
  QuantPlan q;
  const int64_t min_nodes = c.ctx.cfg.num(Knob::QuantMinNodes);
  const bool model_decides = quantizeFromNodes(c.ctx, c.id.topo.uniform) == 0;
  q.quantize = c.id.topo.nnodes >= quantizeFromNodes(c.ctx, c.id.topo.uniform);
  if (!q.quantize) q.why = fmt::format("exact on {} node(s) (HICOLL_QUANT_MIN_NODES={})", c.id.topo.nnodes, min_nodes);
  if (!c.id.topo.uniform) return q;
  // The exact call as it would run, and the exact call that would move the images: their
  // paths and chunking are what each variant runs with.
  CollArgs exact = a;
  exact.quant = QuantArgs{};
  const CollPlan pe = planCall(c.id, c.ctx, exact, caps);
  CollArgs wire = a;  // the ReduceScatter quantizes inside its path
  wire.quant.packed = true;
  wire.quant.exact = false;
  if (a.coll == hcCollAllGather) {
    wire = exact;
    wire.dtype = hcUint8;
    wire.count = quant::packedBytes(std::min(a.count, quant::pieceElems(a.count, a.quant.block)), a.quant.block);
  }
  const CollPlan pw = planCall(c.id, c.ctx, wire, caps);
  const size_t bytes = callBytes(c, a), e = typeSize(a.dtype);
  auto quantized = [&](const View& v, const CollPlan& w, bool ip) {
    return predictQuantized(v.figures(bytes), modelShape(c.id, c.ctx, w.chunk_bytes, w.net_window), a.coll, algoOf(w),
                            bytes, ip, e, a.quant.block);
  };
  auto exactTime = [&](const View& v, const CollPlan& x, bool ip) {
    return predict(v.figures(bytes), modelShape(c.id, c.ctx, x.chunk_bytes, x.net_window), a.coll, algoOf(x), bytes,
                   ip);
  };
  if (model_decides) {
    // Out of place on every rank: the in-place flag may differ between ranks. Quantizing or not
    // changes the result: under HICOLL_REPRODUCIBLE both variants are planned and predicted with
    // the untimed figures.
    const View d = deciding(c, true);
    const bool untimed = &d.figures(bytes) != &c.figures(bytes);
    const double tq = untimed ? quantized(d, planRules(d, wire, caps), false).total() : quantized(c, pw, false).total();
    const double te =
        untimed ? exactTime(d, planRules(d, exact, caps), false).total() : exactTime(c, pe, false).total();
    q.quantize = tq < te;
    q.why = fmt::format("cost model (HICOLL_QUANT_MIN_NODES=0): {} {:.1f} us < {} {:.1f} us",
                        q.quantize ? "quantized" : "exact", std::min(tq, te) * 1e6, q.quantize ? "exact" : "quantized",
                        std::max(tq, te) * 1e6);
  }
  q.predicted = q.quantize ? quantized(c, pw, inPlace(c, a)) : exactTime(c, pe, inPlace(c, a));
  q.modelled = true;
  return q;
}

}  // namespace hicoll
