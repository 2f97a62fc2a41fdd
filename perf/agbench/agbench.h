// agbench: nccl-tests-style benchmark of the hicoll host collectives, with side-by-side
// baselines (Open MPI, hicoll's own flat ring, single-core memcpy).
#pragma once

#include <hicoll/hicoll.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "launch/launch.h"

namespace agbench {

// SendRecv: ping-pong between rank pairs (sendRecvPeer), nccl-tests' name for point-to-point.
enum class Coll { AllGather, ReduceScatter, AllReduce, Broadcast, AllToAll, SendRecv };

const char* collName(Coll c);
bool collReduces(Coll c);
// hcStats' index of the collective; hcNumColls for SendRecv (counted as p2p, not per path).
hcColl_t statsIndex(Coll c);
// SendRecv's partner of rank (nranks even): i <-> i + nranks / 2.
int sendRecvPeer(int rank, int nranks);
// Messages one timed call moves one way: a SendRecv call is a round trip, reported per half.
int legsPerCall(Coll c);

struct TypeDesc {
  hcDataType_t dt;
  const char* name;  // as nccl-tests prints it
  size_t size;
  int64_t exact;  // integers 0..exact are represented exactly and without overflow
};
const std::vector<TypeDesc>& allTypes();

// Reductions, numbered as hcRedOp_t; kOpMulSum is a pre-multiplied sum (scalar 2).
constexpr int kOpNone = -1;
constexpr int kOpMulSum = 100;
const char* opName(int op);
const std::vector<int>& allOps();

enum class Baseline { Mpi, Memcpy, Ring, Hier };

struct Args {
  Coll coll = Coll::AllGather;
  size_t min_bytes = 32u << 20, max_bytes = 32u << 20, step_bytes = 1u << 20;
  int step_factor = 1;
  int iters = 20, warmup = 5, check = 1;
  size_t iters_bytes = 0;  // --iters-bytes: at least this many bytes per timing (0: -n)
  std::vector<TypeDesc> types;
  std::vector<int> ops;  // kOpNone for collectives without a reduction
  int root = 0;
  int average = 1;   // 0 rank 0, 1 average, 2 min, 3 max (nccl-tests -a)
  int blocking = 0;  // -z: 1 barrier after every call (timed), 3 after every iteration (untimed), 0/2 none
  int timeout_s = 0;
  std::string json;
  int reps = 1;
  bool verbose = false;
  bool calibrate = false;  // the calibrate subcommand: measure the model's figures, no benchmark
  // nccl-tests' other flags: those that change what is timed or printed. (The ones that mean
  // nothing for host buffers are accepted at their defaults; the rest are refused, named.)
  int agg_iters = 1;                // -m: calls per timed iteration (time per call reported)
  int run_cycles = 1;               // -N: the whole sweep this many times, each printed
  int unalign = 0;                  // -u: buffers start this many elements past an aligned address
  bool report_cputime = false;      // -C: the time column is the host's time (for host calls, the same)
  bool report_timestamps = false;   // -S: each row ends with the time it was printed
  bool memory_report = false;       // -M: the ranks' memory after the run
  int per_iter = 0;                 // -I: every iteration timed too (per-iteration figures)
  int per_iter_skip = 0;            // -K: leading iterations of each timing not in them
  int ngpus = 0;                    // -g as given (agbench times host buffers: the preamble says so)
  std::string program = "agbench";  // the footer's "Collective test concluded"

  // Launch.
  int np = 2, nodes = 1;
  hicoll::launch::Layout layout = hicoll::launch::Layout::Contiguous;
  int node_rank = -1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string mpirun = "mpirun";
  std::string mpirun_args;
  bool nodes_given = false, np_given = false;

  std::string algo;          // "" (library default), "hier" or "ring"
  bool node_memory = false;  // --mem node: the buffers come from hcMemAlloc
  size_t quant_block = 0;    // --quant B: also measure the quantized call (block B)
  std::vector<Baseline> baselines;
  bool has(Baseline b) const;

  std::vector<std::string> argv;  // as given, for re-exec and the JSON record
  std::vector<size_t> sizes() const;
  uint64_t hash() const;  // of everything the ranks must agree on
};

// Parses argv; on --help or an error prints and returns false with *exit_code set.
bool parseArgs(int argc, char** argv, Args* args, int* exit_code);
// "64M" -> 67108864 (binary K/M/G suffixes); throws on garbage.
size_t parseBytes(const std::string& s);

// Element counts of one row, as nccl-tests' getCollByteCount.
struct Geometry {
  size_t size_bytes = 0;                  // the "size" column: the full buffer
  size_t count = 0;                       // the "count" column: elements per rank (the call's count argument)
  size_t send_count = 0, recv_count = 0;  // elements in the send / receive buffer
};
Geometry geometry(Coll c, size_t bytes, size_t type_size, int nranks);
// algbw and busbw in GB/s for one call of `seconds`.
void bandwidth(Coll c, const Geometry& g, size_t type_size, int nranks, double seconds, double* algbw, double* busbw);

}  // namespace agbench
