#include "algorithms/run.h"

#include <algorithm>
#include <cstring>

#include "base/copy.h"
#include "base/error.h"

namespace hicoll {

Run::Run(hcComm& c, const CollArgs& args, const CollPlan* p, Agreement* ag)
    : id(c.id), links(c.links), buf(c.buf), stats(c.stats), cfg(c.plan.cfg), timeout_ms(c.health.timeout_ms), a(args),
      plan(p), desc(CallDesc::of(args)), agreement(ag), deadline(Deadline::fromFirstCheck(timeout_ms)),
      esize(typeSize(args.dtype)), shm(*c.links.shm),
      board(*c.links.shm, c.id, deadline, timeout_ms, c.links.peerCheck()), oversubscribed(c.plan.oversubscribed()) {
  const size_t out_bytes = args.count * esize * (args.coll == hcCollAllGather ? static_cast<size_t>(id.nranks) : 1);
  stream_out_ = args.coll != hcCollAllToAll && out_bytes >= static_cast<size_t>(cfg.num(Knob::StreamCopyBytes));
}

Run::~Run() {
  if (!plan) return;
  stats.count({a.coll, plan->path, plan->reason, plan->modelled ? plan->predicted.total() : 0, plan->chunk_bytes,
               plan->net_window, bytes_intra_, bytes_inter_});
}

ReduceSpec Run::reduceSpec(uint64_t premul_mask, bool final_step) const {
  return reduceSpecOf(a, id.nranks, premul_mask, final_step);
}

void Run::post(const void* addr0, int phase_kind, uint64_t flags) {
  phase_kind_ = phase_kind;
  board.post(seq, desc.withFlags(flags).withPhase(phase_kind), addr0);
}

const char* Run::mappedPosted(int local, size_t off, size_t len) {
  const NodeMemRef& ref = board.postedMem(local, seq);
  if (!ref.valid()) return nullptr;
  return shm.mapPeerMemory(local, ref, postedAddr(local) + off, len);
}

void Run::readPosted(int local, size_t off, void* dst, size_t len) {
  if (len == 0) return;
  if (const char* p = mappedPosted(local, off, len)) {
    copyOut(dst, p, len);
    stats.countNodeMemory(a.coll, len);
  } else {
    shm.read(local, postedAddr(local) + off, dst, len);
  }
}

void Run::copyOut(void* dst, const void* src, size_t len) {
  stream_out_ ? copyStreaming(dst, src, len) : static_cast<void>(std::memcpy(dst, src, len));
}

void Run::send(Pending& p, int peer, const void* data, size_t len, uint64_t tag, size_t key, bool payload) {
  Transport& t = links.to(peer);
  if (payload) countBytes(peer, len);
  if (agreement) agreement->stageSend(peer, data, len, tag);
  p.push_back({&t, t.isend(peer, data, len, tag), key, peer});
  track(peer, 1);
}

void Run::recv(Pending& p, int peer, void* data, size_t len, uint64_t tag, size_t key) {
  Transport& t = links.to(peer);
  void* dst = data;
  const size_t payload = len;
  size_t* received = nullptr;
  const int staged = agreement ? agreement->stageRecv(peer, data, len, tag, received) : -1;
  const ReqId req = staged >= 0 ? t.irecvUpTo(peer, data, len, tag, received) : t.irecv(peer, data, len, tag);
  p.push_back({&t, req, key, peer, staged, dst, payload});
  track(peer, 1);
}

void Run::recvUpTo(Pending& p, int peer, void* data, size_t capacity, uint64_t tag, size_t* received, size_t key) {
  Transport& t = links.to(peer);
  p.push_back({&t, t.irecvUpTo(peer, data, capacity, tag, received), key, peer});
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
  if (outstanding_.empty()) outstanding_.assign(static_cast<size_t>(id.nranks), 0);
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
    late.push_back(fmt::format("{} ({}){}", id.who(shm.commRank(l)), shm.peerState(l),
                               behind ? " has not started this phase" : ""));
  }
  std::string messages;
  for (size_t p = 0; p < outstanding_.size(); ++p)
    if (outstanding_[p] > 0) messages += fmt::format("{}{}", messages.empty() ? "" : ", ", id.who(static_cast<int>(p)));
  if (!messages.empty())
    late.push_back(fmt::format("messages with {} have not completed (stopped or slow?)", messages));
  if (agreement)
    for (int p : agreement->missing())
      late.push_back(fmt::format("{} has not sent its descriptor of this call", id.who(p)));
  const std::string msg =
      fmt::format("timed out after {} ms {}{}{}", timeout_ms, what, late.empty() ? "" : ": ", fmt::join(late, "; "));
  // Without a stopped rank in sight, the ranks named may be waiting for one elsewhere: a
  // symptom, which the failure notice of a rank that sees it explains (runHostCollective).
  throw Error(hcTimeout, msg, seen_stopped ? 0u : Error::kSymptom);
}

void Run::idle() {
  links.checkPeers();
  if (agreement) agreement->poll();
}

void Run::waitAll(Pending& p, const char* what) {
  waitUntil(what, [&] {
    if (p.empty()) return Progress::Done;
    return poll(p) > 0 ? Progress::Moved : Progress::Idle;
  });
}

}  // namespace hicoll
