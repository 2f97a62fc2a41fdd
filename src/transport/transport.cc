#include "transport/transport.h"

#include <algorithm>

#include "base/error.h"

namespace hicoll {

void waitAll(Transport& t, std::vector<ReqId>& reqs, const Deadline& deadline, const std::string& what) {
  Backoff backoff;
  while (!reqs.empty()) {
    bool any = false;
    for (size_t i = 0; i < reqs.size();) {
      if (t.test(reqs[i])) {
        reqs[i] = reqs.back();
        reqs.pop_back();
        any = true;
      } else {
        ++i;
      }
    }
    if (reqs.empty()) break;
    if (any) {
      backoff.reset();
    } else {
      if (deadline.expired())
        HC_THROW(hcTimeout, "{}: timed out waiting for {} {} request(s)", what, reqs.size(), t.name());
      backoff.pause();
    }
  }
}

}  // namespace hicoll
