// The cost model: the time of one host collective on every path, from the call's shape and a
// few machine figures (calibrated by `agbench --calibrate`, loaded from HICOLL_MODEL_FILE).
// Each path is a roofline over the resources it uses, plus its latencies:
//
//   time = latency + max(link, cpu, window) + fill + after
//
//   latency  the call's fixed cost and the synchronisations a small call waits for in turn
//   link     bytes over the busiest node link / its bandwidth (one NIC per node, shared by
//            the node's rails, as on the emulator)
//   cpu      the busiest rank's copies, sums and network stack work; the host's work over
//            its cores when its ranks outnumber them (emulated nodes on one machine)
//   window   chunks in flight per peer too few to cover the round trip
//   fill     the pipeline's start and drain: the stages not on the bottleneck, for one chunk
//   after    what runs once the pipeline is done (AllReduce's AllGather after its
//            ReduceScatter, the latency path's local sum)
//
// Pure functions: the plan asks for predictions, tests and agbench print them.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "base/coll.h"
#include "base/machine_figures.h"

namespace hicoll {

// Where the call runs.
struct Shape {
  int nodes = 1, local = 1;   // N nodes x L ranks per node (uniform)
  int host_ranks = 1;         // ranks that share one host's cores (all emulated nodes on a box)
  int cores = 1;              // cores of that host
  int ring_cross = 1;         // the most ring hops that leave one node (1: contiguous ranks)
  size_t chunk = 1 << 20;     // pipeline chunk (bytes)
  size_t window = 4;          // chunks in flight per peer
  size_t scratch = 16 << 20;  // scratch buffer per rank (AllReduce's one-node latency path)
};

enum class Algo { Hier, Ring };
const char* algoName(Algo a);

struct Prediction {
  double latency = 0, link = 0, cpu = 0, window = 0, fill = 0, after = 0;
  double total() const;
  const char* bound() const;  // "link", "cpu", "window", "latency" or "after": what dominates
  std::string terms() const;  // every term, for people (in microseconds)
};

// One collective on one path. bytes: nccl-tests' size (AllGather: the whole output;
// ReduceScatter: the whole input; AllReduce: the buffer; AllToAll: what one rank sends, its
// pairwise path whatever algo). allreduce_small: AllReduce's
// latency path (one AllGather of every buffer, then a local sum) instead of RS + AG.
Prediction predict(const MachineFigures& m, const Shape& s, hcColl_t coll, Algo algo, size_t bytes, bool in_place,
                   bool allreduce_small = false);

// A quantized call (hcAllGatherQuantized, hcReduceScatterQuantized) that quantizes: elements
// of elem bytes cross as int8 codes with one fp32 scale per block (base/quant_format.h).
//   AllGather: each rank quantizes its block once and dequantizes every rank's; the packed
//     images are gathered exactly, piece by piece (each piece its own call), while the caller
//     quantizes the next piece and dequantizes the last: the compute joins the cpu term,
//     and only the first and last pieces' compute is exposed (all of it with one piece).
//   ReduceScatter (hierarchical, across nodes): the partials cross the links as images,
//     quantized by their senders and dequantized to fp32 by their owners; the ring runs it
//     exactly.
Prediction predictQuantized(const MachineFigures& m, const Shape& s, hcColl_t coll, Algo algo, size_t bytes,
                            bool in_place, size_t elem, size_t block);

// The window that keeps a round trip's worth of chunks in flight on each rail flow, never
// below floor (the measured default).
size_t modelWindow(const MachineFigures& m, const Shape& s, size_t floor);

// The chunking the model picks for one call on one path: s.chunk (the measured default) or a
// doubling of it up to cap, each with its window (modelWindow from s.window when window_free,
// else s.window), whichever time_at predicts lowest. A larger chunk must be predicted at least
// kChunkGain faster than the best smaller one: its gain is fewer per-message costs, and where
// those do not bound the call the model's difference is noise beside what it does not see
// (on the emulator smaller chunks measured no slower on idle cores and slower on shared ones).
struct Chunking {
  size_t chunk = 0, window = 0;
  Prediction predicted;
};
constexpr double kChunkGain = 0.01;
Chunking modelChunking(const MachineFigures& m, Shape s, size_t cap, bool window_free,
                       const std::function<Prediction(const Shape&)>& time_at);

}  // namespace hicoll
