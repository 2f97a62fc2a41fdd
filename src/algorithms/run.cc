#include "algorithms/run.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace hicoll {

Run::Run(hcComm& c, const CollArgs& args, const CollPlan* p, Agreement* ag)
    : comm(c), a(args), plan(p), desc(CallDesc::of(args)), agreement(ag), deadline(c.timeoutMs()),
      esize(hcTypeSize(args.dtype)), shm(*c.shm), board(*c.shm) {}

ReduceSpec Run::reduceSpec(uint64_t premul_mask, bool final_step) const {
  ReduceSpec s;
  s.dtype = a.dtype;
  s.kind = a.op.kind;
  s.scalar = a.op.scalar;
  s.premul_mask = premul_mask;
  s.avg_divisor = final_step && a.op.kind == OpKind::Avg ? comm.nranks : 0;
  return s;
}

void Run::post(const void* addr0, int phase_kind, uint64_t flags) {
  phase_kind_ = phase_kind;
  board.post(seq, CallDesc::of(a, flags).withPhase(phase_kind), addr0);
}

bool Run::waitPosted(int local, bool collect) {
  const int peer = shm.commRank(local);
  Backoff backoff;
  while (board.postedSeq(local, seq) < seq) {
    backoff.pause();
    comm.checkPeers();
    if (board.postedSeq(local, seq) >= seq) break;
    // A peer that destroyed its communicator makes no more calls.
    if (shm.closed(local)) {
      const std::string why = shm.failed(local) ? shm.reason(local) : "";
      HC_THROW(hcRemoteError, "{} destroyed its communicator without calling {}{}", comm.who(peer), describeCall(desc),
               why.empty() ? "" : fmt::format(" (it had failed: {})", why));
    }
    if (deadline.expired())
      HC_THROW(hcTimeout, "timed out after {} ms: {} has not started this call ({}){}", comm.timeoutMs(),
               comm.who(peer), shm.peerState(local),
               shm.stopped(local) ? "" : " (slow, stopped, or it called fewer collectives)");
  }
  HC_CHECK(board.postedSeq(local, seq) == seq, hcInternalError, "shm: {} is ahead of this phase", comm.who(peer));
  const CallDesc theirs = board.postedDesc(local, seq);
  const CallDesc mine = desc.withPhase(phase_kind_);
  if (theirs.invalid()) {
    if (collect || desc.invalid()) return false;
    const std::string why = shm.reason(local);
    HC_THROW(hcRemoteError, "{} rejected its arguments of {}{}{}", comm.who(peer), describeCall(theirs),
             why.empty() ? "" : ": ", why);
  }
  if (collect) return true;
  if (!theirs.sameCall(mine) && ((theirs.flags() ^ mine.flags()) & CallDesc::kDestroy))
    HC_THROW(hcRemoteError, "{} {}", comm.who(peer),
             theirs.flags() & CallDesc::kDestroy
                 ? fmt::format("destroyed its communicator while rank {} called {}", comm.rank, describeCall(mine))
                 : fmt::format("called {} while this rank destroys its communicator", describeCall(theirs)));
  if (!theirs.sameCall(mine))
    HC_THROW(hcInvalidUsage, "{}", callMismatch(comm.who(peer), theirs, comm.rank, mine));
  HC_CHECK(theirs.w[0] == mine.w[0], hcInternalError, "shm: {} is in another phase ({:#x} vs {:#x}) of {}",
           comm.who(peer), theirs.w[0] >> 28 & 0xf, mine.w[0] >> 28 & 0xf, describeCall(mine));
  return true;
}

void Run::waitAllPosted() {
  for (int l = 0; l < shm.localSize(); ++l)
    if (l != shm.localIndex()) waitPosted(l);
}

bool Run::allPostedNodeMemory() const {
  for (int l = 0; l < shm.localSize(); ++l)
    if (!board.postedMem(l, seq).valid()) return false;
  return true;
}

const char* Run::mappedPosted(int local, size_t off, size_t len) {
  const NodeMemRef& ref = board.postedMem(local, seq);
  if (!ref.valid()) return nullptr;
  return shm.mapPeerMemory(local, ref, postedAddr(local) + off, len);
}

void Run::readPosted(int local, size_t off, void* dst, size_t len) {
  if (len == 0) return;
  if (const char* p = mappedPosted(local, off, len)) {
    std::memcpy(dst, p, len);
    comm.countNodeMemory(a.coll, len);
  } else {
    shm.read(local, postedAddr(local) + off, dst, len);
  }
}

void Run::waitPeersDone() {
  for (int l = 0; l < shm.localSize(); ++l) {
    if (l == shm.localIndex()) continue;
    shm.waitFor([&] { return board.peerDone(l, seq); }, deadline, "waiting for local peers to finish reading", l);
  }
}

void Run::finishNode(bool peers_read_only_segment) {
  board.done(seq);
  if (!peers_read_only_segment) waitPeersDone();
}

void Run::send(Pending& p, int peer, const void* buf, size_t len, uint64_t tag, size_t key, bool payload) {
  Transport& t = comm.transportTo(peer);
  if (payload) comm.countBytes(a.coll, peer, len);
  if (agreement) agreement->stageSend(peer, buf, len, tag);
  p.push_back({&t, t.isend(peer, buf, len, tag), key, peer});
  track(peer, 1);
}

void Run::recv(Pending& p, int peer, void* buf, size_t len, uint64_t tag, size_t key) {
  Transport& t = comm.transportTo(peer);
  void* dst = buf;
  const size_t payload = len;
  size_t* received = nullptr;
  const int staged = agreement ? agreement->stageRecv(peer, buf, len, tag, received) : -1;
  const ReqId id = staged >= 0 ? t.irecvUpTo(peer, buf, len, tag, received) : t.irecv(peer, buf, len, tag);
  p.push_back({&t, id, key, peer, staged, dst, payload});
  track(peer, 1);
}

void Run::recvUpTo(Pending& p, int peer, void* buf, size_t capacity, uint64_t tag, size_t* received, size_t key) {
  Transport& t = comm.transportTo(peer);
  p.push_back({&t, t.irecvUpTo(peer, buf, capacity, tag, received), key, peer});
  track(peer, 1);
}

bool Run::test(Req& r) {
  if (r.staged < 0) return r.t->test(r.id);
  bool done = false;
  try {
    done = r.t->test(r.id);
  } catch (const Error& e) {
    if (e.code() != hcInvalidUsage) throw;
    agreement->failed(r.staged);  // throws the disagreement, if the truncated message shows it
    // It did not (the provider dropped the message): the peer, which got this rank's shorter
    // one, sees the difference and says so in its failure notice, which the caller waits for.
    throw Error(e.code(), e.what(), Error::kSymptom);
  }
  if (done) agreement->landed(r.staged, r.dst, r.len);
  return done;
}

void Run::track(int peer, int delta) {
  if (outstanding_.empty()) outstanding_.assign(static_cast<size_t>(comm.nranks), 0);
  outstanding_[static_cast<size_t>(peer)] += delta;
}

void Run::checkDeadline(const char* what) {
  if (!deadline.expired()) return;
  // Who has not arrived: local peers that are stopped or have not posted this phase (with the
  // call their board shows), ranks whose messages have not completed, agreement peers whose
  // descriptor has not come.
  std::vector<std::string> late;
  bool seen_stopped = false;
  for (int l = 0; l < shm.localSize(); ++l) {
    if (l == shm.localIndex()) continue;
    const bool halted = shm.stopped(l), behind = seq > 0 && board.postedSeq(l, seq) < seq;
    if (!halted && !behind) continue;
    seen_stopped |= halted;
    late.push_back(fmt::format("{} ({}){}", comm.who(shm.commRank(l)), shm.peerState(l),
                               behind ? " has not started this phase" : ""));
  }
  std::string messages;
  for (size_t p = 0; p < outstanding_.size(); ++p)
    if (outstanding_[p] > 0)
      messages += fmt::format("{}{}", messages.empty() ? "" : ", ", comm.who(static_cast<int>(p)));
  if (!messages.empty())
    late.push_back(fmt::format("messages with {} have not completed (stopped or slow?)", messages));
  if (agreement)
    for (int p : agreement->missing())
      late.push_back(fmt::format("{} has not sent its descriptor of this call", comm.who(p)));
  const std::string msg = fmt::format("timed out after {} ms {}{}{}", comm.timeoutMs(), what, late.empty() ? "" : ": ",
                                      fmt::join(late, "; "));
  // Without a stopped rank in sight, the ranks named may be waiting for one elsewhere: a
  // symptom, which the failure notice of a rank that sees it explains (runHostCollective).
  throw Error(hcTimeout, msg, seen_stopped ? 0u : Error::kSymptom);
}

void Run::idle(bool moved, Backoff& backoff, const char* what) {
  if (moved) {
    backoff.reset();
    return;
  }
  comm.checkPeers();
  if (agreement) agreement->poll();
  checkDeadline(what);
  backoff.pause();
}

void Run::waitAll(Pending& p, const char* what) {
  Backoff backoff;
  while (!p.empty()) idle(poll(p) > 0, backoff, what);
}

}  // namespace hicoll
