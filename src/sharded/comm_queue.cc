#include "sharded/comm_queue.h"

#include <chrono>
#include <exception>

#include "hicoll/sharded.hpp"

namespace hicoll::sharded {

CommQueue::CommQueue(long wait_timeout_ms) : timeout_ms_(wait_timeout_ms) {
  worker_ = std::thread([this] { run(); });
}

CommQueue::~CommQueue() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

CommQueue::Ticket CommQueue::submit(std::string what, std::function<void()> fn) {
  auto t = std::make_shared<Task>();
  t->what = std::move(what);
  t->fn = std::move(fn);
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(t);
    last_ = t;
  }
  cv_.notify_one();
  return t;
}

void CommQueue::wait(const Ticket& t) {
  if (!t) return;
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  const bool ok = done_cv_.wait_until(lk, start + std::chrono::milliseconds(timeout_ms_), [&] { return t->done; });
  wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  if (!ok)
    throw Error("timed out after " + std::to_string(timeout_ms_) + " ms waiting for " + t->what + " (" +
                std::to_string(queue_.size()) + " more collectives queued behind it)");
  if (!t->error.empty()) throw Error(t->what + " failed: " + t->error);
}

void CommQueue::waitAll() {
  Ticket last;
  {
    std::lock_guard<std::mutex> lk(mu_);
    last = last_;
  }
  wait(last);  // tasks run in order: the last one done means all are
}

void CommQueue::run() {
  for (;;) {
    Ticket t;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      t = queue_.front();
      queue_.pop_front();
    }
    std::string err;
    if (!failure_.empty()) {
      err = "not run after an earlier failure: " + failure_;
    } else {
      try {
        t->fn();
      } catch (const std::exception& e) {
        err = e.what();
        const std::string prefix = "hicoll_sharded: ";
        if (err.rfind(prefix, 0) == 0) err.erase(0, prefix.size());
      } catch (...) {
        err = "unknown exception";
      }
      if (!err.empty()) failure_ = t->what + ": " + err;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      t->error = std::move(err);
      t->done = true;
      t->fn = nullptr;  // release captured buffers now
    }
    done_cv_.notify_all();
  }
}

}  // namespace hicoll::sharded
