// Logging controlled by HICOLL_DEBUG (WARN | INFO | TRACE). Lines carry a rank prefix set per
// thread by the communicator that is running ("hicoll [rank 3] INFO ...").
#pragma once

#include <fmt/format.h>

#include <string>

namespace hicoll {

enum class LogLevel { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

// The level in force on this thread: its communicator's (ScopedLogRank) or HICOLL_DEBUG's.
LogLevel logLevel();
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

#define HC_LOG(level, ...)                                                                       \
  do {                                                                                           \
    if (::hicoll::logLevel() >= (level)) ::hicoll::logLine((level), ::fmt::format(__VA_ARGS__)); \
  } while (0)
#define HC_WARN(...) HC_LOG(::hicoll::LogLevel::kWarn, __VA_ARGS__)
#define HC_INFO(...) HC_LOG(::hicoll::LogLevel::kInfo, __VA_ARGS__)
#define HC_TRACE(...) HC_LOG(::hicoll::LogLevel::kTrace, __VA_ARGS__)
