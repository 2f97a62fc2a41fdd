// Point-to-point messages: posting, matching (in posting order per pair; from any source by
// envelope or by a look at the shared-memory queue), progress and bounded waits (p2p.h).
#include "algorithms/p2p.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "transport/shm/shm_transport.h"

namespace hicoll {
namespace {

// An operation's own failure (a size or order mismatch): its message names the operation
// already; any other error in a wait is prefixed with what waited.
struct OpFailure : Error {
  using Error::Error;
};

// The first receive waiting for a message from `from`: one that names it, else one from any
// source (a message goes to the earliest receive posted for its source). from = -2: the first
// receive from any source.
P2pOp* firstWaiting(std::list<std::shared_ptr<P2pOp>>& ops, int from) {
  P2pOp* any = nullptr;
  for (const auto& op : ops) {
    if (op->state != P2pOp::State::Waiting || op->send) continue;
    if (op->peer == from) return op.get();
    if (op->peer < 0 && !any) any = op.get();
  }
  return any;
}

}  // namespace

// An envelope receive, posted to one peer on another node; the transport writes into env.
struct P2p::Slot {
  ReqId req = 0;
  P2pOp::Envelope env{};
};

std::string P2pOp::describe(const Identity& id) const {
  const int who = peer >= 0 ? peer : source;
  const std::string whom = who < 0 ? "any source" : who == id.rank ? "itself" : id.who(who);
  return fmt::format("{} of {} bytes {} {}", fn, len, send ? "to" : "from", whom);
}

P2p::P2p(const Identity& id, Links& links, long timeout_ms)
    : id_(id), links_(links), timeout_ms_(timeout_ms), peers_(static_cast<size_t>(id.nranks)) {}

// The transports close before this is destroyed (hcComm::release): nothing writes into the
// slots or the operations any more.
P2p::~P2p() = default;

std::shared_ptr<P2pOp> P2p::post(bool send, int peer, void* buf, size_t len, const char* fn) {
  auto op = std::make_shared<P2pOp>();
  op->send = send;
  op->peer = peer;
  op->buf = buf;
  op->len = len;
  op->fn = fn;
  if (send && peer == id_.rank) {
    // Copied now: a send to self completes at once, whether or not its receive is posted.
    const char* p = static_cast<const char*>(buf);
    self_.push_back({std::vector<char>(p, p + len)});
    op->source = peer;
    op->state = P2pOp::State::Done;
    return op;
  }
  ops_.push_back(op);
  if (peer < 0 || peer == id_.rank) return op;  // matched by progress()
  Peer& p = peers_[static_cast<size_t>(peer)];
  op->t = &links_.to(peer);
  if (local(peer)) {
    // The shared-memory queue is the pair's order: post at once, so that a collective called
    // after it queues behind it on both ranks.
    const uint64_t seq = send ? p.send_seq++ : p.recv_seq++;
    op->data_req =
        send ? op->t->isend(peer, buf, len, p2ptag::data(seq)) : op->t->irecv(peer, buf, len, p2ptag::data(seq));
    if (!send) ++p.shm_recvs;
    op->source = peer;
    op->state = P2pOp::State::Moving;
    return op;
  }
  if (!send) return op;  // waits for the peer's envelope
  const uint64_t seq = p.send_seq++;
  op->env = {len, seq};
  op->env_req = op->t->isend(peer, &op->env, sizeof op->env, p2ptag::kEnvelope);
  if (len) op->data_req = op->t->isend(peer, buf, len, p2ptag::data(seq));
  op->ack_req = op->t->irecv(peer, &op->ack, sizeof op->ack, p2ptag::ack(seq));
  op->source = peer;
  op->state = P2pOp::State::Moving;
  return op;
}

void P2p::fail(P2pOp& op, hcResult_t code, const std::string& why) {
  op.state = P2pOp::State::Failed;
  op.code = code;
  op.error = why;
  // The communicator cannot go on: the pair's order is lost.
  throw OpFailure(code, why, Error::kFatal);
}

// Every receive that waits for an envelope from a peer on another node has one posted for it;
// one for any source, to every such peer. Envelopes that came for nobody are kept (arrived).
void P2p::postSlots() {
  bool any = false;
  for (const auto& op : ops_) any |= op->state == P2pOp::State::Waiting && op->peer < 0;
  for (int r = 0; r < id_.nranks; ++r) {
    if (local(r)) continue;
    Peer& p = peers_[static_cast<size_t>(r)];
    size_t need = any ? 1 : 0;
    for (const auto& op : ops_) need += op->state == P2pOp::State::Waiting && op->peer == r;
    if (need <= p.arrived.size()) continue;
    need -= p.arrived.size();
    while (p.slots.size() < need) {
      auto s = std::make_unique<Slot>();
      s->req = links_.ofi->irecv(r, &s->env, sizeof s->env, p2ptag::kEnvelope);
      p.slots.push_back(std::move(s));
    }
  }
}

bool P2p::matchSelf() {
  bool moved = false;
  while (!self_.empty()) {
    P2pOp* op = firstWaiting(ops_, id_.rank);
    if (!op) break;
    std::vector<char>& d = self_.front().data;
    op->source = id_.rank;
    if (d.size() != op->len)
      fail(*op, hcInvalidUsage,
           fmt::format("{}: size mismatch: rank {} sent itself {} bytes (send), its receive expects {} bytes (recv)",
                       op->describe(id_), id_.rank, d.size(), op->len));
    if (!d.empty()) std::memcpy(op->buf, d.data(), d.size());
    op->state = P2pOp::State::Done;
    self_.pop_front();
    moved = true;
  }
  return moved;
}

void P2p::startRecv(P2pOp& op, int from, const P2pOp::Envelope& env) {
  op.peer = op.source = from;
  op.t = links_.ofi.get();
  const bool agree = env.len == op.len;
  op.ack = {env.seq, op.len, agree ? 1u : 0u};
  op.ack_req = op.t->isend(from, &op.ack, sizeof op.ack, p2ptag::ack(env.seq));
  if (!agree) {
    // The sender learns it from the acknowledgement: give it a moment to leave.
    waitUntil([&] { return op.t->test(op.ack_req); }, Deadline(200));
    op.ack_req = 0;
    fail(op, hcInvalidUsage,
         fmt::format("{}: size mismatch: {} sent {} bytes (send), this rank (rank {}) expects {} bytes (recv)",
                     op.describe(id_), id_.who(from), env.len, id_.rank, op.len));
  }
  if (op.len) op.data_req = op.t->irecv(from, op.buf, op.len, p2ptag::data(env.seq));
  op.state = P2pOp::State::Moving;
}

bool P2p::matchEnvelopes() {
  if (!links_.ofi) return false;
  bool moved = false;
  for (int r = 0; r < id_.nranks; ++r) {
    if (local(r)) continue;
    Peer& p = peers_[static_cast<size_t>(r)];
    // One peer's envelopes arrive in order: only the oldest slot can be next.
    while (!p.slots.empty() && links_.ofi->test(p.slots.front()->req)) {
      p.arrived.push_back(p.slots.front()->env);
      p.slots.pop_front();
      moved = true;
    }
    while (!p.arrived.empty()) {
      P2pOp* op = firstWaiting(ops_, r);
      if (!op) break;
      const P2pOp::Envelope env = p.arrived.front();
      p.arrived.pop_front();
      startRecv(*op, r, env);
      moved = true;
    }
  }
  return moved;
}

// A receive from any source takes a local peer's next message when it is a p2p message no
// receive naming that peer is posted for (those come first: the queue is the pair's order).
bool P2p::matchAnyLocal() {
  P2pOp* op = firstWaiting(ops_, -2);
  if (!op || !links_.shm) return false;
  ShmTransport& shm = *links_.shm;
  for (int l = 0; l < shm.localSize(); ++l) {
    const int r = shm.commRank(l);
    Peer& p = peers_[static_cast<size_t>(r)];
    if (r == id_.rank || p.shm_recvs > 0) continue;
    uint64_t tag = 0;
    size_t len = 0;
    if (!shm.peek(r, &tag, &len) || tag != p2ptag::data(p.recv_seq)) continue;
    op->peer = op->source = r;
    if (len != op->len)
      fail(*op, hcInvalidUsage,
           fmt::format("{}: size mismatch: {} sent {} bytes (send), this rank (rank {}) expects {} bytes (recv)",
                       op->describe(id_), id_.who(r), len, id_.rank, op->len));
    op->t = &shm;
    op->data_req = shm.irecv(r, op->buf, op->len, p2ptag::data(p.recv_seq++));
    ++p.shm_recvs;
    op->state = P2pOp::State::Moving;
    return true;
  }
  return false;
}

// A length or order that differs on a shared-memory receive: what the peer sent, named.
void P2p::throwShmMismatch(P2pOp& op, const Error& e) {
  uint64_t tag = 0;
  size_t len = 0;
  if (!links_.shm->peek(op.peer, &tag, &len)) throw e;
  if (!p2ptag::isData(tag))
    fail(op, hcInvalidUsage,
         fmt::format("{}: {} sent a collective's message (tag {:#x}, {} bytes) where this rank expects a "
                     "point-to-point one: p2p calls and collectives posted in a different order on the two ranks",
                     op.describe(id_), id_.who(op.peer), tag, len));
  fail(op, hcInvalidUsage,
       fmt::format("{}: size mismatch: {} sent {} bytes (send), this rank (rank {}) expects {} bytes (recv)",
                   op.describe(id_), id_.who(op.peer), len, id_.rank, op.len));
}

// Tests op's outstanding requests once; true when something completed.
bool P2p::progressOp(P2pOp& op) {
  bool moved = false;
  auto step = [&](ReqId& r) {
    if (r && op.t->test(r)) {
      r = 0;
      moved = true;
    }
  };
  if (op.send || !local(op.peer)) {
    step(op.env_req);
    step(op.data_req);
    step(op.ack_req);
    if (op.send && op.ack_req == 0 && op.ack.ok != 1 && local(op.peer) == false)
      fail(op, hcInvalidUsage,
           fmt::format("{}: size mismatch: this rank (rank {}) sent {} bytes (send), {} expects {} bytes (recv)",
                       op.describe(id_), id_.rank, op.len, id_.who(op.peer), op.ack.expected));
  } else {
    try {
      step(op.data_req);
    } catch (const Error& e) {
      if (e.code() != hcInvalidUsage) throw;
      throwShmMismatch(op, e);
    }
    if (!op.data_req) --peers_[static_cast<size_t>(op.peer)].shm_recvs;
  }
  if (!op.env_req && !op.data_req && !op.ack_req) op.state = P2pOp::State::Done;
  return moved;
}

bool P2p::progress() {
  if (links_.ofi) postSlots();
  bool moved = matchSelf();
  moved |= matchEnvelopes();
  moved |= matchAnyLocal();
  for (auto it = ops_.begin(); it != ops_.end();) {
    P2pOp& op = **it;
    if (op.state == P2pOp::State::Moving) {
      try {
        moved |= progressOp(op);
      } catch (const Error& e) {
        if (op.state != P2pOp::State::Failed) {
          op.state = P2pOp::State::Failed;
          op.code = e.code();
          op.error = e.what();
        }
        throw;
      }
    }
    // Done ones leave (the request keeps its own reference); failed ones stay: the transport
    // may still write into them until it closes.
    it = op.state == P2pOp::State::Done ? ops_.erase(it) : std::next(it);
  }
  return moved;
}

bool P2p::test(P2pOp& op) {
  return testAll({&op}, op.describe(id_).c_str());
}

bool P2p::testAll(const std::vector<P2pOp*>& ops, const char* what) {
  try {
    bool all = true;
    for (P2pOp* op : ops) {
      if (op->state == P2pOp::State::Failed) throw OpFailure(op->code, op->error, Error::kFatal);
      all &= op->done();
    }
    if (all) return true;
    progress();
    all = true;
    for (P2pOp* op : ops) {
      if (op->state == P2pOp::State::Failed) throw OpFailure(op->code, op->error, Error::kFatal);
      all &= op->done();
    }
    return all;
  } catch (const OpFailure&) {
    throw;
  } catch (const Error& e) {
    explainAndThrow(e, what);
  }
}

void P2p::explainAndThrow(const Error& e, const char* what) {
  if (e.symptom()) links_.explainSymptom(250);  // the failure notice of the peer behind it
  throw Error(e.code(), fmt::format("{}: {}", what, e.what()), Error::kFatal);
}

void P2p::checkDeadline(const std::vector<P2pOp*>& ops, const Deadline& d, const char* what) {
  if (!d.expired()) return;
  std::vector<std::string> late;
  for (const P2pOp* op : ops) {
    if (op->done()) continue;
    std::string s = op->describe(id_);
    const int peer = op->peer >= 0 ? op->peer : -1;
    if (op->state == P2pOp::State::Waiting)
      s += peer >= 0 ? ": no message from it has arrived" : ": no message has arrived from any rank";
    else s += op->send ? ": the receiver has not taken it" : ": the data has not all arrived";
    if (peer >= 0 && peer != id_.rank && local(peer))
      s += fmt::format(" (rank {}: {})", peer, links_.shm->peerState(id_.topo.local_of[static_cast<size_t>(peer)]));
    late.push_back(s);
  }
  throw Error(hcTimeout, fmt::format("timed out after {} ms in {}: {}", timeout_ms_, what, fmt::join(late, "; ")),
              Error::kFatal);
}

void P2p::wait(const std::vector<P2pOp*>& ops, const char* what) {
  const Deadline d(timeout_ms_);
  try {
    waitUntil(
        [&] {
          const bool moved = progress();
          bool all = true;
          for (P2pOp* op : ops) {
            if (op->state == P2pOp::State::Failed) throw OpFailure(op->code, op->error, Error::kFatal);
            all &= op->done();
          }
          return all ? Progress::Done : moved ? Progress::Moved : Progress::Idle;
        },
        d, [&] { links_.checkPeers(); }, [&] { checkDeadline(ops, d, what); });
  } catch (const OpFailure&) {
    throw;
  } catch (const Error& e) {
    if (e.code() == hcTimeout) throw Error(e.code(), e.what(), Error::kFatal);  // names what already
    explainAndThrow(e, what);
  }
}

}  // namespace hicoll
