#include "base/log.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace hicoll {
namespace {

// One thread-local object: in a shared library each thread-local costs a __tls_get_addr per
// function that touches it, and every call sets and restores all three.
struct LogContext {
  int rank = -1;
  int level = -1;
  const char* name = nullptr;
};
thread_local LogContext t_log;

LogLevel parseLevel() {
  // Read directly (not via Config) so logging works before any communicator exists; the
  // strict parse of HICOLL_DEBUG happens at communicator creation.
  const char* v = std::getenv("HICOLL_DEBUG");
  return v ? logLevelOf(v) : LogLevel::kWarn;
}

LogLevel envLevel() {
  static const LogLevel level = parseLevel();  // (a function's static: logging works during load)
  return level;
}

const char* levelName(LogLevel l) {
  switch (l) {
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kTrace: return "TRACE";
    default: return "";
  }
}

// Every communicator's level so far (ScopedLogRank), for the ceiling's initial value.
std::atomic<int> g_comm_ceiling{0};

[[gnu::noinline]] void raiseTo(std::atomic<int>& v, int level) {
  int cur = v.load(std::memory_order_relaxed);
  while (level > cur && !v.compare_exchange_weak(cur, level, std::memory_order_relaxed)) {
  }
}

}  // namespace

// TRACE until this file's initialisation reads HICOLL_DEBUG: a line logged before it (another
// file's static initialisation) takes the full check.
std::atomic<int> g_log_ceiling{static_cast<int>(LogLevel::kTrace)};
namespace {
const bool g_ceiling_set = [] {
  g_log_ceiling.store(std::max(static_cast<int>(envLevel()), g_comm_ceiling.load()), std::memory_order_relaxed);
  return true;
}();
}  // namespace

LogLevel logLevelOf(const std::string& v) {
  if (!strcasecmp(v.c_str(), "NONE")) return LogLevel::kNone;
  if (!strcasecmp(v.c_str(), "INFO")) return LogLevel::kInfo;
  if (!strcasecmp(v.c_str(), "TRACE")) return LogLevel::kTrace;
  return LogLevel::kWarn;
}

LogLevel logLevel() {
  const int t = t_log.level;
  return t >= 0 ? static_cast<LogLevel>(t) : envLevel();
}

void logLine(LogLevel level, const std::string& msg) {
  static std::mutex mu;
  const LogContext& c = t_log;
  const std::string name = c.name && *c.name ? fmt::format(" '{}'", c.name) : "";
  std::string line =
      c.rank >= 0 ? fmt::format("hicoll [rank {}{} pid {}] {} {}\n", c.rank, name, getpid(), levelName(level), msg)
                  : fmt::format("hicoll [pid {}] {} {}\n", getpid(), levelName(level), msg);
  std::lock_guard<std::mutex> lock(mu);
  fputs(line.c_str(), stderr);
}

ScopedLogRank::ScopedLogRank(int rank, int level, const char* name) {
  LogContext& c = t_log;  // read and written whole: one thread-local lookup
  const LogContext prev = c;
  prev_ = prev.rank;
  prev_level_ = prev.level;
  prev_name_ = prev.name;
  c = LogContext{rank, level >= 0 ? level : prev.level, name ? name : prev.name};
  if (level > g_comm_ceiling.load(std::memory_order_relaxed)) {  // a level above every one so far
    raiseTo(g_comm_ceiling, level);
    raiseTo(g_log_ceiling, level);
  }
}
ScopedLogRank::~ScopedLogRank() {
  LogContext& c = t_log;
  c.rank = prev_;
  c.level = prev_level_;
  c.name = prev_name_;
}

}  // namespace hicoll
