// Point-to-point messages: posting, matching by source and tag (in posting order per pair and
// tag; unexpected messages copied aside; from any source by envelope or by a look at the
// shared-memory queue), progress and bounded waits (p2p.h).
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

// The first receive waiting for a message from `from` with `tag`: one that names it, else one
// from any source (a message goes to the earliest receive posted for its source). from = -2:
// the first receive from any source; tag = -1: any tag.
P2pOp* firstWaiting(std::list<std::shared_ptr<P2pOp>>& ops, int from, int tag) {
  P2pOp* any = nullptr;
  for (const auto& op : ops) {
    if (op->state != P2pOp::State::Waiting || op->send || (tag >= 0 && op->tag != tag)) continue;
    if (op->peer == from) return op.get();
    if (op->peer < 0 && !any) any = op.get();
  }
  return any;
}

}  // namespace

// An envelope receive, posted to one peer on another node; the transport writes into msg (the
// envelope, and the data when it is carried) and its length into got. Left unwritten until then
// (created default-initialised: not 4 KiB of zeros per receive).
struct P2p::Slot {
  ReqId req = 0;
  size_t got = 0;
  struct {
    P2pEnvelope env;
    char data[kCarryBytes];
  } msg;
};

std::string P2pOp::describe(const Identity& id) const {
  const int who = peer >= 0 ? peer : source;
  const std::string whom = who < 0 ? "any source" : who == id.rank ? "itself" : id.who(who);
  const bool tagged = tag != 0 || std::strstr(fn, "Tag");
  return fmt::format("{} of {} bytes{} {} {}", fn, len, tagged ? fmt::format(", tag {},", tag) : "",
                     send ? "to" : "from", whom);
}

P2p::P2p(const Identity& id, Links& links, Stats& stats, long timeout_ms)
    : id_(id), links_(links), stats_(stats), timeout_ms_(timeout_ms), peers_(static_cast<size_t>(id.nranks)) {}

// The transports close before this is destroyed (hcComm::release): nothing writes into the
// slots, the operations or the unexpected messages any more, nor calls place().
P2p::~P2p() = default;

std::shared_ptr<P2pOp> P2p::post(bool send, int peer, int tag, void* buf, size_t len, const char* fn) {
  auto op = std::make_shared<P2pOp>();
  op->send = send;
  op->peer = peer;
  op->tag = tag;
  op->buf = buf;
  op->len = len;
  op->fn = fn;
  if (send && peer == id_.rank) {
    // Copied now: a send to self completes at once, whether or not its receive is posted.
    auto m = std::make_unique<P2pMsg>();
    m->from = peer;
    m->tag = tag;
    m->len = len;
    m->pulled = true;
    m->data.assign(static_cast<const char*>(buf), static_cast<const char*>(buf) + len);
    op->source = peer;
    op->state = P2pOp::State::Done;
    stats_.countP2p(true, len);
    P2pOp* r = firstWaiting(ops_, peer, tag);
    if (!r) {
      peers_[static_cast<size_t>(peer)].unexpected.push_back(std::move(m));
      ++held_;
    } else takeNoThrow(*r, [&] { take(*r, std::move(m)); });
    return op;
  }
  ops_.push_back(op);
  if (!send) {
    // A receive naming a local peer takes its place in the pair's queue order at once, so that
    // a collective called after it queues behind it on both ranks.
    bool taken = false;
    takeNoThrow(*op, [&] { taken = takeUnexpected(*op); });
    if (!taken && peer >= 0 && peer != id_.rank && local(peer)) postPlaced(peer);
    return op;
  }
  Peer& p = peers_[static_cast<size_t>(peer)];
  op->t = &links_.to(peer);
  op->source = peer;
  op->state = P2pOp::State::Moving;
  if (local(peer)) {
    op->data_req = op->t->isend(peer, buf, len, p2ptag::shm(tag));
    return op;
  }
  const uint64_t seq = p.send_seq++;
  op->env = {len, seq, static_cast<uint64_t>(tag)};
  if (len <= kCarryBytes) {
    op->carry.resize(sizeof op->env + len);
    std::memcpy(op->carry.data(), &op->env, sizeof op->env);
    if (len) std::memcpy(op->carry.data() + sizeof op->env, buf, len);
    op->env_req = op->t->isend(peer, op->carry.data(), op->carry.size(), p2ptag::kEnvelope);
  } else {
    op->env_req = op->t->isend(peer, &op->env, sizeof op->env, p2ptag::kEnvelope);
    op->data_req = op->t->isend(peer, buf, len, p2ptag::data(seq));
  }
  op->ack_req = op->t->irecv(peer, &op->ack, sizeof op->ack, p2ptag::ack(seq));
  return op;
}

bool P2p::direct(bool send, int peer, int tag, void* buf, size_t len, const char* fn, const Deadline& d) {
  // Anything pending (an operation, a placed receive, a message held or being copied aside)
  // moves only while the general wait runs.
  if (!ops_.empty() || placed_ > 0 || held_ > 0 || peer == id_.rank || !local(peer)) return false;
  ShmTransport& shm = *links_.shm;
  if (!send && shm.postedRecvs(peer) > 0) return false;
  const uint64_t want = p2ptag::shm(tag);
  uint64_t index = ShmTransport::kNotNow;
  ReqId req = 0;
  if (send) {
    index = shm.postNow(peer, buf, len, want);
    if (index == ShmTransport::kNotNow) req = shm.isend(peer, buf, len, want);
  }
  bool arrived = send, theirs = false;
  // For messages only: what the wait is, as the general path would describe it.
  auto op = [&] {
    P2pOp o;
    o.send = send;
    o.peer = o.source = peer;
    o.tag = tag;
    o.len = len;
    o.fn = fn;
    o.state = arrived ? P2pOp::State::Moving : P2pOp::State::Waiting;
    return o;
  };
  try {
    waitUntil(
        [&] {
          if (!arrived) {
            uint64_t t = 0;
            size_t n = 0;
            if (!shm.peek(peer, &t, &n)) {
              shm.prefetchFrom(peer, len);
              return Progress::Idle;
            }
            if (t != want || n != len) {
              theirs = true;
              return Progress::Done;
            }
            arrived = true;
            if (shm.takeNow(peer, buf, len)) return Progress::Done;
            req = shm.irecv(peer, buf, len, want);
          }
          if (req ? shm.test(req) : shm.taken(peer, index)) return Progress::Done;
          if (send) shm.prefetchFrom(peer, len);  // a send's wait is often followed by a receive of the reply
          return Progress::Idle;
        },
        d, [&] { links_.checkPeers(); },
        [&] {
          P2pOp o = op();
          P2pOp* ops[] = {&o};
          checkDeadline(ops, d, nullptr);
        });
  } catch (const Error& e) {
    if (e.code() == hcTimeout) throw Error(e.code(), e.what(), Error::kFatal);  // names what already
    explainAndThrow(e, op().describe(id_));
  }
  if (theirs) return false;
  stats_.countP2p(send, len);
  return true;
}

void P2p::fail(P2pOp& op, hcResult_t code, const std::string& why) {
  op.state = P2pOp::State::Failed;
  op.code = code;
  op.error = why;
  // The communicator cannot go on: the pair's order is lost.
  throw OpFailure(code, why, Error::kFatal);
}

// A receive that fails while it is posted (a size that differs from a message taken at once)
// fails in its test or wait, like any other: its post succeeds.
template <class F>
void P2p::takeNoThrow(P2pOp& op, F&& f) {
  try {
    f();
  } catch (const OpFailure&) {
    if (op.state != P2pOp::State::Failed) throw;
  }
}

void P2p::failSize(P2pOp& op, int from, uint64_t sent) {
  const std::string who = from == id_.rank ? fmt::format("rank {} (itself)", from) : id_.who(from);
  fail(op, hcInvalidUsage,
       fmt::format("{}: size mismatch: {} sent {} bytes with tag {} (send), this rank (rank {}) expects {} bytes "
                   "(recv)",
                   op.describe(id_), who, sent, op.tag, id_.rank, op.len));
}

// The oldest message op can take that arrived before it was posted (from its peer, or from
// any source: the lowest rank first) with its tag.
bool P2p::takeUnexpected(P2pOp& op) {
  const int lo = op.peer >= 0 ? op.peer : 0, hi = op.peer >= 0 ? op.peer + 1 : id_.nranks;
  for (int r = lo; r < hi; ++r) {
    auto& q = peers_[static_cast<size_t>(r)].unexpected;
    for (auto it = q.begin(); it != q.end(); ++it) {
      if ((*it)->tag != op.tag) continue;
      std::unique_ptr<P2pMsg> m = std::move(*it);
      q.erase(it);
      --held_;
      take(op, std::move(m));
      return true;
    }
  }
  return false;
}

void P2p::take(P2pOp& op, std::unique_ptr<P2pMsg> m) {
  const int from = m->from;
  if (!m->pulled) {  // across nodes, not acknowledged yet (its data at the sender, or carried)
    if (m->carried) unexpected_bytes_ -= m->len;
    startRecv(op, from, {m->len, m->seq, static_cast<uint64_t>(m->tag)}, m->carried ? m->data.data() : nullptr);
    return;
  }
  if (from != id_.rank) unexpected_bytes_ -= m->len;
  op.peer = op.source = from;
  op.state = P2pOp::State::Moving;
  const uint64_t sent = m->len;
  op.stash = std::move(m);  // kept on failure too: the transport may still write into it
  if (sent != op.len) failSize(op, from, sent);
}

// Called by the shared-memory transport when a placed receive from `from` sees its message:
// the receive waiting for its tag takes it, else it is copied aside if the bound allows.
bool P2p::place(int from, ReqId req, uint64_t tag, size_t len, char** buf) {
  Peer& p = peers_[static_cast<size_t>(from)];
  if (!p2ptag::isData(tag)) {
    const std::string why = fmt::format(
        "{} sent a collective's message (tag {:#x}, {} bytes) where this rank expects a point-to-point one: p2p "
        "calls and collectives posted in a different order on the two ranks",
        id_.who(from), tag, len);
    if (P2pOp* op = firstWaiting(ops_, from, -1)) fail(*op, hcInvalidUsage, op->describe(id_) + ": " + why);
    throw OpFailure(hcInvalidUsage, why, Error::kFatal);
  }
  const int t = static_cast<int>(tag & p2ptag::kSeqMask);
  if (P2pOp* op = firstWaiting(ops_, from, t)) {
    --p.shm_free;
    op->peer = op->source = from;
    op->t = links_.shm.get();
    op->data_req = req;
    op->state = P2pOp::State::Moving;
    if (len != op->len) failSize(*op, from, len);
    *buf = static_cast<char*>(op->buf);
    return true;
  }
  if (unexpected_bytes_ + len > kUnexpectedBytes) return false;  // stays in the queue for now
  auto m = std::make_unique<P2pMsg>();
  m->from = from;
  m->tag = t;
  m->len = len;
  m->pulled = true;
  m->data.resize(len);
  m->t = links_.shm.get();
  m->data_req = req;
  unexpected_bytes_ += len;
  stats_.countP2pCopiedAside();
  --p.shm_free;
  *buf = m->data.data();
  p.unexpected.push_back(std::move(m));
  ++held_;
  return true;
}

void P2p::postPlaced(int peer) {
  links_.shm->irecvPlaced(
      peer, [this, peer](ReqId req, uint64_t tag, size_t len, char** buf) { return place(peer, req, tag, len, buf); });
  Peer& p = peers_[static_cast<size_t>(peer)];
  ++p.shm_free;
  ++p.shm_open;
  ++placed_;
}

// Every receive naming a local peer has a placed receive that has not seen a message yet (one
// that saw a message for another tag is replaced); the unbound ones are driven from here.
bool P2p::postPlacedForWaiting() {
  ShmTransport& shm = *links_.shm;
  bool unbound = false;
  for (int l = 0; l < shm.localSize(); ++l) {
    const int r = shm.commRank(l);
    if (r == id_.rank) continue;
    Peer& p = peers_[static_cast<size_t>(r)];
    int need = 0;
    for (const auto& op : ops_) need += !op->send && op->state == P2pOp::State::Waiting && op->peer == r;
    while (p.shm_free < need) postPlaced(r);
    unbound |= p.shm_free > 0;
  }
  return unbound;
}

// A receive from any source takes a local peer's next message when it is a p2p message and no
// receive naming that peer is placed (those come first: the queue is the pair's order); one of
// another tag is copied aside, within the bound, to reach the next.
bool P2p::matchAnyLocal() {
  if (!firstWaiting(ops_, -2, -1)) return false;
  ShmTransport& shm = *links_.shm;
  bool moved = false;
  for (int l = 0; l < shm.localSize(); ++l) {
    const int r = shm.commRank(l);
    if (r == id_.rank || peers_[static_cast<size_t>(r)].shm_open > 0) continue;
    uint64_t tag = 0;
    size_t len = 0;
    if (!shm.peek(r, &tag, &len) || !p2ptag::isData(tag)) continue;
    const int t = static_cast<int>(tag & p2ptag::kSeqMask);
    if (!firstWaiting(ops_, -2, t) && unexpected_bytes_ + len > kUnexpectedBytes) continue;
    postPlaced(r);
    moved = true;
  }
  if (moved) shm.progress();  // the placed receives see their messages now
  return moved;
}

void P2p::startRecv(P2pOp& op, int from, const P2pEnvelope& env, const char* carried) {
  op.peer = op.source = from;
  op.t = links_.ofi.get();
  const bool agree = env.len == op.len;
  op.ack = {env.seq, op.len, agree ? kAckAgree : 0};
  op.ack_req = op.t->isend(from, &op.ack, sizeof op.ack, p2ptag::ack(env.seq));
  if (!agree) {
    // The sender learns it from the acknowledgement: give it a moment to leave.
    waitUntil([&] { return op.t->test(op.ack_req); }, Deadline(200));
    op.ack_req = 0;
    failSize(op, from, env.len);
  }
  if (carried && op.len) std::memcpy(op.buf, carried, op.len);
  else if (op.len) op.data_req = op.t->irecv(from, op.buf, op.len, p2ptag::data(env.seq));
  op.state = P2pOp::State::Moving;
}

// Copies a message from another node aside and acknowledges it, so that its sender completes.
void P2p::pull(P2pMsg& m) {
  m.pulled = true;
  m.t = links_.ofi.get();
  stats_.countP2pCopiedAside();
  m.ack = {m.seq, 0, kAckCopied};
  m.ack_req = m.t->isend(m.from, &m.ack, sizeof m.ack, p2ptag::ack(m.seq));
  if (m.carried) return;  // its data is here, counted already
  m.data.resize(m.len);
  unexpected_bytes_ += m.len;
  if (m.len) m.data_req = m.t->irecv(m.from, m.data.data(), m.len, p2ptag::data(m.seq));
}

bool P2p::matchEnvelopes() {
  bool moved = false;
  for (int r = 0; r < id_.nranks; ++r) {
    if (local(r)) continue;
    Peer& p = peers_[static_cast<size_t>(r)];
    // One peer's envelopes arrive in order: only the oldest slot can be next.
    while (!p.slots.empty() && links_.ofi->test(p.slots.front()->req)) {
      const std::unique_ptr<Slot> s = std::move(p.slots.front());
      p.slots.pop_front();
      moved = true;
      const P2pEnvelope env = s->msg.env;
      const bool carried = env.len <= kCarryBytes;
      HC_CHECK(s->got == sizeof env + (carried ? env.len : 0), hcInternalError,
               "p2p: a message of {} bytes from {} whose envelope says {} bytes of data", s->got, id_.who(r), env.len);
      if (P2pOp* op = firstWaiting(ops_, r, static_cast<int>(env.tag))) {
        startRecv(*op, r, env, carried ? s->msg.data : nullptr);
        continue;
      }
      auto m = std::make_unique<P2pMsg>();
      m->from = r;
      m->tag = static_cast<int>(env.tag);
      m->len = env.len;
      m->seq = env.seq;
      if (carried) {
        m->carried = true;
        m->data.assign(s->msg.data, s->msg.data + env.len);
        unexpected_bytes_ += env.len;
      }
      p.unexpected.push_back(std::move(m));
      ++held_;
    }
    // What no receive takes while one waits for this peer is copied aside in arrival order
    // (oldest first, so that a later one of the same tag is never taken before it).
    if (p.unexpected.empty() || !firstWaiting(ops_, r, -1)) continue;
    for (auto& m : p.unexpected) {
      if (m->pulled) continue;
      if (unexpected_bytes_ + m->len > kUnexpectedBytes) break;
      pull(*m);
      moved = true;
    }
  }
  return moved;
}

// Every receive that waits for an envelope from a peer on another node has one posted for it;
// one for any source, to every such peer; none while kUnexpectedEnvelopes from it are held.
void P2p::postSlots() {
  bool any = false;
  for (const auto& op : ops_) any |= op->state == P2pOp::State::Waiting && op->peer < 0;
  for (int r = 0; r < id_.nranks; ++r) {
    if (local(r)) continue;
    Peer& p = peers_[static_cast<size_t>(r)];
    if (p.unexpected.size() >= kUnexpectedEnvelopes) continue;
    size_t need = any ? 1 : 0;
    for (const auto& op : ops_) need += !op->send && op->state == P2pOp::State::Waiting && op->peer == r;
    while (p.slots.size() < need) {
      std::unique_ptr<Slot> s(new Slot);
      s->req = links_.ofi->irecvUpTo(r, &s->msg, sizeof s->msg, p2ptag::kEnvelope, &s->got);
      p.slots.push_back(std::move(s));
    }
  }
}

// Tests one request; a receive's from a local peer closes one of its placed receives.
bool P2p::step(Transport* t, ReqId& r, int from) {
  if (!r || !t->test(r)) return false;
  r = 0;
  if (from >= 0 && t == links_.shm.get()) {
    --peers_[static_cast<size_t>(from)].shm_open;
    --placed_;
  }
  return true;
}

bool P2p::progressUnexpected() {
  bool moved = false;
  for (int r = 0; r < id_.nranks; ++r) {
    for (auto& m : peers_[static_cast<size_t>(r)].unexpected) {
      if (!m->pulled) continue;
      moved |= step(m->t, m->data_req, r);
      moved |= step(m->t, m->ack_req, -1);
    }
  }
  return moved;
}

// Tests op's outstanding requests once; true when something completed.
bool P2p::progressOp(P2pOp& op) {
  bool moved = false;
  if (op.stash) {
    P2pMsg& m = *op.stash;
    moved |= step(m.t, m.data_req, m.from);
    moved |= step(m.t, m.ack_req, -1);
    if (m.data_req || m.ack_req) return moved;
    if (m.len) std::memcpy(op.buf, m.data.data(), m.len);
    op.stash.reset();
    op.state = P2pOp::State::Done;
    return true;
  }
  const int from = op.send ? -1 : op.peer;
  moved |= step(op.t, op.env_req, -1);
  moved |= step(op.t, op.data_req, from);
  moved |= step(op.t, op.ack_req, -1);
  if (op.send && !local(op.peer) && op.ack_req == 0 && op.ack.ok != kAckAgree && op.ack.ok != kAckCopied)
    fail(op, hcInvalidUsage,
         fmt::format("{}: size mismatch: this rank (rank {}) sent {} bytes with tag {} (send), {} expects {} bytes "
                     "(recv)",
                     op.describe(id_), id_.rank, op.len, op.tag, id_.who(op.peer), op.ack.expected));
  if (!op.env_req && !op.data_req && !op.ack_req) op.state = P2pOp::State::Done;
  return moved;
}

bool P2p::progress() {
  bool moved = false;
  if (links_.ofi) {
    moved |= matchEnvelopes();
    postSlots();
  }
  if (links_.shm) {
    // Placed receives that have not seen their message move only when the transport does.
    if (postPlacedForWaiting()) links_.shm->progress();
    moved |= matchAnyLocal();
  }
  moved |= progressUnexpected();
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
    if (op.state != P2pOp::State::Done) {
      ++it;
      continue;
    }
    stats_.countP2p(op.send, op.len);
    it = ops_.erase(it);
  }
  return moved;
}

bool P2p::test(P2pOp& op) {
  P2pOp* ops[] = {&op};
  return testAll(ops, nullptr);
}

std::string P2p::whatOf(Ops ops, const char* what) const {
  if (what) return what;
  return ops.size() == 1 ? ops[0]->describe(id_) : fmt::format("{} operations", ops.size());
}

bool P2p::testAll(Ops ops, const char* what) {
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
    explainAndThrow(e, whatOf(ops, what));
  }
}

void P2p::explainAndThrow(const Error& e, const std::string& what) {
  if (e.symptom()) links_.explainSymptom(250);  // the failure notice of the peer behind it
  throw Error(e.code(), fmt::format("{}: {}", what, e.what()), Error::kFatal);
}

void P2p::checkDeadline(Ops ops, const Deadline& d, const char* what) {
  if (!d.expired()) return;
  std::vector<std::string> late;
  for (const P2pOp* op : ops) {
    if (op->done()) continue;
    std::string s = op->describe(id_);
    const int peer = op->peer >= 0 ? op->peer : -1;
    if (op->state == P2pOp::State::Waiting)
      s += peer >= 0 ? ": no message from it with this tag has arrived"
                     : ": no message with this tag has arrived from any rank";
    else s += op->send ? ": the receiver has not taken it" : ": the data has not all arrived";
    if (peer >= 0 && peer != id_.rank && local(peer))
      s += fmt::format(" (rank {}: {})", peer, links_.shm->peerState(id_.topo.local_of[static_cast<size_t>(peer)]));
    late.push_back(s);
  }
  std::string held;
  if (unexpected_bytes_ > 0)
    held = fmt::format(" ({} bytes of messages no receive has taken are held here, at most {})", unexpected_bytes_,
                       kUnexpectedBytes);
  throw Error(
      hcTimeout,
      fmt::format("timed out after {} ms in {}: {}{}", timeout_ms_, whatOf(ops, what), fmt::join(late, "; "), held),
      Error::kFatal);
}

void P2p::wait(Ops ops, const char* what, const Deadline* dl) {
  const Deadline d = dl ? *dl : Deadline::fromFirstCheck(timeout_ms_);
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
    explainAndThrow(e, whatOf(ops, what));
  }
}

}  // namespace hicoll
