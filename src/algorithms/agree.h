// Every call is agreed before it returns success: each rank checks the call descriptor
// (collective, datatype, op and its scalar, count, root, call number) of every peer it depends
// on. Within a node the descriptor rides on each phase's board post (Run::waitPosted); across
// nodes each rank sends it to its agreement peers (hcComm::agree_peers) in one small message
// when the call starts, and the message is checked while the call runs and before it returns.
// A rank that rejects its own arguments still takes part, with an invalid descriptor and its
// reason, so that its peers fail the same call instead of pairing with its next one.
#pragma once

#include <string>
#include <vector>

#include "core/coll.h"
#include "transport/transport.h"

struct hcComm;

namespace hicoll {

struct Run;

class Agreement {
 public:
  // Posts the exchange with the remote agreement peers (nothing waits here).
  Agreement(hcComm& c, const CallDesc& mine, const std::string& reason = "");
  Agreement(const Agreement&) = delete;
  Agreement& operator=(const Agreement&) = delete;

  // Tests what has not completed, once. A descriptor that differs throws hcInvalidUsage (an
  // invalid one hcRemoteError, naming the peer and its reason) unless collecting (see
  // anyValid). True once every message has arrived and every send completed.
  bool poll(bool collect = false);
  // Waits for the rest, with the checks of r's idle loop (peers, notices, deadline).
  void finish(Run& r, bool collect = false);
  // After another error: waits up to ms for descriptors still missing and throws the
  // disagreement if there is one (it explains a size mismatch or a timeout better).
  void explain(long ms);
  // Collecting: whether some peer's descriptor was valid.
  bool anyValid() const { return any_valid_; }

 private:
  void check(size_t i);
  hcComm& c_;
  CallDesc mine_;
  std::vector<ReqId> recvs_;  // by agreement peer, 0 once arrived
  std::vector<ReqId> sends_;
  size_t left_ = 0;
  bool any_valid_ = false;
};

// Tag of a call's descriptor messages: bit 60 set, below the transports' own reserved tags
// (all ones, all ones - 1) and above the collectives' tags (60 bits).
inline uint64_t agreementTag(uint64_t call) { return (1ull << 60) | (call & ((1ull << 60) - 1)); }

}  // namespace hicoll
