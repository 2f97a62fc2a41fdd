// One typed plan per call: which path a collective takes and why, and the numbers its path
// runs with (block split, chunking), computed once from values that agree across ranks (the
// configuration checked at creation, the topology, the agreed call), so every rank plans
// alike. Host algorithms, the device engine and the statistics read the same plan; the reason
// is text for people and decides nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/coll.h"
#include "base/config.h"
#include "base/identity.h"
#include "base/machine_figures.h"
#include "plan/cost_model.h"
#include "plan/refine.h"

namespace hicoll {

// Why a call takes the path it takes.
enum class Rule {
  Hierarchical,       // the hierarchical path (on one node: its intra-node part)
  RingRequested,      // HICOLL_ALGO=ring (host buffers)
  Forced,             // HICOLL_FORCE_FALLBACK names the collective
  UnevenNodes,        // nodes have different numbers of ranks
  ScratchTooSmall,    // SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES < the per-rank block
  SortTooSmall,       // SMDDP_AG_SORT_BUFFER_SIZE_BYTES < nodes x the per-rank block
  NoSingleCopyReads,  // the path reads local peers' buffers in place and cannot (host, CMA)
  ModelChoseRing,     // HICOLL_ALGO=auto: the cost model predicts the ring faster
  Pairwise,           // AllToAll: every block goes straight to its rank (its one path)
};
const char* ruleName(Rule r);

// What the memory the call's buffers live in lets a path do.
struct Capabilities {
  bool device = false;              // device buffers: the device engine, NCCL as fallback
  bool single_copy_reads = true;    // host: local peers' buffers can be read in place (CMA)
  int max_reduce_inputs = 1 << 30;  // inputs one local reduction may combine
};

struct CollPlan {
  hcPath_t path = hcPathHierarchical;
  Rule rule = Rule::Hierarchical;
  std::string reason;  // for people ("" on the hierarchical path)
  // AllReduce: the latency path (one AllGather of every rank's buffer, then a local reduction)
  // for small buffers; otherwise ReduceScatter + AllGather on blocks of allreduce_block
  // elements per rank (the host rounds down and sends the tail through the latency path, the
  // device rounds up and pads).
  bool allreduce_small = false;
  size_t allreduce_block = 0;
  size_t block_bytes = 0;  // per-rank block of the hierarchical phases (what the buffer rules test)
  // On the hierarchical path: the block streams through the scratch and sort buffers in
  // `pieces` pieces of up to piece_bytes per rank, one phase each (1: it fits; planPieces).
  size_t pieces = 1;
  size_t piece_bytes = 0;
  // Chunking of the host's chunked algorithms: HICOLL_CHUNK_SIZE, on more than one node at most
  // HICOLL_NET_CHUNK_SIZE (a chunk may be one inter-node message); chunks sent to a rail peer
  // beyond those received from the rail peers (HICOLL_NET_WINDOW).
  size_t chunk_bytes = 0;
  size_t net_window = 0;
  // The cost model's time for this call on its path (host AllGather, ReduceScatter, AllReduce,
  // AllToAll on uniform nodes; modelled false otherwise). Under HICOLL_ALGO=auto the path, the AllReduce
  // split and the window are the ones it predicts fastest, from values alike on every rank
  // (never the in-place flag, which may differ).
  bool modelled = false;
  Prediction predicted;

  bool fallback() const { return path == hcPathFallback; }
};

// The last host plan of a collective on a communicator, with what it was made for.
struct PlanMemo {
  bool valid = false;
  size_t count = 0;
  hcDataType_t dtype = hcFloat32;
  size_t quant_block = 0;  // a quantized ReduceScatter that quantizes is predicted otherwise
  bool in_place = false, single_copy_reads = true;
  int max_reduce_inputs = 0;
  CollPlan plan;
};
struct PlanMemos {
  PlanMemo of[hcNumColls];
};

// What the planner reads of a communicator besides its Identity: values alike on every rank,
// set at creation (the configuration checked there, the cost model's figures, what the
// creation exchange says of the hosts), and what it keeps between calls.
struct PlanContext {
  Config cfg;  // what the communicator runs with (hcCommGetConfig)
  // HICOLL_MODEL_FILE's figures or the provider's defaults (with the link measured at the
  // first call, where it was).
  MachineFigures model;
  // model as it was before the link measurement changed it (unset: unchanged).
  std::optional<MachineFigures> unmeasured;
  // Per size band, the figures as refined from timed calls (plan/refine.h); empty: not refined.
  std::vector<MachineFigures> refined;
  // The ranks sharing one host's cores (one kernel, as emulated nodes do), its cores, the most
  // ring hops that leave one node.
  int host_ranks = 1, host_cores = 1, ring_cross = 1;
  // The host's ranks outnumber its cores (alike on every rank: from the exchanged infos).
  bool oversubscribed() const { return host_ranks > host_cores; }
  // The largest inter-node chunk the model may raise HICOLL_NET_CHUNK_SIZE to under
  // HICOLL_ALGO=auto: HICOLL_CHUNK_SIZE, within rxm's eager limit in this process (0: none).
  size_t net_chunk_cap = 0;
  mutable PlanMemos memo;                   // planCall's last plan per collective
  mutable std::set<uint64_t> model_logged;  // shapes whose model choice HICOLL_DEBUG=INFO has shown

  // The figures the model predicts a call of nccl-tests' size `bytes` with.
  const MachineFigures& figures(size_t bytes) const {
    return refined.empty() ? model : refined[static_cast<size_t>(sizeBand(bytes))];
  }
  // The figures no timing moved: what decides how a reduction sums under HICOLL_REPRODUCIBLE
  // (a timing differs between runs, and the refinement changes the figures mid-run).
  const MachineFigures& untimed() const { return unmeasured ? *unmeasured : model; }
  size_t scratchBytes() const { return static_cast<size_t>(cfg.num(Knob::ScratchBytes)); }
  size_t sortBytes() const { return static_cast<size_t>(cfg.num(Knob::SortBytes)); }
  long timeoutMs() const { return static_cast<long>(cfg.num(Knob::TimeoutMs)); }
};

// The AllReduce split, one definition for every path (the device engine asks it too):
// small_bytes is HICOLL_ALLREDUCE_SMALL_BYTES.
bool allReduceIsSmall(size_t count, size_t elem_bytes, int nranks, size_t small_bytes, const Capabilities& caps);
size_t allReduceBlock(size_t count, int nranks, const Capabilities& caps);  // elements per rank

// Blocks larger than the scratch or sort buffer stream through them: every rank cuts its block
// alike (from the agreed knobs, the topology and the call) into pieces of `elems` elements
// (the last may hold fewer), and each piece is one phase of the hierarchical algorithm on the
// same sub-range of every rank's block.
struct Pieces {
  size_t elems = 0;  // per piece; 0: not one element fits (the path cannot run)
  size_t count = 0;  // pieces
  size_t lenOf(size_t p, size_t total) const { return p + 1 < count ? elems : total - p * elems; }
};
// The most bytes of a rank's block of b bytes one hierarchical phase (AllGather or
// ReduceScatter) may hold with these buffers (SIZE_MAX: any): the scratch buffer where the
// AllGather stages the block there, the sort buffer's slot per node across nodes.
size_t pieceCapBytes(hcColl_t phase, size_t b, int nnodes, const Config& cfg, bool single_copy_reads);
// count elements of esize bytes in pieces of at most cap_bytes, as even as whole elements allow.
Pieces splitBlock(size_t count, size_t esize, size_t cap_bytes);

// nccl-tests' size of a call (AllGather: the whole output; an AllToAll's count is what this
// rank sends in all): what the cost model predicts for.
size_t callBytes(const Identity& id, const CollArgs& a);

// The model's view of a communicator: its nodes, hosts and the plan's chunking.
Shape modelShape(const Identity& id, const PlanContext& ctx, size_t chunk_bytes, size_t net_window);

// Whether the hierarchical path may run a (planned as p, before the model's choice): Rule::
// Hierarchical, or the rule that sends it to the fallback and why. The planner and
// hicoll_info --algorithms ask it.
struct Verdict {
  Rule rule = Rule::Hierarchical;
  std::string reason;      // why a rule refuses the path ("" when none does)
  bool elsewhere = false;  // no rule refuses it, but another path is preferred for this call
  bool ok() const { return reason.empty() && !elsewhere; }
};
Verdict hierarchicalRules(const Identity& id, const PlanContext& ctx, const CollArgs& a, const Capabilities& caps,
                          const CollPlan& p);

// The plan of a (a validated call) on a communicator, for a path with these capabilities.
CollPlan planCall(const Identity& id, const PlanContext& ctx, const CollArgs& a, const Capabilities& caps);
// The host plan planCall last made for a's collective, if a has its shape (null otherwise):
// valid until the next planCall of that collective.
const CollPlan* memoizedPlan(const Identity& id, const PlanContext& ctx, const CollArgs& a, const Capabilities& caps);

// A timed call for the model's refinement (plan/refine.h): a, planned as p (modelled),
// took seconds on this rank.
Observation observationOf(const Identity& id, const PlanContext& ctx, const CollArgs& a, const CollPlan& p,
                          double seconds);

// A host quantized call (hcAllGatherQuantized, hcReduceScatterQuantized, a.quant.block set):
// whether it quantizes or runs the exact collective, and the model's time for what it runs.
// Exact below HICOLL_QUANT_MIN_NODES nodes; with HICOLL_QUANT_MIN_NODES=0, exact wherever the
// model predicts the exact call faster (on one node memory, not a link, bounds it). Decided
// from values alike on every rank.
struct QuantPlan {
  bool quantize = true;
  std::string why;  // for people: which rule or which predictions decided
  bool modelled = false;
  Prediction predicted;  // of what runs
};
QuantPlan planQuantized(const Identity& id, const PlanContext& ctx, const CollArgs& a, const Capabilities& caps);
// HICOLL_QUANT_MIN_NODES as a rule: a quantized call quantizes on at least this many nodes.
// 0 means the cost model decides per call where it may (uniform host nodes); where it may not
// (uneven nodes, the device path), the rule is 2 nodes.
int64_t quantizeFromNodes(const PlanContext& ctx, bool model_may_decide);

}  // namespace hicoll
