// Every call is agreed before it returns success: each rank checks the call descriptor
// (collective, datatype, op and its scalar, count, root, call number) of every peer it depends
// on. Within a node the descriptor rides on each phase's board post (Run::waitPosted). Across
// nodes each rank exchanges it with its agreement peers (Topology::agreementPeers), either
//   standalone: one small message each way when the call starts, or
//   piggybacked: on the call's first message each way, when the path sends one to every
//     agreement peer and it is small (hierarchical AllGather, ReduceScatter, AllReduce and
//     Barrier of small blocks) -- no extra message where latency matters most.
// Both forms go under the call's agreement tag and begin with the descriptor, so ranks that
// disagree (and so may have chosen different forms) still meet and see the difference. A rank
// that rejects its own arguments takes part with an invalid descriptor and its reason, so its
// peers fail the same call instead of pairing with its next one.
#pragma once

#include <string>
#include <vector>

#include "base/coll.h"
#include "base/identity.h"
#include "transport/tags.h"
#include "transport/transport.h"

namespace hicoll {

struct Run;

// A communicator's agreement messages, one in and one out per agreement peer: a descriptor and
// a reason, or a descriptor and the payload of the call's first message to that peer. Made at
// its first call across nodes and registered with the network; kept for the communicator's
// life, as a receive a failed call leaves posted lands here after its Agreement is gone.
struct AgreeState {
  struct Msg {
    static constexpr size_t kBody = 16384;  // payloads up to this ride with the descriptor
    static constexpr size_t kReason = 96;   // a standalone message: the descriptor and a reason
    CallDesc desc;
    char body[kBody];
  };
  AgreeState(std::vector<int> agreement_peers, Transport& net);
  std::vector<int> peers;
  std::vector<Msg> in, out;
  std::vector<size_t> got;  // bytes of each `in` receive (written when it completes)
};

class Agreement {
 public:
  // Standalone: posts the exchange (nothing waits here). Piggybacked: Run's first message to
  // and from each agreement peer carries it (stageSend / stageRecv / landed).
  // state null: nothing to agree across nodes (one node, or a network without the tag bits).
  Agreement(const Identity& id, Transport* net, AgreeState* state, const CallDesc& mine, const std::string& reason = "",
            bool piggyback = false);
  Agreement(const Agreement&) = delete;
  Agreement& operator=(const Agreement&) = delete;

  // Whether a call with this first-message payload (bytes) to every agreement peer can carry it.
  static bool canPiggyback(size_t first_message_bytes);

  // Tests what has not completed, once. A descriptor that differs throws hcInvalidUsage (an
  // invalid one hcRemoteError, naming the peer and its reason) unless collecting (see
  // anyValid). True once every descriptor arrived and every standalone send completed.
  bool poll(bool collect = false);
  // Waits for the rest, with the checks of r's idle loop (peers, notices, deadline).
  void finish(Run& r, bool collect = false);
  // After another error: waits up to ms for descriptors still missing and throws the
  // disagreement if there is one (it explains a size mismatch or a timeout better).
  void explain(long ms);
  // Collecting: whether some peer's descriptor was valid.
  bool anyValid() const { return any_valid_; }
  // Agreement peers whose standalone descriptor has not arrived (for a timeout's message).
  std::vector<int> missing() const;

  // Piggyback, for Run: the first send to an agreement peer goes from its staging message
  // (buf/len/tag are replaced); the first receive lands in one (buf/len/tag replaced, the index
  // returned for landed). -1 when the message is not the first or the peer not one of them.
  // The staged receive takes any message up to a whole staging message (irecvUpTo into
  // *received), so a peer whose call differs is seen by its descriptor, not as a truncation.
  int stageSend(int peer, const void*& buf, size_t& len, uint64_t& tag);
  int stageRecv(int peer, void*& buf, size_t& len, uint64_t& tag, size_t*& received);
  // A staged receive completed: check the descriptor, copy the payload to dst.
  void landed(int index, void* dst, size_t len);
  // A staged receive failed (a size mismatch when the peer's call differs): throws the
  // disagreement if its descriptor shows one.
  void failed(int index);

 private:
  int indexOf(int peer) const;
  void check(size_t i);
  const Identity& id_;
  Transport* net_;
  AgreeState* st_;
  CallDesc mine_;
  bool piggyback_ = false;
  std::vector<ReqId> recvs_;              // standalone, by agreement peer, 0 once arrived
  std::vector<ReqId> sends_;              // standalone, not yet completed
  std::vector<uint8_t> sent_, received_;  // piggyback, by agreement peer
  // The received lengths live in AgreeState::got, as the messages in `in`: a receive a failed
  // call leaves posted completes after this object is gone.
  size_t left_ = 0;  // descriptors not yet checked + standalone sends not completed
  bool any_valid_ = false;
};

// Tag of a call's agreement messages (transport/tags.h).
inline uint64_t agreementTag(uint64_t call) {
  return tags::make(tags::Class::Agreement, call);
}

}  // namespace hicoll
