// State of a ShardedParams instance, shared by sharded.cc and checkpoint.cc.
#pragma once

#include <array>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hicoll/sharded.hpp"
#include "sharded/comm_queue.h"

namespace hicoll::sharded {

// An exception's message without the "hicoll_sharded: " prefix, for nesting into another.
inline std::string bareMessage(const std::exception& e) {
  const std::string m = e.what(), prefix = "hicoll_sharded: ";
  return m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m;
}

// Accounting of every byte the layer allocates, by what it holds.
enum class Cat { Param, Grad, Optim, Transient, Count };

class MemTracker {
 public:
  void add(Cat c, long long delta);
  void fill(Stats& s) const;

 private:
  mutable std::mutex mu_;
  std::array<long long, static_cast<int>(Cat::Count)> cur_{};
  size_t state_peak_ = 0, transient_peak_ = 0, total_peak_ = 0;
};

// A zero-initialised, 64-byte aligned host buffer that reports itself to a MemTracker.
class Buffer {
 public:
  Buffer() = default;
  Buffer(MemTracker& t, Cat c, size_t bytes);
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void reset();
  void* data() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  char* bytes() const { return static_cast<char*>(ptr_); }
  size_t size() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  MemTracker* tracker_ = nullptr;
  Cat cat_ = Cat::Transient;
};

// Owns a communicator split off by the layer.
struct CommDeleter {
  void operator()(hcComm* c) const { hcCommDestroy(c); }
};
using CommPtr = std::unique_ptr<hcComm, CommDeleter>;

struct UnitState {
  enum class Live { Free, Gathering, Live };
  // fp32 shards: master weights, AdamW moments, gradient accumulator.
  Buffer master, exp_avg, exp_avg_sq, grad_acc;
  Buffer compute;                     // compute-dtype copy of the master shard (empty in fp32: master is used)
  Buffer full;                        // the gathered unit (degree > 1, while unsharded)
  std::shared_ptr<Buffer> full_grad;  // this micro-batch's gradient, until reduced
  Live live = Live::Free;
  CommQueue::Ticket gather;
  int reduced_in_micro = 0;  // reduceGrad calls in the current micro-batch
};

struct ShardedParams::Impl {
  Options opt;
  std::vector<UnitSpec> specs;
  std::vector<UnitPlan> plans;
  int rank = 0, world = 1, degree = 1, prank = 0, rrank = 0, nrepl = 1;
  CommPtr dp, part, part_ag, repl;  // part_ag is null when the AllGather uses `part`
  hcComm_t agComm() const { return part_ag ? part_ag.get() : part.get(); }

  MemTracker mem;
  std::vector<UnitState> units;
  size_t pnumel = 0;  // persistent (replicated) parameters, all units
  Buffer p_master, p_avg, p_avg_sq, p_grad_acc, p_compute, p_grad;

  size_t live_elems = 0;
  int micro = 0;
  bool synced = false;  // synchronizeGradients() ran for the pending step
  long long adam_step = 0;
  double loss_scale = 1.0;
  int good_steps = 0;

  std::atomic<uint64_t> n_ag{0}, n_rs{0}, n_ar{0};
  std::atomic<long long> busy_ns{0};
  uint64_t prefetches = 0, prefetches_paused = 0, steps = 0, skipped = 0;
  size_t live_peak = 0;

  std::unique_ptr<CommQueue> queue;

  size_t esize() const { return dtypeSize(opt.compute_dtype); }
  bool fp32() const { return opt.compute_dtype == DType::Float32; }
  // The compute-dtype shard of unit u (the master itself in fp32).
  void* computeShard(int u) const { return fp32() ? units[u].master.data() : units[u].compute.data(); }
  void* persistentCompute() const { return fp32() ? p_master.data() : p_compute.data(); }

  // Runs one collective on the comm thread's side: times it, counts it, checks the result.
  void call(const std::function<hcResult_t()>& coll, hcComm_t comm);
  // Synchronous in-place AllReduce of doubles on the comm thread.
  void allReduceDoubles(double* data, size_t n, hcRedOp_t op, hcComm_t comm, const char* group);
  std::string describe(const char* coll, int unit, size_t count, const char* group) const;
  void checkUnit(int u) const;
  void refreshCompute();  // compute copies from the fp32 masters
  void zeroGrads();
  // AllGather of unit u's fp32 shard `src` (master or gradient), parameter p extracted.
  std::vector<float> gatherParam(int u, int p, const float* shard_src, const float* persistent_src);
  // All ranks learn whether any rank failed; throws on every rank if one did.
  void agreeOrThrow(const std::string& local_error, const std::string& what);
};

}  // namespace hicoll::sharded
