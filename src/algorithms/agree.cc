#include "algorithms/agree.h"

#include <cstdio>
#include <cstring>

#include "algorithms/run.h"
#include "core/comm.h"
#include "core/error.h"

namespace hicoll {

Agreement::Agreement(hcComm& c, const CallDesc& mine, const std::string& reason) : c_(c), mine_(mine) {
  if (c.agree_peers.empty() || !c.ofi || c.ofi->tagBits() < 61) return;
  c.agree_out.desc = mine;
  std::snprintf(c.agree_out.reason, sizeof c.agree_out.reason, "%s", reason.c_str());
  const uint64_t tag = agreementTag(mine.w[3]);
  recvs_.assign(c.agree_peers.size(), 0);
  for (size_t i = 0; i < c.agree_peers.size(); ++i) {
    recvs_[i] = c.ofi->irecv(c.agree_peers[i], &c.agree_in[i], sizeof(hcComm::AgreeMsg), tag);
    sends_.push_back(c.ofi->isend(c.agree_peers[i], &c.agree_out, sizeof(hcComm::AgreeMsg), tag));
  }
  left_ = recvs_.size() + sends_.size();
}

void Agreement::check(size_t i) {
  const hcComm::AgreeMsg& m = c_.agree_in[i];
  const int peer = c_.agree_peers[i];
  if (m.desc.invalid()) {
    if (mine_.invalid()) return;
    const std::string why(m.reason, strnlen(m.reason, sizeof m.reason));
    HC_THROW(hcRemoteError, "{} rejected its arguments of {}{}{}", c_.who(peer), describeCall(m.desc),
             why.empty() ? "" : ": ", why);
  }
  any_valid_ = true;
  if (mine_.invalid() || m.desc.sameCall(mine_)) return;
  HC_THROW(hcInvalidUsage, "{} called {} where rank {} called {} ({} differs)", c_.who(peer), describeCall(m.desc),
           c_.rank, describeCall(mine_), callDifference(mine_, m.desc));
}

bool Agreement::poll(bool collect) {
  if (left_ == 0) return true;
  for (size_t i = 0; i < recvs_.size(); ++i) {
    if (recvs_[i] == 0 || !c_.ofi->test(recvs_[i])) continue;
    recvs_[i] = 0;
    --left_;
    if (collect) {
      try {
        check(i);
      } catch (const Error&) {
        any_valid_ = true;  // a valid peer that disagrees is still a valid peer
      }
    } else {
      check(i);
    }
  }
  for (ReqId& s : sends_)
    if (s != 0 && c_.ofi->test(s)) s = 0, --left_;
  return left_ == 0;
}

void Agreement::finish(Run& r, bool collect) {
  Backoff backoff;
  while (!poll(collect)) r.idle(false, backoff, "waiting for the agreement peers' call descriptors");
}

void Agreement::explain(long ms) {
  if (left_ == 0) return;
  Deadline d(ms);
  Backoff backoff;
  try {
    while (!poll() && !d.expired()) backoff.pause();
  } catch (const Error& e) {
    if (e.code() == hcInvalidUsage || e.code() == hcRemoteError) throw;
  }
}

}  // namespace hicoll
