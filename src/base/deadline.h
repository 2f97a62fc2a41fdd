// Every wait in hicoll is bounded: a Deadline carries the time it must give up.
#pragma once

#include <chrono>

namespace hicoll {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(long timeout_ms) : end_(Clock::now() + std::chrono::milliseconds(timeout_ms)) {}
  bool expired() const { return Clock::now() >= end_; }
  long remainingMs() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()).count();
    return left > 0 ? static_cast<long>(left) : 0;
  }

 private:
  Clock::time_point end_;
};

// Spin briefly, then yield, then sleep: ranks may outnumber cores (8 ranks on 2 cores).
class Backoff {
 public:
  void pause();
  void reset() { n_ = 0; }

 private:
  unsigned n_ = 0;
};

}  // namespace hicoll
