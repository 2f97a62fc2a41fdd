// Logging controlled by HICOLL_DEBUG (WARN | INFO | TRACE). Lines carry a rank prefix set per
// thread by the communicator that is running ("hicoll [rank 3] INFO ...").
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <string>

namespace hicoll {

enum class LogLevel { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

// The level in force on this thread: its communicator's (ScopedLogRank) or HICOLL_DEBUG's.
LogLevel logLevel();
// The highest level any thread may be at: HICOLL_DEBUG's and every communicator's so far
// (never lowered). A line above it is skipped with one load, without the thread-local lookup.
extern std::atomic<int> g_log_ceiling;
inline bool logMayShow(LogLevel l) {
  return static_cast<int>(l) <= g_log_ceiling.load(std::memory_order_relaxed);
}
LogLevel logLevelOf(const std::string& name);  // "NONE", "WARN", "INFO", "TRACE" (any case)
void logLine(LogLevel level, const std::string& msg);
// The rank shown in this thread's log lines (-1 for none), and the level and name of the
// communicator the thread is working for (level -1: HICOLL_DEBUG's); restored by the destructor.
class ScopedLogRank {
 public:
  explicit ScopedLogRank(int rank, int level = -1, const char* name = nullptr);
  ~ScopedLogRank();

 private:
  int prev_, prev_level_;
  const char* prev_name_;
};

}  // namespace hicoll

#define HC_LOG(level, ...)                                              \
  do {                                                                  \
    if (::hicoll::logMayShow(level) && ::hicoll::logLevel() >= (level)) \
      ::hicoll::logLine((level), ::fmt::format(__VA_ARGS__));           \
  } while (0)
#define HC_WARN(...) HC_LOG(::hicoll::LogLevel::kWarn, __VA_ARGS__)
#define HC_INFO(...) HC_LOG(::hicoll::LogLevel::kInfo, __VA_ARGS__)
#define HC_TRACE(...) HC_LOG(::hicoll::LogLevel::kTrace, __VA_ARGS__)
