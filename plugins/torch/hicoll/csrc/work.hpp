// The Work objects of the hicoll backend: HicollWork for calls queued on the group's worker
// thread (host tensors), HicollCudaWork for calls enqueued on a CUDA stream.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <functional>
#include <vector>

#ifdef HICOLL_PLUGIN_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace hicoll_torch {

// One queued call. The worker thread runs `run` (hicoll) or, when hicoll declined before the
// call was queued, `fallback` (the same call on gloo, waited for). Either may return the
// fallback's Work: it is kept until this Work dies, so its tensors are released with ours.
class HicollWork : public c10d::Work {
 public:
  using Step = std::function<c10::intrusive_ptr<c10d::Work>()>;
  HicollWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
             uint64_t seq, Step run, Step fallback);
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return seq_; }

  // A point-to-point Work: run posts the operation; the worker then polls it (with the other
  // operations in flight, between queued calls) until it is done, so a pair that both send
  // first does not wait on one queue. poll returns true when done and sets *source to the rank
  // the message came from (receives); it throws the operation's error.
  using Poll = std::function<bool(int* source)>;
  void setPoll(Poll poll) { poll_ = std::move(poll); }
  int sourceRank() const override { return source_; }

  // Worker thread only.
  void execute();  // runs the call; a point-to-point one is then pending() until polled done
  bool pending() { return static_cast<bool>(poll_) && !isCompleted(); }
  bool pollOnce();  // true once the Work is complete (done or failed)
  // Done, with an error or not: the Work first, then its future, so whoever the future
  // wakes sees isCompleted().
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_;
  Step run_;
  Step fallback_;
  Poll poll_;
  int source_ = -1;
  c10::intrusive_ptr<c10d::Work> inner_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

#ifdef HICOLL_PLUGIN_CUDA
// A call enqueued by hicoll on the caller's current CUDA stream (NCCL-style): it is complete
// when an event recorded after it on that stream is. wait() and synchronize() make the
// caller's current stream wait for it (wait(timeout) also blocks the host, bounded);
// getFuture() is a CUDA-aware future completed on that stream, as ProcessGroupNCCL's.
class HicollCudaWork : public c10d::Work {
 public:
  HicollCudaWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, c10::Device device, uint64_t seq);
  // Records the completion event and completes the future on `stream` (the current stream).
  void recordOn(const c10::cuda::CUDAStream& stream);
  bool isCompleted() override;
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  void blockCurrentStream() override { synchronize(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::Device device_;
  uint64_t seq_;
  at::cuda::CUDAEvent event_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};
#endif

}  // namespace hicoll_torch
