// hicoll sharded-parameter layer: MiCS-style sharded data parallelism over the public C API.
//
// The world is cut into partition groups of sharded_data_parallel_degree consecutive ranks
// (each holds one full copy of the training state, sharded) and replication groups (the ranks
// with the same partition rank in every partition group). Parameters are grouped into units
// (for example one per transformer block); each unit's parameters are flattened into one
// buffer, padded and split evenly over the partition group. Parameters smaller than
// sdp_param_persistence_threshold are not sharded: they stay replicated everywhere and their
// gradients are all-reduced over the whole data-parallel group.
//
// A training step, per micro-batch:
//   for each unit in forward order: unshard(u) [prefetch(next)] ... compute ... reshard(u)
//   for each unit in backward order: unshard(u) [prefetch(prev)] ... write grad(u, p) ...
//                                    reduceGrad(u); reshard(u)
//   finishMicroStep();
// and after gradient_accumulation_steps micro-batches: step(lr).
//
// The layer is framework-agnostic: it owns host buffers of a given dtype and hands out raw
// pointers (examples/train_gpt wraps them as libtorch tensors). All collectives run on one
// communication thread in submission order, so an AllGather or ReduceScatter overlaps the
// caller's compute; every wait is bounded. Errors are thrown as hicoll::sharded::Error.
#pragma once

#include <hicoll/hicoll.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace hicoll::sharded {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error("hicoll_sharded: " + msg) {}
};

// Data type of parameters and gradients for compute and communication. Master weights,
// gradient accumulators and optimizer state are always fp32.
enum class DType { Float32, BFloat16, Float16 };
hcDataType_t toHc(DType t);
size_t dtypeSize(DType t);
const char* dtypeName(DType t);
DType parseDType(const std::string& s);  // "fp32" | "bf16" | "fp16" (clear error otherwise)

// Where the layer's buffers live. Only Host is implemented: the optimizer runs on the CPU.
enum class MemoryKind { Host, Device };

struct Options {
  // The seed's knobs (same names and meanings).
  int sharded_data_parallel_degree = 1;              // partition group size; divides the world
  size_t sdp_reduce_bucket_size = 500000000;         // elements per gradient ReduceScatter call
  size_t sdp_param_persistence_threshold = 1000000;  // params with fewer elements: replicated
  size_t sdp_max_live_parameters = 1000000000;       // gathered elements alive at once
  bool sdp_hierarchical_allgather = true;            // false: partition AllGather uses the ring
  double sdp_gradient_clipping = 1.0;                // global L2 norm; 0 disables
  // Forward/backward parameter gathers as int8 with one scale per sdp_quant_block elements
  // (hcAllGatherQuantized, ZeRO++'s qwZ); the master shard and the optimizer stay fp32.
  bool sdp_quantized_allgather = false;
  // Gradient ReduceScatters with int8 partials across nodes (hcReduceScatterQuantized; sums
  // stay fp32 within the node and at the owner).
  bool sdp_quantized_reducescatter = false;
  size_t sdp_quant_block = 256;

  DType compute_dtype = DType::Float32;
  MemoryKind memory = MemoryKind::Host;
  int gradient_accumulation_steps = 1;  // micro-batches per step(); grads are their mean

  // AdamW (torch.optim.AdamW semantics, decoupled weight decay).
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;

  // Dynamic loss scaling, used with Float16 only.
  double initial_loss_scale = 65536.0;
  int loss_scale_window = 1000;  // finite steps before the scale doubles
  double min_loss_scale = 1.0;

  size_t shard_alignment = 16;  // shard sizes are multiples of this many elements
  long wait_timeout_ms = 0;     // bound on each wait for the comm thread; 0: 2*HICOLL_TIMEOUT_MS+10s
};

// Throws Error naming the knob when a value is out of range or the degree does not divide
// the world size.
void validate(const Options& opt, int world_size);

// ---- Sharding arithmetic (one helper, as llm.c's zero.cuh) ---------------------------------

// A flat buffer of `numel` real elements, padded to `padded` and split into `degree` shards
// of `shard` elements; this rank holds [begin(), end()) of the flat index space.
struct ShardInfo {
  size_t numel = 0;
  size_t padded = 0;
  size_t shard = 0;
  int degree = 1;
  int rank = 0;

  static ShardInfo make(size_t numel, int degree, int rank, size_t align = 1);
  size_t begin(int r) const { return static_cast<size_t>(r) * shard; }
  size_t begin() const { return begin(rank); }
  size_t end() const { return begin() + shard; }
  size_t padding() const { return padded - numel; }
  size_t realCount(int r) const;  // real (non-padding) elements in shard r
  size_t realCount() const { return realCount(rank); }
  int owner(size_t flat) const { return static_cast<int>(flat / shard); }

  // The part of the flat range [flat_begin, flat_end) that falls in this rank's shard.
  struct Overlap {
    size_t flat = 0;   // first flat index of the overlap
    size_t local = 0;  // same element, as an index into the shard
    size_t count = 0;  // 0 when disjoint
  };
  Overlap overlap(size_t flat_begin, size_t flat_end) const;

  // ReduceScatter buckets. A bucket is the same column range [local, local+count) of every
  // rank's shard, so one call reduces degree*count <= bucket_elems elements. Needs
  // bucket_elems >= degree. Buckets cover [0, shard) in order; an empty shard has none.
  struct Bucket {
    size_t local = 0;
    size_t count = 0;
  };
  std::vector<Bucket> buckets(size_t bucket_elems) const;
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool weight_decay = true;
  size_t numel() const;
};

struct UnitSpec {
  std::string name;
  std::vector<ParamSpec> params;
};

// Where each parameter of a unit lives: in the unit's sharded flat buffer, or (below the
// persistence threshold) in the replicated persistent buffer shared by all units.
struct ParamPlacement {
  bool persistent = false;
  size_t offset = 0;  // into the unit's flat buffer, or into the persistent buffer
  size_t numel = 0;
};

struct UnitPlan {
  std::string name;
  std::vector<ParamPlacement> params;  // in spec order
  size_t persistent_begin = 0;         // this unit's range in the persistent buffer
  size_t persistent_numel = 0;
  ShardInfo shard;  // of the unit's sharded flat buffer
};

// Plans all units; persistent parameters are packed unit after unit into one buffer.
std::vector<UnitPlan> planUnits(const std::vector<UnitSpec>& units, size_t persistence_threshold, int degree, int rank,
                                size_t align);

// ---- The layer ------------------------------------------------------------------------

struct StepResult {
  double grad_norm = 0;   // before clipping; inf/nan when the step was skipped
  double clip_coef = 1;   // factor applied to the gradients
  bool skipped = false;   // non-finite gradients (fp16 overflow): no update
  double loss_scale = 1;  // scale to use for the next step's backward
};

struct Stats {
  // Bytes of training state held by this rank: parameters (fp32 master + compute copy),
  // gradient accumulators and optimizer state. Sharded state shrinks with the degree.
  size_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;
  size_t state_bytes_peak = 0;      // peak of param+grad+optim
  size_t transient_bytes_peak = 0;  // peak of gathered params, full grads, staging
  size_t total_bytes_peak = 0;      // peak of everything the layer allocated
  size_t live_params_peak = 0;      // most gathered elements alive at once
  uint64_t prefetches = 0, prefetches_paused = 0;
  uint64_t allgathers = 0, reducescatters = 0, allreduces = 0;
  double comm_busy_s = 0;  // time the comm thread spent inside collectives
  double comm_wait_s = 0;  // time the caller was blocked waiting for them
  uint64_t steps = 0, skipped_steps = 0;
};

class ShardedParams {
 public:
  // Collective over `world` (which stays the caller's): splits the data-parallel, partition
  // and replication communicators. Throws Error on invalid options or a failed split.
  static std::unique_ptr<ShardedParams> create(hcComm_t world, std::vector<UnitSpec> units, const Options& opt);
  ~ShardedParams();
  ShardedParams(const ShardedParams&) = delete;
  ShardedParams& operator=(const ShardedParams&) = delete;

  int rank() const;  // in the world
  int worldSize() const;
  int degree() const;           // partition group size
  int partitionRank() const;    // rank within the partition group
  int replicationRank() const;  // index of this rank's partition group
  int numUnits() const;
  const UnitPlan& plan(int unit) const;
  const UnitSpec& spec(int unit) const;
  const Options& options() const;

  // Sets every parameter from full fp32 values. init(unit, param, out, numel) must write the
  // same values on every rank (e.g. from a seeded generator); each rank keeps its shard.
  using Initializer = std::function<void(int unit, int param, float* out, size_t numel)>;
  void initialize(const Initializer& init);

  // Starts gathering unit u unless it is live, in flight, or the sdp_max_live_parameters cap
  // would be exceeded (then the prefetch pauses: unshard gathers it later).
  void prefetch(int unit);
  // Blocks until unit u's parameters are gathered. Throws if the cap cannot be met.
  void unshard(int unit);
  // Compute-dtype data of parameter p; valid between unshard(u) and reshard(u) (persistent
  // parameters are always valid). Read only.
  const void* param(int unit, int p) const;
  // Frees the gathered buffer of unit u (a no-op for degree 1, where it is the shard itself).
  void reshard(int unit);

  // Compute-dtype gradient of parameter p for this micro-batch, zeroed on first use. The
  // caller writes the gradient of its local loss (a mean over its own samples; scaled by
  // lossScale() with fp16); the layer turns these into the mean over the global batch.
  void* grad(int unit, int p);
  // Hands unit u's gradients to the bucketed ReduceScatter (asynchronous); the full
  // gradient buffer is freed when it completes.
  void reduceGrad(int unit);
  // Waits for this micro-batch's reductions.
  void finishMicroStep();
  // The accumulation boundary (MiCS's second hop): the replication-group AllReduce of the
  // gradient shards and the data-parallel AllReduce of the persistent gradients. Needs
  // gradient_accumulation_steps finished micro-batches; step() calls it when not yet done.
  void synchronizeGradients();
  // Global L2 clipping, loss-scale update and AdamW on the fp32 master shards.
  StepResult step(double lr);
  double lossScale() const;  // multiply the loss by this before backward (1 unless fp16)

  // Sum over the data-parallel group, through the comm thread (for metrics such as the loss).
  void allReduceSum(double* data, size_t count);

  // Full fp32 master values of one parameter (collective over the partition group).
  std::vector<float> gatherMaster(int unit, int p);
  // Full fp32 gradient of one parameter, the mean over the global batch (collective over the
  // partition group; valid between synchronizeGradients() and step()).
  std::vector<float> gatherGrad(int unit, int p);

  // The layer's communicators, for statistics (hcCommGetStats). PartitionAllGather is the
  // partition group's AllGather communicator (a separate ring one when
  // sdp_hierarchical_allgather is false).
  enum class Group { DataParallel, Partition, PartitionAllGather, Replication };
  hcComm_t communicator(Group g) const;

  // Sharded checkpoint: each partition rank of replication group 0 writes its shards, rank 0
  // the persistent state and meta.json (with `extra_json`, a JSON object, stored verbatim).
  // Collective over the world. The directory is created; an existing checkpoint is replaced.
  void save(const std::string& dir, const std::string& extra_json = "{}");
  // Loads a checkpoint written by any degree and world size (parameter names and sizes
  // must match). Collective; returns the stored extra_json.
  std::string load(const std::string& dir);

  Stats stats() const;

  struct Impl;

 private:
  explicit ShardedParams(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hicoll::sharded
