#include "transport/transport.h"

#include "base/error.h"

namespace hicoll {

void waitAll(Transport& t, std::vector<ReqId>& reqs, const Deadline& deadline, const std::string& what) {
  waitUntil(
      [&] {
        const bool any = completeEach(reqs, [&](ReqId id) { return t.test(id); }) > 0;
        return reqs.empty() ? Progress::Done : any ? Progress::Moved : Progress::Idle;
      },
      deadline, [] {},
      [&] { HC_THROW(hcTimeout, "{}: timed out waiting for {} {} request(s)", what, reqs.size(), t.name()); });
}

}  // namespace hicoll
