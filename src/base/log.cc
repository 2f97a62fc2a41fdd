#include "base/log.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace hicoll {
namespace {

thread_local int t_rank = -1;
thread_local int t_level = -1;
thread_local const char* t_name = nullptr;

LogLevel parseLevel() {
  // Read directly (not via Config) so logging works before any communicator exists; the
  // strict parse of HICOLL_DEBUG happens at communicator creation.
  const char* v = std::getenv("HICOLL_DEBUG");
  return v ? logLevelOf(v) : LogLevel::kWarn;
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

LogLevel logLevelOf(const std::string& v) {
  if (!strcasecmp(v.c_str(), "NONE")) return LogLevel::kNone;
  if (!strcasecmp(v.c_str(), "INFO")) return LogLevel::kInfo;
  if (!strcasecmp(v.c_str(), "TRACE")) return LogLevel::kTrace;
  return LogLevel::kWarn;
}

LogLevel logLevel() {
  static const LogLevel level = parseLevel();
  return t_level >= 0 ? static_cast<LogLevel>(t_level) : level;
}

void logLine(LogLevel level, const std::string& msg) {
  static std::mutex mu;
  const std::string name = t_name && *t_name ? fmt::format(" '{}'", t_name) : "";
  std::string line =
      t_rank >= 0 ? fmt::format("hicoll [rank {}{} pid {}] {} {}\n", t_rank, name, getpid(), levelName(level), msg)
                  : fmt::format("hicoll [pid {}] {} {}\n", getpid(), levelName(level), msg);
  std::lock_guard<std::mutex> lock(mu);
  fputs(line.c_str(), stderr);
}

ScopedLogRank::ScopedLogRank(int rank, int level, const char* name)
    : prev_(t_rank), prev_level_(t_level), prev_name_(t_name) {
  t_rank = rank;
  if (level >= 0) t_level = level;
  if (name) t_name = name;
}
ScopedLogRank::~ScopedLogRank() {
  t_rank = prev_;
  t_level = prev_level_;
  t_name = prev_name_;
}

}  // namespace hicoll
