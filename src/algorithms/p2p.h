// Point-to-point messages between two ranks of a communicator (hcSend / hcRecv and their
// non-blocking and any-source forms): the matching engine and its wire protocol.
//
// Ordering: the messages a rank sends a peer carry a per-pair sequence number and match that
// peer's receives in posting order. Within a node they go over the shared-memory queue of the
// pair (one queue for collectives and p2p: both match in the order each rank posts them, as in
// NCCL, and a message of the other kind at the head of the queue is an error naming both).
// Across nodes they go over libfabric with tags of their own (bit 61 set: collectives' tags are
// below 2^60, agreement tags have bit 60 only, the device path's are below 2^57 and the
// transport's reserved ones have every bit of its width set), so they never match a
// collective's message in flight; that takes 62 tag bits.
//
// Across nodes a message is an envelope (its length and sequence number, on one tag per pair)
// and the data (on a tag with its sequence number); the receiver answers every envelope with an
// acknowledgement carrying the length it expected. So a receive from any source can learn
// where the next message comes from (the envelope), and a length that differs is an error on
// both ranks: the receiver sees it in the envelope, the sender in the acknowledgement. Within a
// node the queue's descriptor carries the tag and the length: the receiver checks them, an
// any-source receive peeks at them; the sender completes once the receiver took the data, so a
// receiver that fails (a length that differs) fails its wait through the peer's abort.
//
// Progress is manual: operations move while this rank is in a p2p call (hcTest, hcWait, a
// blocking send or receive) and, within a node, while it is in a collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/error.h"
#include "base/identity.h"
#include "core/links.h"
#include "transport/transport.h"

namespace hicoll {

// Tags of the p2p protocol (see the header comment); seq is 58 bits.
namespace p2ptag {
constexpr uint64_t kBit = uint64_t{1} << 61;
constexpr uint64_t kSeqMask = (uint64_t{1} << 58) - 1;
constexpr uint64_t kEnvelope = kBit;
constexpr uint64_t kData = kBit | uint64_t{1} << 58;
constexpr uint64_t kAck = kBit | uint64_t{2} << 58;
constexpr int kBitsNeeded = 62;
inline uint64_t data(uint64_t seq) {
  return kData | (seq & kSeqMask);
}
inline uint64_t ack(uint64_t seq) {
  return kAck | (seq & kSeqMask);
}
inline bool isData(uint64_t tag) {
  return (tag & ~kSeqMask) == kData;
}
}  // namespace p2ptag

// One send or receive. Owned by the engine until it completes (the transport may write into
// it); the API's request shares it.
struct P2pOp {
  struct Envelope {
    uint64_t len;
    uint64_t seq;
  };
  struct Ack {
    uint64_t seq;
    uint64_t expected;  // the receiver's length
    uint64_t ok;        // 1: lengths agree, the data is received
  };
  static_assert(sizeof(Envelope) == 16 && sizeof(Ack) == 24, "wire layout");

  bool send = false;
  int peer = -1;  // -1: a receive from any source, until matched (then source says)
  int source = -1;
  void* buf = nullptr;
  size_t len = 0;
  const char* fn = "";  // the entry point that posted it, for messages
  enum class State { Waiting, Moving, Done, Failed } state = State::Waiting;
  // Transport requests still outstanding (0: none).
  Transport* t = nullptr;
  ReqId env_req = 0, data_req = 0, ack_req = 0;
  Envelope env{};
  Ack ack{};
  hcResult_t code = hcSuccess;  // Failed: its error, thrown again by every later test
  std::string error;

  bool done() const { return state == State::Done; }
  // "hcSend of 400 bytes to rank 1 (node 'n0')", for messages.
  std::string describe(const Identity& id) const;
};

class P2p {
 public:
  P2p(const Identity& id, Links& links, long timeout_ms);
  ~P2p();
  P2p(const P2p&) = delete;
  P2p& operator=(const P2p&) = delete;

  // Posts; peer = -1 receives from any source. Arguments are checked by the caller; the
  // network must be open when peer is on another node (or, for any source, when the
  // communicator spans nodes).
  std::shared_ptr<P2pOp> post(bool send, int peer, void* buf, size_t len, const char* fn);
  // One progress pass over every operation; true when op (every op) is complete. Throws an
  // op's error (and keeps throwing it), or any other prefixed with what.
  bool test(P2pOp& op);
  bool testAll(const std::vector<P2pOp*>& ops, const char* what);
  // Until every op is complete, bounded by the timeout from now; its expiry names what is late.
  void wait(const std::vector<P2pOp*>& ops, const char* what);
  // When d has passed: throws hcTimeout naming the ops not complete (a wait over several
  // communicators runs its own loop).
  void checkDeadline(const std::vector<P2pOp*>& ops, const Deadline& d, const char* what);

 private:
  struct Slot;  // an envelope receive posted to a peer on another node
  struct Peer {
    uint64_t send_seq = 0;  // messages posted to it
    uint64_t recv_seq = 0;  // shm: messages from it a receive was posted for
    int shm_recvs = 0;      // shm: receives posted to it, not complete
    std::deque<std::unique_ptr<Slot>> slots;
    std::deque<P2pOp::Envelope> arrived;  // envelopes no receive has taken yet
  };
  struct SelfMsg {
    std::vector<char> data;
  };

  bool progress();
  bool progressOp(P2pOp& op);
  bool matchSelf();
  bool matchEnvelopes();
  bool matchAnyLocal();
  void startRecv(P2pOp& op, int from, const P2pOp::Envelope& env);
  void postSlots();
  [[noreturn]] void fail(P2pOp& op, hcResult_t code, const std::string& why);
  [[noreturn]] void throwShmMismatch(P2pOp& op, const Error& e);
  [[noreturn]] void explainAndThrow(const Error& e, const char* what);
  bool local(int peer) const { return id_.sameNode(peer); }

  const Identity& id_;
  Links& links_;
  long timeout_ms_;
  std::vector<Peer> peers_;
  std::list<std::shared_ptr<P2pOp>> ops_;  // in posting order, until complete
  std::deque<SelfMsg> self_;               // sends to self no receive took yet (copied)
};

}  // namespace hicoll
