// The node board: what each rank tells the ranks of its node about the phase of a collective it
// runs (its post: the call's descriptor and the region it exposes), how far it got (counters
// of chunks ready, per data stream), and when it finished reading its peers. One board per
// rank, in its shared segment; the protocol is NodeBoard's.
//
// The phase rule, for every phase of every collective: write this rank's segment (scratch,
// sort, board info) only after post() and waitPosted() of every local peer. A peer that posted
// phase s+1 has finished reading phase s, so a phase whose peers read only the segment need not
// wait at its end (finish(peers_read_only_segment)). One exception, the hierarchical
// AllGather's eager staging, writes a scratch half no peer can be reading; and a Broadcast's
// holder publishes before its peers posted. So a peer can be one phase ahead, never two: every
// slot alternates with the phase's parity.
//
// Posts are kept in a ring of kSlots per rank, so that a rank may also end phases before its
// peers posted them (unchecked phases): a small Broadcast on one node (a ring phase) stages
// its data in the root's post slot (or the slot's ring data), and the root returns at once,
// as an MPI root's eager send does; its other ranks wait only for the root. A ring phase
// writes nothing but the rank's post slot. The waits and checks skipped are done by settle():
// all of them at the start of the next phase that is not a ring phase (before it writes
// anything, so such phases keep the rule above), and by every rank in a ring phase s those
// up to phase s - kSlots + 1 before it writes slot s (its peers posted that phase, so they
// finished reading the slot's last phase). So no rank is more than kSlots - 1 phases ahead of another.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/coll.h"
#include "base/deadline.h"
#include "base/identity.h"
#include "transport/shm/node_memory.h"

namespace hicoll {

class ShmTransport;

struct alignas(64) Board {
  static constexpr int kSlots = 256;         // posts kept per rank (a power of two)
  static constexpr size_t kRingBytes = 256;  // a ring phase's data per slot (more: a regular phase)
  struct alignas(64) Post {
    std::atomic<uint64_t> posted{0};  // seq of the phase the fields below describe
    CallDesc desc;                    // the call (and phase): checked against the peers'
    // A small call's staged data (algorithms/node_small.h), in the line the peers poll: one
    // cache-line transfer brings them the post, the descriptor and the data.
    static constexpr size_t kData = 24;
    char data[kData] = {};
    uint64_t addr[2] = {};  // regions exposed to the node, in the owner's address space
    NodeMemRef mem;         // the node memory (hcMemAlloc) holding addr[0], if any
  };
  Post post[kSlots];
  static_assert(offsetof(Post, addr) == 64, "the polled line holds the post, the descriptor and the data");
  static uint64_t slot(uint64_t seq) { return seq & (kSlots - 1); }
  // A ring phase's data longer than Post::kData, per slot. Not written at creation (the
  // segment's pages read as zero and cost nothing until a ring phase writes its slot, which it
  // does before any peer reads it): an idle communicator does not pay for the ring. The first
  // such phase maps it whole (ShmTransport::mapBoardRing), not a page per 16 calls.
  alignas(64) char ring[kSlots][kRingBytes];
  // (seq << 24) | chunks ready, per phase parity and stream of data a collective publishes.
  struct alignas(64) Counter {
    std::atomic<uint64_t> v{0};
  };
  Counter ready[2][2];
  alignas(64) std::atomic<uint64_t> done{0};  // last seq whose reads of peers this rank finished
};

// The phases [from, to] this rank ended without waiting for every local peer's post: their
// posts are still to be waited for and checked (NodeBoard::settle). from 0: none.
struct UncheckedPhases {
  uint64_t from = 0, to = 0;
  void add(uint64_t seq) {
    if (!from) from = seq;
    to = seq;
  }
};

// What a wait calls on every idle pass (it throws when a rank this one depends on is gone): a
// function and its argument, not a std::function, whose construction on every small call
// stalled its entry (a store forwarded to a wider load). The callable outlives the board.
struct PeerCheck {
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
  void operator()() const { fn(arg); }
  template <class F>
  static PeerCheck of(F& f) {
    static_assert(!std::is_const_v<F>);
    return {[](void* a) { (*static_cast<F*>(a))(); }, &f};
  }
};

// The lines of a local peer's scratch buffer that a wait for its post reads next (a small
// call's staged data, algorithms/node_small.h): [offset, offset + len) of every peer's. Every
// pass of the wait prefetches them, so they cross to this core with the post instead of one
// transfer after it: between cores on different dies or sockets a transfer costs more than a
// small call's own work (perf/README.md, "Small calls on one node").
struct PeerLines {
  // Prefetched per peer and pass at most: more lines, still being written by the peer, bounce
  // between the two cores and slow the larger calls down (perf/results/2026-12-05-zen2.md).
  static constexpr size_t kMaxBytes = 512;
  size_t offset = 0, len = 0;
};

class NodeBoard {
 public:
  // The protocol's waits run until `deadline` (of timeout_ms, for messages), with
  // check_peers() on every idle pass, and name ranks by id.
  NodeBoard(ShmTransport& shm, const Identity& id, const Deadline& deadline, long timeout_ms, PeerCheck check_peers)
      : shm_(shm), id_(id), deadline_(deadline), timeout_ms_(timeout_ms), check_peers_(check_peers) {}

  // ---- the protocol ----
  // This rank's post of phase seq: desc (the call, its phase kind and flags) and the region it
  // exposes to the node.
  void post(uint64_t seq, const CallDesc& desc, const void* addr0);
  // Waits until local peer `local` posted phase seq; its call must be `mine` (this rank's call
  // with the phase kind, without flags), else an error naming both (hcInvalidUsage;
  // hcRemoteError when the peer rejected its own arguments or destroyed its communicator).
  // Collecting (a rejected call's round): returns whether the peer's call was valid instead.
  // later_ok: a slot that holds a later phase ends the wait (settle()).
  // lines: prefetched while waiting (PeerLines).
  bool waitPosted(int local, uint64_t seq, const CallDesc& mine, bool collect = false, bool later_ok = false,
                  PeerLines lines = {});
  // This rank's own post of phase seq (its descriptor), while still in its slot.
  const Board::Post& own(uint64_t seq) const;
  void waitAllPosted(uint64_t seq, const CallDesc& mine, PeerLines lines = {});
  // The waits and checks of this rank's unchecked phases up to `upto` (then dropped from u),
  // against this rank's own posts of them. A disagreement or a peer that never arrives is an
  // error here, naming that earlier call. A peer's slot that holds a later phase is skipped:
  // the peer passed that phase, having checked it against the root it waited for, and a
  // phase with two roots is found by whichever of them settles it first (both post it).
  // Then, without waiting, those up to then_posted that every peer has posted (a ring
  // phase's root checks a run of them at once, the misses of their lines overlapping).
  // wait false (hcCommDestroy): checks what the peers posted and fails for one that destroyed
  // its communicator without posting, but waits for none (a slow peer checks the call
  // itself, and a dead one is no error of this rank's destroy).
  void settle(UncheckedPhases& u, uint64_t upto = ~0ull, uint64_t then_posted = 0, bool wait = true);
  // Whether local peer `local` posted phase seq with exactly this rank's descriptor (settle's
  // common case, checked without the wait's machinery; anything else takes waitPosted).
  bool postedSame(int local, uint64_t seq, const CallDesc& mine) const;
  // Node memory (hcMemAlloc): did every rank of the node post a region in it this phase? Then
  // each reads the others' regions with memcpy from its mapping of them, no single-copy reads
  // (CMA) needed. Every rank sees the same posts, so all decide alike.
  bool allPostedNodeMemory(uint64_t seq) const;
  // done=seq, then wait until every local peer is done: they may be reading this rank's user
  // buffers. peers_read_only_segment: they read only its segment, which the phase rule
  // protects, so it returns at once (one cross-core round trip less per small call).
  void finish(uint64_t seq, bool peers_read_only_segment);

  // ---- the slots ----
  // The seq local peer `local` last posted in phase seq's slot (>= seq once it posted it), and
  // what it posted there.
  uint64_t postedSeq(int local, uint64_t seq) const;
  CallDesc postedDesc(int local, uint64_t seq) const;
  const char* postedAddr(int local, uint64_t seq) const;
  const NodeMemRef& postedMem(int local, uint64_t seq) const;
  // Chunks of stream ready in phase seq: this rank's to publish, a peer's to read (0 before
  // the peer reached the phase).
  void publish(uint64_t seq, int stream, uint64_t chunks);
  uint64_t readyOf(int local, uint64_t seq, int stream) const;
  // This rank finished reading its peers in phase seq; has the peer?
  void done(uint64_t seq);
  bool peerDone(int local, uint64_t seq) const;

 private:
  ShmTransport& shm_;
  const Identity& id_;
  const Deadline& deadline_;
  long timeout_ms_;
  PeerCheck check_peers_;
};

}  // namespace hicoll
