// One communication thread per layer instance. Collectives run in submission order, which is
// the same on every rank, so ranks never disagree on the order of calls on a communicator,
// and the caller's compute overlaps them. Every wait is bounded.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace hicoll::sharded {

class CommQueue {
 public:
  struct Task {
    std::string what;  // for error messages: collective, unit, count, group
    std::function<void()> fn;
    bool done = false;
    std::string error;  // empty on success
  };
  using Ticket = std::shared_ptr<Task>;

  explicit CommQueue(long wait_timeout_ms);
  ~CommQueue();  // lets queued work finish (bounded by the engine's own timeouts), then joins

  Ticket submit(std::string what, std::function<void()> fn);
  // Blocks until the task ran; throws Error with its message if it failed, or on timeout.
  void wait(const Ticket& t);
  void waitAll();
  double waitSeconds() const { return wait_ns_.load() * 1e-9; }

 private:
  void run();

  long timeout_ms_;
  std::mutex mu_;
  std::condition_variable cv_;       // work queued / stop
  std::condition_variable done_cv_;  // a task finished
  std::deque<Ticket> queue_;
  Ticket last_;
  bool stop_ = false;
  std::string failure_;  // first failure: later tasks fail with it without running
  std::atomic<long long> wait_ns_{0};
  std::thread worker_;
};

}  // namespace hicoll::sharded
