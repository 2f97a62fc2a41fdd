// Point-to-point messages between two ranks of a communicator (hcSend / hcRecv, their tagged,
// non-blocking and any-source forms): the matching engine and its wire protocol.
//
// Matching (as MPI): a receive takes the oldest message from its peer with its tag; messages
// of different tags may be taken out of order. A message goes to the earliest receive posted
// for its source and tag, and only then to one from any source with its tag. One that arrives
// while no receive takes it, ahead of one a receive waits for (the peer's queue is in order),
// is unexpected: its data is copied aside (bounded: kUnexpectedBytes per communicator; beyond
// that it stays with its sender until its receive is posted) and the sender completes.
//
// Within a node messages go over the shared-memory queue of the pair (one queue for
// collectives and p2p: both are taken in the order the sender posted them, as in NCCL; a
// message of the other kind at the head of the queue is an error naming both). Each receive
// naming a local peer posts one placed receive in the queue's order at once (so a collective
// called after it queues behind it); the placed receive chooses its buffer when it sees the
// message's tag: the receive waiting for that tag, or the unexpected copy. The descriptor
// carries the tag and the length.
//
// Across nodes they go over libfabric with tags of their own class (transport/tags.h), so they
// never match a collective's message in flight. A message is an envelope (its
// length, sequence number and tag, on one libfabric tag per pair, so envelopes arrive in order)
// and the data: up to kCarryBytes in the envelope's message, more on a libfabric tag with its
// sequence number (one message each way for a small one); the receiver answers every
// envelope it matches or copies aside with an acknowledgement carrying the length it expected.
// So a receive from any source learns where the next message comes from (the envelope), and a
// length that differs is an error on both ranks: the receiver sees it in the envelope, the
// sender in the acknowledgement (or, for a message copied aside, through the receiver's
// failure notice: its send had completed). Within a node the sender completes once the
// receiver took the data, so a receiver that fails fails its wait through the peer's abort.
//
// Progress is manual: operations move while this rank is in a p2p call (hcTest, hcWait, a
// blocking send or receive) and, within a node, while it is in a collective.
//
// The network of a communicator spanning nodes opens at its first call that needs it, in an
// exchange every rank joins (hcComm::ensureNetwork): a rank's first p2p call across nodes
// waits until every rank has made such a call (a collective, or a p2p call across nodes).
// A rank that first blocks in a call within its node makes it wait until the timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/error.h"
#include "base/identity.h"
#include "core/links.h"
#include "core/stats.h"
#include "transport/tags.h"
#include "transport/transport.h"

namespace hicoll {

// Tags of the p2p protocol (see the header comment): their class of transport/tags.h, the
// kind in the payload's top two bits, seq below them.
namespace p2ptag {
constexpr int kSeqBits = tags::kPayloadBits - 2;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
constexpr uint64_t kEnvelope = tags::make(tags::Class::P2p, 0);
constexpr uint64_t kData = tags::make(tags::Class::P2p, uint64_t{1} << kSeqBits);
constexpr uint64_t kAck = tags::make(tags::Class::P2p, uint64_t{2} << kSeqBits);
inline uint64_t data(uint64_t seq) {
  return kData | (seq & kSeqMask);
}
inline uint64_t ack(uint64_t seq) {
  return kAck | (seq & kSeqMask);
}
// Over shared memory the queue keeps the pair's order: the descriptor carries the user's tag.
inline uint64_t shm(int tag) {
  return kData | static_cast<uint64_t>(tag);
}
inline bool isData(uint64_t tag) {
  return (tag & ~kSeqMask) == kData;
}
}  // namespace p2ptag

// Unexpected messages' data copied aside per communicator at most; envelopes from one peer on
// another node held unmatched (and not copied) at most: beyond them a receive waits.
constexpr size_t kUnexpectedBytes = size_t{64} << 20;
constexpr size_t kUnexpectedEnvelopes = 1024;
// Across nodes, data up to this rides in its envelope's message (counted as copied aside while
// held: an envelope receive has room for it).
constexpr size_t kCarryBytes = 4096;

struct P2pEnvelope {
  uint64_t len;
  uint64_t seq;
  uint64_t tag;
};
struct P2pAck {
  uint64_t seq;
  uint64_t expected;  // the receiver's length (0 when copied aside: not known yet)
  uint64_t ok;        // kAckAgree, kAckCopied or 0: the lengths differ
};
constexpr uint64_t kAckAgree = 1, kAckCopied = 2;
static_assert(sizeof(P2pEnvelope) == 24 && sizeof(P2pAck) == 24, "wire layout");

// A message no receive had taken when it arrived: sent to self, copied aside (pulled), or
// across nodes an envelope whose data still waits at the sender.
struct P2pMsg {
  int from = -1;
  int tag = 0;
  uint64_t len = 0;
  uint64_t seq = 0;  // across nodes: the envelope's
  bool pulled = false;
  bool carried = false;    // across nodes: its data came with the envelope, into data
  std::vector<char> data;  // pulled: the transport writes into it until data_req completes
  Transport* t = nullptr;
  ReqId data_req = 0, ack_req = 0;
  P2pAck ack{};
};

// One send or receive. Owned by the engine until it completes (the transport may write into
// it); the API's request shares it.
struct P2pOp {
  bool send = false;
  int peer = -1;  // -1: a receive from any source, until matched (then source says)
  int source = -1;
  int tag = 0;
  void* buf = nullptr;
  size_t len = 0;
  const char* fn = "";  // the entry point that posted it, for messages
  enum class State { Waiting, Moving, Done, Failed } state = State::Waiting;
  // Transport requests still outstanding (0: none).
  Transport* t = nullptr;
  ReqId env_req = 0, data_req = 0, ack_req = 0;
  P2pEnvelope env{};
  std::vector<char> carry;  // a send across nodes of up to kCarryBytes: the envelope, then the data
  P2pAck ack{};
  std::unique_ptr<P2pMsg> stash;  // the unexpected message it took: copied out once complete
  hcResult_t code = hcSuccess;    // Failed: its error, thrown again by every later test
  std::string error;

  bool done() const { return state == State::Done; }
  // "hcSend of 400 bytes to rank 1 (node 'n0')" (", tag 7" after the size when tagged).
  std::string describe(const Identity& id) const;
};

class P2p {
 public:
  P2p(const Identity& id, Links& links, Stats& stats, long timeout_ms);
  ~P2p();
  P2p(const P2p&) = delete;
  P2p& operator=(const P2p&) = delete;

  // Operations waited for together. `what` names them in errors; nullptr: described from the
  // ops themselves (only when an error needs it: formatting costs more than a small message).
  using Ops = std::span<P2pOp* const>;

  // Posts; peer = -1 receives from any source; tag >= 0. Arguments are checked by the caller;
  // the network must be open when peer is on another node (or, for any source, when the
  // communicator spans nodes).
  std::shared_ptr<P2pOp> post(bool send, int peer, int tag, void* buf, size_t len, const char* fn);
  // A blocking send or receive with a local peer (not itself) that needs no matching: nothing
  // else is pending on this communicator, and for a receive nothing from other ranks is held
  // and the message at the head of the pair's queue is its own (its tag and size). It goes
  // straight to the queue and polls only it: a ping-pong's latency. Returns false, having
  // consumed nothing, when it does not apply (then post() and wait() from the same deadline:
  // another tag, a collective's message or a size that differs is theirs to take or report).
  bool direct(bool send, int peer, int tag, void* buf, size_t len, const char* fn, const Deadline& d);
  // One progress pass over every operation; true when op (every op) is complete. Throws an
  // op's error (and keeps throwing it), or any other prefixed with what.
  bool test(P2pOp& op);
  bool testAll(Ops ops, const char* what);
  // Until every op is complete, bounded by the timeout from now (or by d); its expiry names
  // what is late.
  void wait(Ops ops, const char* what, const Deadline* d = nullptr);
  // When d has passed: throws hcTimeout naming the ops not complete (a wait over several
  // communicators runs its own loop).
  void checkDeadline(Ops ops, const Deadline& d, const char* what);

 private:
  struct Slot;  // an envelope receive posted to a peer on another node
  struct Peer {
    uint64_t send_seq = 0;  // across nodes: messages posted to it
    int shm_free = 0;       // within the node: placed receives that have not seen a message
    int shm_open = 0;       // ... and those not complete
    std::deque<std::unique_ptr<Slot>> slots;
    std::deque<std::unique_ptr<P2pMsg>> unexpected;  // in arrival order
  };

  bool progress();
  bool progressOp(P2pOp& op);
  bool progressUnexpected();
  bool takeUnexpected(P2pOp& op);
  void take(P2pOp& op, std::unique_ptr<P2pMsg> m);
  template <class F>
  void takeNoThrow(P2pOp& op, F&& f);
  bool place(int from, ReqId req, uint64_t tag, size_t len, char** buf);
  void postPlaced(int peer);
  bool postPlacedForWaiting();
  bool matchEnvelopes();
  bool matchAnyLocal();
  void pull(P2pMsg& m);
  // carried: the data that came with the envelope (env.len bytes), else null.
  void startRecv(P2pOp& op, int from, const P2pEnvelope& env, const char* carried);
  void postSlots();
  bool step(Transport* t, ReqId& r, int from);
  [[noreturn]] void fail(P2pOp& op, hcResult_t code, const std::string& why);
  [[noreturn]] void failSize(P2pOp& op, int from, uint64_t sent);
  [[noreturn]] void explainAndThrow(const Error& e, const std::string& what);
  std::string whatOf(Ops ops, const char* what) const;
  bool local(int peer) const { return id_.sameNode(peer); }

  const Identity& id_;
  Links& links_;
  Stats& stats_;
  long timeout_ms_;
  std::vector<Peer> peers_;
  std::list<std::shared_ptr<P2pOp>> ops_;  // in posting order, until complete
  size_t unexpected_bytes_ = 0;            // pulled and not taken (sends to self not counted)
  size_t held_ = 0;                        // messages in the peers' unexpected lists
  int placed_ = 0;                         // placed receives not complete (every peer's shm_open)
};

}  // namespace hicoll
