#include "work.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <thread>

#ifdef HICOLL_PLUGIN_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace hicoll_torch {

HicollWork::HicollWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                       uint64_t seq, Step run, Step fallback)
    : Work(rank, type, nullptr), outputs_(std::move(outputs)), timeout_(timeout), seq_(seq), run_(std::move(run)),
      fallback_(std::move(fallback)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

bool HicollWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  // At the group's timeout the call's own waits (bounded by the same timeout) end too, with an
  // error naming the ranks they wait for: give it a moment to arrive (the call may have
  // started after this wait, behind others in the queue). A shorter wait the caller asked for
  // ends on time.
  const auto grace = limit < timeout_ ? std::chrono::milliseconds(0)
                                      : std::clamp<std::chrono::milliseconds>(limit / 10, std::chrono::seconds(1),
                                                                              std::chrono::seconds(10));
  if (!cv_.wait_for(lock, limit, [&] { return completed_; }) &&
      !cv_.wait_for(lock, grace, [&] { return completed_; })) {
    C10_THROW_ERROR(DistBackendError, c10::str("hicoll: rank ", rank_, " timed out after ", limit.count(),
                                               " ms waiting for ", c10d::opTypeToString(opType_), " (seq ", seq_, ")"));
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

void HicollWork::execute() {
  std::exception_ptr err;
  try {
    inner_ = run_ ? run_() : fallback_();
  } catch (...) {
    err = std::current_exception();
  }
  if (err || !poll_ || inner_) complete(err);  // (a p2p call that went to the fallback is done too)
}

bool HicollWork::pollOnce() {
  try {
    if (!poll_(&source_)) return false;
  } catch (...) {
    complete(std::current_exception());
    return true;
  }
  complete(nullptr);
  return true;
}

void HicollWork::complete(std::exception_ptr err) {
  finish(err);
  if (err) {
    future_->setError(err);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

#ifdef HICOLL_PLUGIN_CUDA
HicollCudaWork::HicollCudaWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, c10::Device device,
                               uint64_t seq)
    : Work(rank, type, nullptr), outputs_(std::move(outputs)), device_(device), seq_(seq),
      event_(cudaEventDisableTiming),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{device})) {}

void HicollCudaWork::recordOn(const c10::cuda::CUDAStream& stream) {
  c10::cuda::CUDAStreamGuard guard(stream);
  event_.record(stream);
  // A CUDA-aware future: it records its own event on the current stream (this one) and makes
  // the streams of whoever waits on it, or runs its callbacks, wait for that event.
  future_->markCompleted(c10::IValue(outputs_));
}

bool HicollCudaWork::isCompleted() {
  return event_.query();
}

void HicollCudaWork::synchronize() {
  c10::cuda::CUDAGuard guard(device_);
  event_.block(c10::cuda::getCurrentCUDAStream(device_.index()));
}

bool HicollCudaWork::wait(std::chrono::milliseconds timeout) {
  synchronize();  // the caller's current stream waits for the call
  if (timeout != kNoTimeout) {
    // An explicit timeout also bounds a host wait, as ProcessGroupNCCL's blocking wait.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!event_.query()) {
      if (std::chrono::steady_clock::now() > deadline) {
        C10_THROW_ERROR(DistBackendError,
                        c10::str("hicoll: rank ", rank_, " timed out after ", timeout.count(), " ms waiting for ",
                                 c10d::opTypeToString(opType_), " (seq ", seq_, ") on ", device_));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  return true;
}
#endif

}  // namespace hicoll_torch
