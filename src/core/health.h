// Whether a communicator can go on: its first failure, which every later call reports, and how
// long any wait for a peer may take.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

namespace hicoll {

class Health {
 public:
  // HICOLL_TIMEOUT_MS: the bound of every wait for a peer.
  long timeout_ms = 0;

  bool failed() const { return failed_.load(); }
  // Marks it failed with why (the first cause wins; true when this one did). Another thread may
  // revoke the communicator while a call runs (hcCommRevoke), so both sides lock.
  bool fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.exchange(true)) return false;
    failure_ = why;
    return true;
  }
  std::string failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::string failure_;
};

}  // namespace hicoll
