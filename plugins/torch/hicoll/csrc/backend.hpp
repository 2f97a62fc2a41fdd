// c10d::Backend for hicoll: the collectives FSDP/ZeRO use run on a hicoll communicator
// bootstrapped through the c10d Store; everything else, and every call hicoll declines, is
// forwarded (announced and counted) to a gloo (CPU) or NCCL (CUDA) backend made lazily on the
// same store.
//
// Where each part lives: backend.cc (lifecycle, the worker queue, submit/forward), engine.cc
// (what hicoll accepts and the C calls), collectives.cc (the ops run by hicoll), composed.cc
// (ops built from those: reduce, gather, scatter, allgather_coalesced), alltoall.cc, forwarded.cc (ops
// hicoll has no call for), store_bridge.cc, work.cc, tensor_ops.cc.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hicoll/hicoll.h"
#include "store_bridge.hpp"
#include "work.hpp"

#define HICOLL_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
// Backend::split / getBackendOptions / setTimeout / getError (torch >= 2.8).
#define HICOLL_TORCH_HAS_SPLIT HICOLL_TORCH_AT_LEAST(2, 8)
// Backend::shrink / supportsShrinking (seen in torch 2.11 headers; absent in 2.7), and
// hcCommShrink in libhicoll (the
// build defines HICOLL_HAVE_COMM_SHRINK when hicoll.h declares it).
#if HICOLL_TORCH_AT_LEAST(2, 11) && defined(HICOLL_HAVE_COMM_SHRINK)
#define HICOLL_TORCH_HAS_SHRINK 1
#else
#define HICOLL_TORCH_HAS_SHRINK 0
#endif

namespace hicoll_torch {

// Makes the fallback backend ("gloo" for device "cpu", "nccl" for "cuda") for a group given by
// (store, rank, size). Implemented in Python (torch.distributed owns those classes); it is a
// collective over the group, so every rank calls it at the same point of the program.
using FallbackFactory = std::function<c10::intrusive_ptr<c10d::Backend>(const c10::intrusive_ptr<c10d::Store>& store,
                                                                        int rank, int size, const std::string& device)>;

// Thrown inside a work's run function when hicoll returns hcUnsupported.
struct Declined {
  std::string reason;
};

class HicollBackend : public c10d::Backend {
 public:
  struct Config {
    std::chrono::milliseconds timeout{std::chrono::minutes(30)};
    std::string group_name;
    std::vector<uint64_t> global_ranks;
    FallbackFactory fallback_factory;
    // hicoll.torch.Options: hcConfig_t fields for this group's communicator (by field name).
    std::map<std::string, std::string> text_options;
    std::map<std::string, long long> int_options;
  };

  // Bootstraps a communicator on `store` (a collective over the group). Each construction on
  // one store is an incarnation the members agree on (store.add), so a group destroyed and made
  // again on the same store never reads the previous communicator's keys.
  HicollBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Config cfg);
  ~HicollBackend() override;

  // Around an existing communicator (shrink): `store` is already this group's own.
  HicollBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Config cfg, hcComm_t comm);

  // Makes `b` known to shutdownAll (every backend the plugin makes goes through it).
  static c10::intrusive_ptr<HicollBackend> track(c10::intrusive_ptr<HicollBackend> b);
  // Shuts down every live backend of this process (hicoll.torch registers it with atexit): the
  // workers finish their queued calls and are joined while the interpreter is still whole.
  static void shutdownAll();

  const std::string getBackendName() const override { return "hicoll"; }
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void abort() override;
  void shutdown() override;
#if HICOLL_TORCH_HAS_SPLIT
  void setTimeout(std::chrono::milliseconds timeout) override {
    cfg_.timeout = timeout;
  }
  c10d::ErrorType getError() override;
  bool supportsSplitting() const override {
    return true;
  }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
#endif
  // FSDP2's set_allocate_memory_from_process_group_for_comm(True): CPU communication buffers
  // in node memory (hcMemAlloc), which the node's ranks read where they lie; freed (kept for
  // reuse) when torch frees the tensor. Device buffers are not offered (deviceIdx >= 0).
  bool supportsTensorAlloc(c10::DeviceIndex deviceIdx) override {
    return deviceIdx < 0;
  }
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;
#if HICOLL_TORCH_HAS_SHRINK
  bool supportsShrinking() const override {
    return true;
  }
  // Survivors only, after a failure: hcCommShrink, then a backend around the new communicator.
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<Options>& opts) override;
#endif

  // Run by hicoll.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // hcAllGatherQuantized (int8, one fp32 scale per `block` elements) of CPU float32 /
  // bfloat16 / float16 tensors; hicoll.torch.QuantizedAllGather calls it for FSDP2.
  c10::intrusive_ptr<c10d::Work> allgatherQuantized(at::Tensor& output, at::Tensor& input, int64_t block);
  // hcReduceScatterQuantized (int8 partials across nodes; sum, avg, pre-multiplied sum) of CPU
  // float32 / bfloat16 / float16 tensors; hicoll.torch.QuantizedReduceScatter calls it.
  c10::intrusive_ptr<c10d::Work> reducescatterQuantized(at::Tensor& output, at::Tensor& input, const c10d::ReduceOp& op,
                                                        int64_t block);

  // Composed from hicoll's calls (composed.cc).
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;

  // hcAllToAllv (alltoall.cc): CPU tensors; CUDA ones go to NCCL.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

  // Point-to-point (p2p.cc): CPU tensors with tag 0 on hicoll, the rest on the fallback.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  // On send / recv, as gloo's: names the ranks that did not arrive; a failure revokes the group.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  // Forwarded to the fallback backend (forwarded.cc).
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;

  // Observability for Python (hicoll.torch.fallback_counts and friends).
  std::map<std::string, int64_t> hicollCounts() const;
  std::map<std::string, int64_t> fallbackCounts() const;
  std::map<std::string, std::string> fallbackReasons() const;
  hcStats stats() const;
  hcConfig_t config() const;  // hcCommGetConfig
  const std::string& groupName() const {
    return cfg_.group_name;
  }
  uint64_t incarnation() const {
    return incarnation_;
  }

 private:
  using WorkPtr = c10::intrusive_ptr<c10d::Work>;
  using FallbackCall = std::function<WorkPtr(c10d::Backend&)>;
  // Runs the call on hicoll: stream NULL for host tensors (worker thread), the caller's
  // current CUDA stream for CUDA tensors (caller's thread).
  using RunFn = std::function<void(hcStream_t)>;

  void start();         // starts the worker
  void readConfig();    // logging and forced fallbacks from the communicator's configuration
  void revokeOthers();  // hcCommRevoke on every other live group of this process

  std::chrono::milliseconds opTimeout(std::chrono::milliseconds requested) const;
  // Why hicoll will not run `coll` (a name of HICOLL_FORCE_FALLBACK) on these tensors, if it won't.
  std::optional<std::string> declineReason(const char* coll, const std::vector<at::Tensor>& ts,
                                           const c10d::ReduceOp* op) const;
  // Queues `run` on the worker (hicoll path, CPU tensors), runs it on the caller's current
  // stream (CUDA tensors), or, when `reason` is set, makes the fallback call. `probe` holds
  // the inputs (their device decides; with `outputs`, they are recorded on the stream).
  WorkPtr submit(c10d::OpType type, const char* op, std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                 const std::vector<at::Tensor>& probe, std::optional<std::string> reason, RunFn run, FallbackCall fb);
#ifdef HICOLL_PLUGIN_CUDA
  WorkPtr runOnStream(c10d::OpType type, const char* op, std::vector<at::Tensor> outputs,
                      std::chrono::milliseconds timeout, const std::vector<at::Tensor>& probe, const RunFn& run,
                      const FallbackCall& fb);
#endif
  // Waits until every queued host call has run (issue order between host and device calls).
  void drainQueue();
  // Ops hicoll does not implement: CPU calls go through the queue (issue order), CUDA calls
  // straight to the fallback (stream semantics).
  WorkPtr forward(c10d::OpType type, const char* op, const std::vector<at::Tensor>& probe,
                  std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout, FallbackCall fb);
  c10::intrusive_ptr<c10d::Backend> fallbackBackend(c10::DeviceType device);
  // send / recv / recvAnysource (peer -1): posted by the worker, polled to completion there.
  WorkPtr pointToPoint(c10d::OpType type, const char* op, std::vector<at::Tensor>& tensors, int peer, int tag,
                       FallbackCall fb);
  void countFallback(const char* op, c10::DeviceType device, const std::string& reason);
  void countHicoll(const char* op);
  void enqueue(const c10::intrusive_ptr<HicollWork>& work);
  // Drops the Works the worker finished (on the calling thread, never on the worker: the last
  // reference to a Python-owned tensor must not be dropped there, see workerLoop).
  void releaseRetired();
  void workerLoop();
  void stopWorker(bool drain);
  // Throws DistBackendError naming the call; Declined for hcUnsupported, and for device calls
  // (stream set) also for hcInvalidUsage (for example a tensor on another GPU than the
  // communicator's).
  void check(hcResult_t res, const char* what, hcStream_t stream = nullptr);

  // Engine calls (contiguous tensors: CPU ones on the worker thread with stream NULL, CUDA
  // ones on the caller's thread with its current stream).
  void doAllGather(const at::Tensor& in, const at::Tensor& out, hcStream_t s);
  void doReduceScatter(const at::Tensor& in, const at::Tensor& out, const c10d::ReduceOp& op, hcStream_t s);
  void doAllReduce(const at::Tensor& t, const c10d::ReduceOp& op, hcStream_t s);
  void doBroadcast(const at::Tensor& t, int root, hcStream_t s);
  // Host tensors, contiguous; bytes to and from each rank, packed in rank order.
  void doAllToAll(const at::Tensor& in, const std::vector<size_t>& send_bytes, const at::Tensor& out,
                  const std::vector<size_t>& recv_bytes);
  void withRedOp(const c10d::ReduceOp& op, at::ScalarType dtype,
                 const std::function<void(hcRedOp_t, hcDataType_t)>& fn);

  c10::intrusive_ptr<c10d::Store> store_;  // this incarnation's: hicoll/<incarnation>/ on the group's
  uint64_t incarnation_ = 0;
  Config cfg_;
  std::unique_ptr<StoreBridge> bridge_;
  hcComm_t comm_ = nullptr;
  std::set<std::string> forced_;  // the communicator's HICOLL_FORCE_FALLBACK (hcCommGetConfig)
  int log_level_ = 1;             // the communicator's HICOLL_DEBUG: 0 none, 1 warn, 2 info, 3 trace

  std::atomic<uint64_t> seq_{0};
  uint64_t split_count_ = 0;  // splits made from this backend (a unique store prefix each)
  // torch < 2.12's splitGroup calls split once per device type (cpu, cuda) with the same
  // store and name; the second call must get the first's child, not a second communicator
  // rendezvousing on the same keys (which read the first one's stale values).
  std::map<std::string, c10::weak_intrusive_ptr<c10d::Backend>> split_children_;
  mutable std::mutex stats_mu_;
  std::map<std::string, int64_t> hicoll_calls_, fallback_calls_;
  std::map<std::string, std::string> fallback_reasons_;
  std::set<std::string> announced_;

  std::mutex fb_mu_;
  std::map<c10::DeviceType, c10::intrusive_ptr<c10d::Backend>> fallbacks_;

  // One thread at a time calls into the communicator: the worker (host calls) or a caller
  // issuing a device call.
  std::mutex call_mu_;

  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::condition_variable idle_cv_;  // the queue is empty and the worker idle
  std::deque<c10::intrusive_ptr<HicollWork>> queue_;
  std::vector<c10::intrusive_ptr<HicollWork>> retired_;  // run by the worker, not yet dropped
  bool busy_ = false;                                    // the worker is running a call
  bool stopping_ = false;
  std::string broken_;  // set after hcRemoteError / hcTimeout: the communicator is unusable
  c10d::ErrorType error_ = c10d::ErrorType::SUCCESS;
  std::thread worker_;
};

}  // namespace hicoll_torch
