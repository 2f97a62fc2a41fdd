#include "base/error.h"

#include <atomic>
#include <cstring>

#include "base/deadline.h"

#include <sched.h>
#include <time.h>

namespace hicoll {

void throwSystemError(const char* what, int err, const char* file, int line) {
  throw Error(hcSystemError, fmt::format("{} failed: {} ({}:{})", what, std::strerror(err), file, line));
}

namespace {
std::atomic<bool> g_yield_first{false};
}  // namespace

void Backoff::yieldFirst() {
  g_yield_first.store(true, std::memory_order_relaxed);
}

void Backoff::pause() {
  ++n_;
  if (n_ < 64 && !g_yield_first.load(std::memory_order_relaxed)) {
    __builtin_ia32_pause();
  } else if (n_ < 256) {
    sched_yield();
  } else {
    // Oversubscribed (more ranks than cores): give the core to the rank we wait for.
    struct timespec ts = {0, n_ < 4096 ? 2000 : 50000};
    nanosleep(&ts, nullptr);
  }
}

}  // namespace hicoll
