// The machine figures of the cost model (plan/cost_model.h) and the model file that holds
// them (HICOLL_MODEL_FILE): a small JSON object written by `agbench calibrate` and read at
// communicator creation.
#pragma once

#include <string>

namespace hicoll {

// Every field is what one measurement gives (agbench calibrate, perf/agbench/calibrate.cc).
struct MachineFigures {
  std::string source = "built-in defaults";  // where they come from (file, provider)
  double call_s = 3e-6;                      // a call's fixed cost: checks, plan, agreement, bookkeeping
  double shm_alpha_s = 3e-6;                 // one intra-node synchronisation (a post seen by the node's ranks)
  double copy_Bps = 8e9;                     // one core's memcpy / single-copy read throughput
  double reduce_Bps = 8e9;                   // one core's sum throughput, input bytes per second
  double net_alpha_s = 50e-6;                // one inter-node message's latency, one way
  double net_Bps = 1.25e9;                   // one node's link, each direction
  double net_cpu_s_per_B = 0;                // CPU time per byte sent or received across nodes (kernel TCP)
  double net_msg_s = 5e-6;                   // CPU time per inter-node message (chunk) sent or received
  // One core's int8 block quantization: full-precision bytes quantized or dequantized per
  // second (the quantized collectives). Optional in the file (older files keep the default).
  double quant_Bps = 4e9;
};

// The figures for a libfabric provider when there is no model file ("tcp;ofi_rxm", "efa", ...).
MachineFigures defaultFigures(const std::string& provider);

// Parses the figures from JSON text; throws hcInvalidArgument naming `what` (the file) and the
// field on anything missing, unknown, negative or not a number.
MachineFigures parseFigures(const std::string& json_text, const std::string& what);
// Reads and parses a file (the text is also returned, for the cross-rank check): a regular file
// of at most 1 MiB, opened without blocking; every error names HICOLL_MODEL_FILE and the path.
MachineFigures loadFigures(const std::string& path, std::string* text = nullptr);
// The figures as the JSON the file holds (a note is kept with them: how they were measured).
std::string figuresJson(const MachineFigures& m, const std::string& note = "");

}  // namespace hicoll
