#include "transport/transport.h"

#include "base/error.h"

namespace hicoll {

void waitAll(Transport& t, std::vector<ReqId>& reqs, const Deadline& deadline, const std::string& what) {
  Backoff backoff;
  while (!reqs.empty()) {
    const bool any = completeEach(reqs, [&](ReqId id) { return t.test(id); }) > 0;
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
