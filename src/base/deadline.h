// Every wait in hicoll is bounded: a Deadline carries the time it must give up.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>

namespace hicoll {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(long timeout_ms) : end_(Clock::now() + std::chrono::milliseconds(timeout_ms)) {}
  // No bound: for the one wait whose end is the user's (the device stream reaching a call).
  static Deadline never() {
    Deadline d(0);
    d.end_ = Clock::time_point::max();
    return d;
  }
  // Starts counting at its first check, not at construction: a call's deadline, which most
  // small calls never check (their waits end within the spin passes), so they read no clock.
  // For one thread's waits only.
  static Deadline fromFirstCheck(long timeout_ms) {
    Deadline d(Clock::time_point{});
    d.pending_ms_ = timeout_ms;
    return d;
  }
  bool expired() const { return Clock::now() >= end(); }
  long remainingMs() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end() - Clock::now()).count();
    return left > 0 ? static_cast<long>(left) : 0;
  }

 private:
  explicit Deadline(Clock::time_point end) : end_(end) {}
  Clock::time_point end() const {
    if (pending_ms_ >= 0) {
      end_ = Clock::now() + std::chrono::milliseconds(pending_ms_);
      pending_ms_ = -1;
    }
    return end_;
  }
  mutable Clock::time_point end_;
  mutable long pending_ms_ = -1;
};

// The monotonic clock at the kernel tick's resolution (a few ms), read without the TSC: for
// rate limits on hot paths (a check every 20 ms), where the precise clock costs more than the
// work of a small message. Same epoch as Deadline::Clock.
inline Deadline::Clock::time_point coarseNow() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Deadline::Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

// The number of the collective call this rank is in (the communicator's call counter). A
// failure a peer reports carries the number of the call it failed in, and a wait in an earlier
// call goes on: that peer completed the call, so it owes it nothing, and giving up would let an
// unrelated later error fail a call that succeeds elsewhere. Empty: every report is due now.
using CallClock = std::function<uint64_t()>;
inline bool reportIsDue(const CallClock& now, uint64_t failed_call) {
  return !now || failed_call <= now();
}

// Spin briefly, then yield, then sleep: ranks may outnumber cores (8 ranks on 2 cores).
// Used by waitUntil only: every wait goes through it.
class Backoff {
 public:
  void pause();
  void reset() { n_ = 0; }
  // This process's ranks share their host with more ranks than it has cores: a wait yields
  // from the first pause (spinning holds the core the awaited rank needs; Open MPI's
  // yield_when_idle). Set by a communicator that finds it so; never cleared.
  static void yieldFirst();

 private:
  unsigned n_ = 0;
};

// What one pass of a wait found: it is over, something moved (spin again at once), or nothing.
enum class Progress { Done, Moved, Idle };
// Idle passes in a row that only spin before the checks and the clock run on every idle pass.
constexpr unsigned kSpinPasses = 32;

// The one bounded wait of hicoll: runs pass() until it returns Done (or true). After a pass
// that moved nothing, idle() runs the caller's checks (peers, aborts, failure notices: it throws
// to end the wait with their error); then, once the deadline has passed, timeout(), which
// throws naming who is late, or returns to give up (waitUntil then returns false); then the
// backoff (spin, yield, sleep). A pass may re-arm the deadline (progress-based bounds).
template <class Pass, class Idle, class Timeout>
bool waitUntil(Pass&& pass, const Deadline& deadline, Idle&& idle, Timeout&& timeout) {
  Backoff backoff;
  unsigned spins = 0;
  for (;;) {
    Progress p;
    if constexpr (std::is_same_v<decltype(pass()), bool>) p = pass() ? Progress::Done : Progress::Idle;
    else p = pass();
    if (p == Progress::Done) return true;
    if (p == Progress::Moved) {
      backoff.reset();
      spins = 0;
      continue;
    }
    // The first idle passes only spin: what a small call waits for (a local peer's post)
    // usually comes within them, and the checks and the clock would delay noticing it.
    if (spins < kSpinPasses) {
      ++spins;
      backoff.pause();
      continue;
    }
    idle();
    if (deadline.expired()) {
      timeout();
      return false;
    }
    backoff.pause();
  }
}

// A wait with nothing to check but its deadline: false when it passed first.
template <class Pass>
bool waitUntil(Pass&& pass, const Deadline& deadline) {
  return waitUntil(
      std::forward<Pass>(pass), deadline, [] {}, [] {});
}

}  // namespace hicoll
