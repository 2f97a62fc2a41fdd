// The measurement loop and its results.
#pragma once

#include <string>
#include <vector>

#include "agbench.h"
#include "comm.h"

namespace agbench {

struct Measure {
  bool ran = false;                          // the variant supports this case
  std::vector<double> times_us;              // one per repetition, combined across ranks (-a)
  double time_us = 0, algbw = 0, busbw = 0;  // from the median time
  long long wrong = -1;                      // -1: not checked (-c 0)
  double predicted_us = 0;                   // the cost model's time for the call (hcStats), 0: none
  uint64_t chunk_bytes = 0, net_window = 0;  // the chunking it ran with (hcStats), 0: none
  // -I: every timed iteration's time per call, its slowest rank's (each repetition's after
  // its first -K), and nccl-tests' figures of them.
  std::vector<double> iter_us;
  struct IterStats {
    double min = 0, max = 0, avg = 0, p50 = 0, p95 = 0, p99 = 0, stdev = 0, cv_pct = 0;
  } iter;
};

// nccl-tests' per-iteration figures (nearest-rank percentiles; cv: stdev / mean).
Measure::IterStats iterStats(std::vector<double> us);

// One variant's hicoll statistics over a row (deltas, per call).
struct RowStats {
  bool valid = false;
  unsigned long long calls[hcNumPaths] = {};
  std::vector<double> inter_per_node;  // bytes sent to other nodes per call, by node
  double intra_per_rank = 0;           // max over ranks, per call
  std::string fallback_reason;
};

struct VariantResult {
  std::string name;
  Measure oop, ip;
  RowStats stats;
};

struct Row {
  size_t size = 0, count = 0;
  std::string type, redop;
  int root = -1;
  double memcpy_gbps = -1;              // median of memcpy_times_us (rank 0)
  std::vector<double> memcpy_times_us;  // one per repetition
  std::vector<VariantResult> v;         // v[0] is the measured hicoll path
  int cycle = 0;                        // of -N
  std::string timestamp;                // -S: when it was printed
};

struct RankInfo {
  int rank = 0, pid = 0, node = 0, local_rank = 0;
  char host[64] = {};
  char label[64] = {};
};

struct World {
  Sync* sync = nullptr;
  std::vector<Variant*> variants;  // [0]: hicoll as configured, then baselines
  int rank = 0, nranks = 1;
  std::string mode;      // self-launch, mpirun, launcher
  std::string mpi_note;  // how the MPI baseline was placed
};

// Runs every row; rank 0 prints the table (and writes the JSON). Returns the exit status:
// 0, or 1 when any element was wrong anywhere.
int runBench(const Args& a, World& w);
// agbench calibrate (calibrate.cc): the cost model's figures of these ranks, printed by rank 0
// and written to -J's file.
int runCalibrate(const Args& a, World& w, hcComm_t comm);

}  // namespace agbench
