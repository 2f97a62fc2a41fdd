#include "base/log.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace hicoll {
namespace {

thread_local int t_rank = -1;

LogLevel parseLevel() {
  // Read directly (not via Config) so logging works before any communicator exists; the
  // strict parse of HICOLL_DEBUG happens at communicator creation.
  const char* v = std::getenv("HICOLL_DEBUG");
  if (!v) return LogLevel::kWarn;
  if (!strcasecmp(v, "NONE")) return LogLevel::kNone;
  if (!strcasecmp(v, "INFO")) return LogLevel::kInfo;
  if (!strcasecmp(v, "TRACE")) return LogLevel::kTrace;
  return LogLevel::kWarn;
}

const char* levelName(LogLevel l) {
  switch (l) {
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kTrace: return "TRACE";
    default: return "";
  }
}

}  // namespace

LogLevel logLevel() {
  static const LogLevel level = parseLevel();
  return level;
}

void logLine(LogLevel level, const std::string& msg) {
  static std::mutex mu;
  std::string line = t_rank >= 0
                         ? fmt::format("hicoll [rank {} pid {}] {} {}\n", t_rank, getpid(), levelName(level), msg)
                         : fmt::format("hicoll [pid {}] {} {}\n", getpid(), levelName(level), msg);
  std::lock_guard<std::mutex> lock(mu);
  fputs(line.c_str(), stderr);
}

ScopedLogRank::ScopedLogRank(int rank) : prev_(t_rank) { t_rank = rank; }
ScopedLogRank::~ScopedLogRank() { t_rank = prev_; }

}  // namespace hicoll
