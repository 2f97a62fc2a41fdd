// The cost model refining its figures from the calls it has timed, for a communicator whose
// model has no file (HICOLL_MODEL_FILE unset): the built-in figures are a guess (the link is
// measured at the first call, core/net_probe.h; the CPU's and the latencies are not), and an
// uncalibrated HICOLL_ALGO=auto decides by them.
//
// Each timed call speaks for the figures of the term that bounds its prediction: the
// latencies (call_s, shm_alpha_s, net_alpha_s: small calls, and the window a round trip
// limits), the link (net_Bps) or the CPU (copy, sum, quantization, the network stack's work).
// A call's factor is what that class's figures must be multiplied by (as times) for the model
// to predict the call's measured time; a rank's factor per class and band of call sizes is the
// median of its calls' there: one factor per class fitted over every size held neither the
// small calls nor the large (perf/results/2026-12-05-avx2.md). A band no call of a class was
// timed in takes that class's factor from the nearest band that has one on the side where the
// class shows best: the latencies from smaller calls, the link and the CPU from larger ones
// (never the other way: a small call's burst says nothing of a large call's link); with none,
// the class keeps its figures.
// At fixed counts of timed calls (alike on every rank) the ranks exchange their factors, every
// rank takes the same combination (per class the median over the ranks: a rank that waited for
// a late peer measured that wait too, and a late rank may find much of its data already there,
// so neither the slowest nor the fastest rank's time is the call's) and scales its figures by
// it, so every rank goes on deciding alike. Each step and the product of steps are bounded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/coll.h"
#include "base/machine_figures.h"
#include "plan/cost_model.h"

namespace hicoll {

enum class FigureClass { Latency, Link, Cpu };
constexpr int kFigureClasses = 3;
const char* figureClassName(FigureClass c);

// One timed call: what the model predicts it from, and how long it took on this rank.
struct Observation {
  Shape shape;
  hcColl_t coll = hcCollAllGather;
  Algo algo = Algo::Hier;
  size_t bytes = 0;  // nccl-tests' size (plan.h callBytes)
  bool in_place = false, allreduce_small = false;
  size_t quant_elem = 0, quant_block = 0;  // a ReduceScatter that quantizes (else 0)
  double seconds = 0;
};
Prediction predictObservation(const MachineFigures& m, const Observation& o);

// The figures with one class's times multiplied by f (its rates divided by f).
MachineFigures scaledFigures(MachineFigures m, FigureClass c, double f);
// The class whose figures bound p, and the share of p's time its term is. A call speaks for
// its class only where that term is at least kRefineShare of its time: a 64 KiB call whose
// link term barely exceeds its latency says little of the link (an emulated link's token
// bucket, a NIC's burst, let it through faster than the bulk rate the probe measured).
FigureClass classOf(const Prediction& p);
double classShare(const Prediction& p, FigureClass c);
constexpr double kRefineShare = 0.5;
// The factor of o's class, within [1/kRefineStep, kRefineStep], that makes the model predict
// o.seconds.
constexpr double kRefineStep = 4;
double fitFactor(const MachineFigures& m, const Observation& o, FigureClass c);

// Bands of call sizes (nccl-tests' size), each 4x wide: band k holds [4^k, 4^(k+1)) x 4 KiB,
// band 0 everything below 16 KiB, the last everything above.
constexpr int kSizeBands = 12;
int sizeBand(size_t bytes);
size_t bandStart(int band);  // its smallest size (0 for band 0)

// Per band and class: a factor and how many calls gave it (0: none, the factor is 1).
struct Corrections {
  Corrections();
  double factor[kSizeBands][kFigureClasses];
  double calls[kSizeBands][kFigureClasses];  // doubles: exchanged as one array
};
// Every rank's corrections, in rank order, into one: per band and class the median factor of
// the ranks with at least kRefineMinCalls calls of it (1 if none). The same inputs give the
// same bits on every rank.
constexpr int kRefineMinCalls = 3;
Corrections combineCorrections(const std::vector<Corrections>& ranks);

// The timed calls of one rank and the schedule of refinements.
class Refiner {
 public:
  // first: the count of timed calls at which the first refinement runs (then 4x, 16x, 64x
  // that count: kRefinements in all); 0: never.
  static constexpr int kRefinements = 4;
  static constexpr size_t kKept = 192;
  explicit Refiner(int64_t first = 0);

  // Whether calls are still timed (a refinement is still due).
  bool active() const { return first_ > 0 && done_ < kRefinements; }
  // Counts a timed call (alike on every rank) and keeps it (the newest kKept), unless skip
  // (the first call across nodes: it opened the network); true when a refinement is due now.
  bool add(const Observation& o, bool skip);
  // This rank's factors from the calls kept, each classed under its band's figures in use
  // (bands(base)).
  Corrections local(const MachineFigures& base) const;
  // Takes the agreed corrections (each step within kRefineStep, the product of every step
  // within kRefineStep^2 of the start) and returns bands(base).
  std::vector<MachineFigures> apply(const MachineFigures& base, const Corrections& agreed);
  // Per band, base scaled by the band's factors so far (empty before the first refinement).
  std::vector<MachineFigures> bands(const MachineFigures& base) const;
  // For the model's source: "refined from N calls in K size bands".
  std::string describe() const;
  // Per band refined: "from 64 KiB: times x.. latency, x.. link, x.. cpu; ..." (the log).
  std::string factors() const;
  int64_t calls() const { return calls_; }

 private:
  int64_t first_ = 0, next_ = 0, calls_ = 0;
  int done_ = 0;
  std::vector<Observation> kept_;
  size_t oldest_ = 0;  // the slot the next call replaces once full
  // The factor in use for band b and class c: its own or the nearest one's (above).
  double effective(int b, int c) const;
  bool applied_ = false;
  double total_[kSizeBands][kFigureClasses];
  bool fitted_[kSizeBands][kFigureClasses] = {};
};

}  // namespace hicoll
