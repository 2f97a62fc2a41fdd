// Internal error handling: throw inside, convert to hcResult_t at the C ABI (see api.cc).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "hicoll/hicoll.h"

namespace hicoll {

class Error : public std::runtime_error {
 public:
  // kFatal: the communicator cannot go on after it (a collective failed midway): the API
  // marks it failed and tells the peers, whatever the code.
  // kSymptom: a peer's link broke; the peer may have failed for a reason its failure notice
  // (arriving a moment later) tells better.
  enum Flags : unsigned { kFatal = 1, kSymptom = 2 };
  Error(hcResult_t code, const std::string& msg, unsigned flags = 0)
      : std::runtime_error(msg), code_(code), flags_(flags) {}
  hcResult_t code() const { return code_; }
  bool fatal() const { return flags_ & kFatal; }
  bool symptom() const { return flags_ & kSymptom; }

 private:
  hcResult_t code_;
  unsigned flags_;
};

[[noreturn]] void throwSystemError(const char* what, int err, const char* file, int line);

}  // namespace hicoll

#define HC_THROW(code, ...) throw ::hicoll::Error((code), ::fmt::format(__VA_ARGS__))
#define HC_CHECK(cond, code, ...)               \
  do {                                          \
    if (!(cond)) HC_THROW((code), __VA_ARGS__); \
  } while (0)
// For POSIX calls that return -1 and set errno.
#define HC_SYSCHECK(call, what)                                                    \
  do {                                                                             \
    if ((call) < 0) ::hicoll::throwSystemError((what), errno, __FILE__, __LINE__); \
  } while (0)
