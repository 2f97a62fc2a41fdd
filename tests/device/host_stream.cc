#include "host_stream.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "algorithms/quantize.h"
#include "base/error.h"

namespace hctest {

using hicoll::dev::FlagRef;

HostStream::HostStream(long wait_timeout_ms) : wait_timeout_ms_(wait_timeout_ms) {
  worker_ = std::thread([this] { run(); });
}

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void HostStream::run() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stopping, and everything ran
      fn = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
    }
    fn();
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

void HostStream::enqueueFn(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(fn));
  }
  cv_.notify_all();
}

void HostStream::synchronize() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return q_.empty() && !busy_; });
}

bool HostStream::idle() {
  std::lock_guard<std::mutex> lk(mu_);
  return q_.empty() && !busy_;
}

std::string HostStream::stuckWhat() const {
  std::lock_guard<std::mutex> lk(stuck_mu_);
  return stuck_what_;
}

bool HostStream::spinUntil(const std::function<bool()>& pred, const std::function<std::string()>& what) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_timeout_ms_);
  unsigned n = 0;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) {
      std::lock_guard<std::mutex> lk(stuck_mu_);
      if (!stuck_) stuck_what_ = what();
      stuck_ = true;
      return false;
    }
    if (++n < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

void HostStream::joinFrom(void* user) {
  auto* u = static_cast<HostStream*>(user);
  if (!u || u == this) return;
  auto reached = std::make_shared<std::atomic<bool>>(false);
  u->enqueueFn([reached] { reached->store(true); });
  enqueueFn([this, reached] {
    spinUntil([&] { return reached->load(); }, [] { return std::string("joinFrom(user stream)"); });
  });
}

void HostStream::joinTo(void* user) {
  auto* u = static_cast<HostStream*>(user);
  if (!u || u == this) return;
  auto reached = std::make_shared<std::atomic<bool>>(false);
  enqueueFn([reached] { reached->store(true); });
  u->enqueueFn([u, reached] {
    u->spinUntil([&] { return reached->load(); }, [] { return std::string("joinTo(user stream)"); });
  });
}

void HostStream::copy(void* dst, const void* src, size_t bytes) {
  enqueueFn([this, dst, src, bytes] {
    std::memmove(dst, src, bytes);
    ++copies_;
  });
}

void HostStream::copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
  enqueueFn([=, this] {
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    ++copies_;
  });
}

void HostStream::writeFlag(const FlagRef& f, uint32_t value) {
  enqueueFn([f, value] { hicoll::dev::storeFlag(f, value); });
}

void HostStream::waitFlag(const FlagRef& f, uint32_t value) {
  enqueueFn([this, f, value] {
    spinUntil([&] { return hicoll::dev::reached(hicoll::dev::loadFlag(f), value); },
              [&] {
                return fmt::format("waitFlag({}, {}) saw {}", fmt::ptr(const_cast<const uint32_t*>(f.host)), value,
                                   hicoll::dev::loadFlag(f));
              });
  });
}

void HostStream::reduce(const hicoll::dev::ReduceJob& job) {
  enqueueFn([this, job] {
    hicoll::dev::hostReduce(job);
    ++reductions_;
  });
}

namespace {

// The CUDA kernels read and write an image's fp32 scales as floats: a misaligned image would
// fault on a GPU, so it is an error here too.
void checkImage(const void* image, const char* what) {
  HC_CHECK(reinterpret_cast<uintptr_t>(image) % alignof(float) == 0, hcInternalError,
           "host stream: {} image at {} is not {}-byte aligned", what, image, alignof(float));
}

}  // namespace

// The host quantizer: the CUDA kernels produce the same bits (tests/gpu checks it on a GPU).
void HostStream::quantize(const hicoll::dev::QuantJob& j) {
  checkImage(j.out, "quantize's");
  enqueueFn([this, j] {
    hicoll::quant::quantize(j.in, j.count, j.dtype, j.block, j.out);
    ++quantizations_;
  });
}

void HostStream::dequantize(const hicoll::dev::QuantJob& j) {
  checkImage(j.in, "dequantize's");
  enqueueFn([this, j] {
    hicoll::quant::dequantize(j.in, j.count, j.dtype, j.block, j.out);
    ++quantizations_;
  });
}

void HostStream::sumQuantized(const hicoll::dev::QuantSumJob& j) {
  for (int k = 0; k < j.nimages; ++k) checkImage(j.images[k], "sumQuantized's");
  enqueueFn([this, j] {
    hicoll::quant::sumImages(j.own, j.images, static_cast<size_t>(j.nimages), j.count, j.dtype, j.block, j.divisor,
                             j.out);
    ++quantizations_;
  });
}

void* HostStream::allocTemp(size_t bytes) {
  return std::malloc(bytes ? bytes : 1);
}

void HostStream::freeTemp(void* p) {
  enqueueFn([p] { std::free(p); });
}

}  // namespace hctest
