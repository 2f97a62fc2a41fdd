// Every wait in hicoll is bounded: a Deadline carries the time it must give up.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

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

// The number of the collective call this rank is in (the communicator's call counter). A
// failure a peer reports carries the number of the call it failed in, and a wait in an earlier
// call goes on: that peer completed the call, so it owes it nothing, and giving up would let an
// unrelated later error fail a call that succeeds elsewhere. Empty: every report is due now.
using CallClock = std::function<uint64_t()>;
inline bool reportIsDue(const CallClock& now, uint64_t failed_call) { return !now || failed_call <= now(); }

// Spin briefly, then yield, then sleep: ranks may outnumber cores (8 ranks on 2 cores).
class Backoff {
 public:
  void pause();
  void reset() { n_ = 0; }

 private:
  unsigned n_ = 0;
};

}  // namespace hicoll
