#include "transport/shm/board.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/copy.h"
#include "base/error.h"
#include "transport/shm/shm_transport.h"

namespace hicoll {

bool NodeBoard::waitPosted(int local, uint64_t seq, const CallDesc& mine, bool collect, bool later_ok,
                           PeerLines lines) {
  const int peer = shm_.commRank(local);
  auto posted = [&] { return postedSeq(local, seq) >= seq; };
  waitUntil(
      [&] {
        if (lines.len) prefetchLines(shm_.scratch(local) + lines.offset, std::min(lines.len, PeerLines::kMaxBytes));
        return posted();
      },
      deadline_,
      [&] {
        check_peers_();
        // A peer that destroyed its communicator makes no more calls. Closed is read first: a
        // peer may post this call, finish it and close between two reads (a rank preempted on
        // an oversubscribed host), and what it posted before closing is seen after.
        if (shm_.closed(local) && !posted()) {
          const std::string why = shm_.failed(local) ? shm_.reason(local) : "";
          HC_THROW(hcRemoteError, "{} destroyed its communicator without calling {}{}", id_.who(peer),
                   describeCall(mine), why.empty() ? "" : fmt::format(" (it had failed: {})", why));
        }
      },
      [&] {
        if (posted()) return;
        HC_THROW(hcTimeout, "timed out after {} ms: {} has not started this call ({}){}", timeout_ms_, id_.who(peer),
                 shm_.peerState(local), shm_.stopped(local) ? "" : " (slow, stopped, or it called fewer collectives)");
      });
  // later_ok: a later phase in the slot, or one being written there (post() clears it first).
  const uint64_t now = postedSeq(local, seq);
  if (later_ok && now != seq) return true;
  HC_CHECK(now == seq, hcInternalError, "shm: {} is ahead of this phase", id_.who(peer));
  const CallDesc theirs = postedDesc(local, seq);
  if (later_ok) {  // the peer may be writing a later phase into the slot (post()): read again
    std::atomic_thread_fence(std::memory_order_acquire);
    if (shm_.board(local).post[Board::slot(seq)].posted.load(std::memory_order_relaxed) != seq) return true;
  }
  if (theirs.invalid()) {
    if (collect || mine.invalid()) return false;
    const std::string why = shm_.reason(local);
    HC_THROW(hcRemoteError, "{} rejected its arguments of {}{}{}", id_.who(peer), describeCall(theirs),
             why.empty() ? "" : ": ", why);
  }
  if (collect) return true;
  if (!theirs.sameCall(mine) && ((theirs.flags() ^ mine.flags()) & CallDesc::kDestroy))
    HC_THROW(hcRemoteError, "{} {}", id_.who(peer),
             theirs.flags() & CallDesc::kDestroy
                 ? fmt::format("destroyed its communicator while rank {} called {}", id_.rank, describeCall(mine))
                 : fmt::format("called {} while this rank destroys its communicator", describeCall(theirs)));
  if (!theirs.sameCall(mine)) HC_THROW(hcInvalidUsage, "{}", callMismatch(id_.who(peer), theirs, id_.rank, mine));
  HC_CHECK(theirs.w[0] == mine.w[0], hcInternalError, "shm: {} is in another phase ({:#x} vs {:#x}) of {}",
           id_.who(peer), theirs.w[0] >> 28 & 0xf, mine.w[0] >> 28 & 0xf, describeCall(mine));
  return true;
}

void NodeBoard::waitAllPosted(uint64_t seq, const CallDesc& mine, PeerLines lines) {
  for (int l = 0; l < shm_.localSize(); ++l)
    if (l != shm_.localIndex()) waitPosted(l, seq, mine, false, false, lines);
}

void NodeBoard::settle(UncheckedPhases& u, uint64_t upto, uint64_t then_posted, bool wait) {
  auto allPosted = [&](uint64_t q) {
    for (int l = 0; l < shm_.localSize(); ++l)
      if (l != shm_.localIndex() && postedSeq(l, q) < q) return false;
    return true;
  };
  for (; u.from && (u.from <= upto || (u.from <= then_posted && allPosted(u.from)));
       u.from = u.from < u.to ? u.from + 1 : 0) {
    const uint64_t q = u.from;
    const Board::Post& mine = own(q);
    // Phases older than the ring were checked by the peers that waited for them.
    if (mine.posted.load(std::memory_order_relaxed) != q) continue;
    const CallDesc desc = mine.desc;
    try {
      for (int l = 0; l < shm_.localSize(); ++l) {
        if (l == shm_.localIndex() || postedSame(l, q, desc)) continue;
        const bool closed = shm_.closed(l);  // first, as in waitPosted
        if (wait || postedSeq(l, q) >= q) waitPosted(l, q, desc, /*collect=*/false, /*later_ok=*/true);
        else if (closed)
          HC_THROW(hcRemoteError, "{} destroyed its communicator without calling {}", id_.who(shm_.commRank(l)),
                   describeCall(desc));
      }
    } catch (const Error& e) {
      u = {};
      throw Error(e.code(),
                  fmt::format("this rank's earlier call, {}, which returned before its peers started it "
                              "(a small Broadcast on one node): {}",
                              describeCall(desc), e.what()),
                  Error::kFatal | (e.symptom() ? Error::kSymptom : 0u));
    }
  }
}

bool NodeBoard::postedSame(int local, uint64_t seq, const CallDesc& mine) const {
  const Board::Post& p = shm_.board(local).post[Board::slot(seq)];
  if (p.posted.load(std::memory_order_acquire) != seq) return false;
  const CallDesc theirs = p.desc;
  std::atomic_thread_fence(std::memory_order_acquire);  // a later post() into the slot clears posted first
  return p.posted.load(std::memory_order_relaxed) == seq && std::memcmp(theirs.w, mine.w, sizeof mine.w) == 0;
}

const Board::Post& NodeBoard::own(uint64_t seq) const {
  return shm_.board(shm_.localIndex()).post[Board::slot(seq)];
}

bool NodeBoard::allPostedNodeMemory(uint64_t seq) const {
  for (int l = 0; l < shm_.localSize(); ++l)
    if (!postedMem(l, seq).valid()) return false;
  return true;
}

void NodeBoard::finish(uint64_t seq, bool peers_read_only_segment) {
  done(seq);
  if (peers_read_only_segment) return;
  for (int l = 0; l < shm_.localSize(); ++l) {
    if (l == shm_.localIndex()) continue;
    shm_.waitFor([&] { return peerDone(l, seq); }, deadline_, "waiting for local peers to finish reading", l);
  }
}

void NodeBoard::post(uint64_t seq, const CallDesc& desc, const void* addr0) {
  Board::Post& b = shm_.board(shm_.localIndex()).post[Board::slot(seq)];
  // The slot's last phase is over for every peer (board.h), but a late check of it may still
  // read it (settle()): it sees the slot change, never a mix of two phases.
  b.posted.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  b.desc = desc;
  b.addr[0] = reinterpret_cast<uint64_t>(addr0);
  b.mem = addr0 ? nodeMemFind(addr0) : NodeMemRef{};
  b.posted.store(seq, std::memory_order_release);
}

const NodeMemRef& NodeBoard::postedMem(int local, uint64_t seq) const {
  return shm_.board(local).post[Board::slot(seq)].mem;
}

uint64_t NodeBoard::postedSeq(int local, uint64_t seq) const {
  return shm_.board(local).post[Board::slot(seq)].posted.load(std::memory_order_acquire);
}

CallDesc NodeBoard::postedDesc(int local, uint64_t seq) const {
  return shm_.board(local).post[Board::slot(seq)].desc;
}

const char* NodeBoard::postedAddr(int local, uint64_t seq) const {
  return reinterpret_cast<const char*>(shm_.board(local).post[Board::slot(seq)].addr[0]);
}

void NodeBoard::publish(uint64_t seq, int stream, uint64_t chunks) {
  shm_.board(shm_.localIndex()).ready[seq & 1][stream].v.store((seq << 24) | chunks, std::memory_order_release);
}

uint64_t NodeBoard::readyOf(int local, uint64_t seq, int stream) const {
  const uint64_t v = shm_.board(local).ready[seq & 1][stream].v.load(std::memory_order_acquire);
  return (v >> 24) == (seq & ((1ull << 40) - 1)) ? (v & 0xffffff) : 0;
}

void NodeBoard::done(uint64_t seq) {
  shm_.board(shm_.localIndex()).done.store(seq, std::memory_order_release);
}

bool NodeBoard::peerDone(int local, uint64_t seq) const {
  return shm_.board(local).done.load(std::memory_order_acquire) >= seq;
}

}  // namespace hicoll
