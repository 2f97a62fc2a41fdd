// Internal error handling: throw inside, convert to hcResult_t at the C ABI (see api.cc).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "hicoll/hicoll.h"

namespace hicoll {

class Error : public std::runtime_error {
 public:
  Error(hcResult_t code, const std::string& msg, bool fatal = false)
      : std::runtime_error(msg), code_(code), fatal_(fatal) {}
  hcResult_t code() const { return code_; }
  // The communicator cannot go on after it (a collective failed midway): the API marks it
  // failed and tells the peers, whatever the code.
  bool fatal() const { return fatal_; }

 private:
  hcResult_t code_;
  bool fatal_;
};

[[noreturn]] void throwSystemError(const char* what, int err, const char* file, int line);

}  // namespace hicoll

#define HC_THROW(code, ...) throw ::hicoll::Error((code), ::fmt::format(__VA_ARGS__))
#define HC_CHECK(cond, code, ...) \
  do {                            \
    if (!(cond)) HC_THROW((code), __VA_ARGS__); \
  } while (0)
// For POSIX calls that return -1 and set errno.
#define HC_SYSCHECK(call, what)                                                   \
  do {                                                                            \
    if ((call) < 0) ::hicoll::throwSystemError((what), errno, __FILE__, __LINE__); \
  } while (0)
