// Test support: a DevStream whose operations run in order on a host thread, so the device
// engine's whole protocol (chunks, counters, proxy, network) runs without a GPU. Waits on
// counters are bounded: a wait that never completes marks the stream stuck and moves on, so
// a protocol bug fails the test instead of hanging it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "device/dev_stream.h"

namespace hctest {

class HostStream : public hicoll::dev::DevStream {
 public:
  explicit HostStream(long wait_timeout_ms = 30000);
  ~HostStream() override;

  // Test-side work in stream order (what a user's kernels would do).
  void enqueueFn(std::function<void()> fn);
  void synchronize();
  bool stuck() const { return stuck_.load(); }
  std::string stuckWhat() const;
  // Operations run so far, by kind (the tests check that copies, not kernels, move data).
  size_t copies() const { return copies_.load(); }
  size_t reductions() const { return reductions_.load(); }
  size_t quantizations() const { return quantizations_.load(); }

  void joinFrom(void* user) override;
  void joinTo(void* user) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) override;
  void writeFlag(const hicoll::dev::FlagRef& f, uint32_t value) override;
  void waitFlag(const hicoll::dev::FlagRef& f, uint32_t value) override;
  void reduce(const hicoll::dev::ReduceJob& job) override;
  void quantize(const hicoll::dev::QuantJob& job) override;
  void dequantize(const hicoll::dev::QuantJob& job) override;
  void sumQuantized(const hicoll::dev::QuantSumJob& job) override;
  void* allocTemp(size_t bytes) override;
  void freeTemp(void* p) override;
  bool idle() override;

 private:
  void run();
  bool spinUntil(const std::function<bool()>& pred, const std::function<std::string()>& what);

  long wait_timeout_ms_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> q_;
  bool busy_ = false, stop_ = false;
  std::atomic<bool> stuck_{false};
  mutable std::mutex stuck_mu_;
  std::string stuck_what_;
  std::atomic<size_t> copies_{0}, reductions_{0}, quantizations_{0};
  std::thread worker_;
};

}  // namespace hctest
