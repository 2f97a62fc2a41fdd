// Small calls on one node: every rank copies its input into the half of its scratch buffer
// that the phase's parity owns before it posts (the eager rule, transport/shm/board.h), so a
// peer's input is readable as soon as the peer posted: one exchange of posts, no wait at the
// end. The steps here are the only definition of that layout; the general path's small
// branches (Run) and the lean entry (runNodeSmall) both use them, so ranks that took different
// entries for the same call still read each other right.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "algorithms/reduce.h"
#include "base/coll.h"
#include "base/config.h"
#include "base/copy.h"
#include "base/identity.h"
#include "base/topology.h"
#include "transport/shm/board.h"
#include "transport/shm/shm_transport.h"

struct hcComm;

namespace hicoll {

struct CollPlan;

// One staged phase: where each local rank's staged data lies. Up to Board::Post::kData bytes
// on one node: in the rank's post of the phase (the line its peers poll), else in the half of
// its scratch buffer of the phase's parity. bytes: what the call stages per rank, alike on
// every rank, so all agree on the place.
// ring: a ring phase's (board.h), whose data up to Board::kRingBytes lies in the slot's ring
// data instead of the scratch buffer.
struct Staged {
  Staged(ShmTransport& s, uint64_t phase_seq, size_t scratch_half, size_t bytes, bool one_node, bool ring = false)
      : shm(s), seq(phase_seq), half(scratch_half), in_post(one_node && bytes <= Board::Post::kData), in_ring(ring) {}
  ShmTransport& shm;
  uint64_t seq;  // the phase's
  size_t half;   // bytes of a scratch half
  bool in_post, in_ring;
  char* mine() const { return at(shm.localIndex()); }
  const char* of(int local) const { return at(local); }
  // [off, off + len) of each peer's staged data, for a wait to prefetch (none in the post: it
  // comes with it).
  PeerLines lines(size_t off, size_t len) const {
    if (in_post || in_ring) return {};
    return {(seq & 1) * half + off, len};
  }

 private:
  char* at(int local) const {
    Board& b = shm.board(local);
    if (in_post) return b.post[Board::slot(seq)].data;
    if (in_ring) return b.ring[Board::slot(seq)];
    return shm.scratch(local) + (seq & 1) * half;
  }
};

// Whether a call stages on one node: a block (AllGather, ReduceScatter: per rank) or buffer
// (AllReduce, Broadcast) of `bytes`, with L local ranks.
inline bool stagesAllGather(size_t block, size_t half, const Config& cfg) {
  return block <= static_cast<size_t>(cfg.num(Knob::ShmEagerBytes)) && block <= half;
}
inline bool stagesReduceScatter(size_t block, int L, size_t half, const Config& cfg) {
  return block <= static_cast<size_t>(cfg.num(Knob::ShmEagerBytes)) && static_cast<size_t>(L) * block <= half;
}
inline bool stagesAllReduce(size_t bytes, size_t half) {
  return bytes <= half;
}
// A Broadcast's one staged copy serves every peer (an AllGather stages a copy per rank), and
// below 2 x HICOLL_SHM_EAGER_BYTES its peers' single-copy reads and the wait for them cost more
// than the copies. Above that, staging crosses each line between the cores twice (into the
// root's segment, then out) where a peer's read of the root's buffer crosses it once, which
// wins on cores far apart. Staging pays where the host's ranks outnumber its cores (the root
// that does not wait frees a core for them), up to 16 x HICOLL_SHM_EAGER_BYTES
// (perf/results/2026-12-05-zen2.md). oversubscribed: PlanState::oversubscribed().
inline bool stagesBroadcast(size_t bytes, size_t half, const Config& cfg, bool oversubscribed) {
  return bytes <= half && bytes <= (oversubscribed ? 16 : 2) * static_cast<size_t>(cfg.num(Knob::ShmEagerBytes));
}

// Before the post: what each stages. After every local peer posted: what each reads; the
// reading steps return the payload bytes read from peers (the statistics' intra-node bytes).
// AllGather: len bytes of this rank's block at `in`; rank r's bytes go to out + r * stride.
inline void stageAllGather(const Staged& s, const void* in, size_t len) {
  std::memcpy(s.mine(), in, len);
}
size_t readAllGather(const Staged& s, const Topology& t, const void* in, char* out, size_t stride, size_t len);
// ReduceScatter: every other local rank's block of this rank's input (count elements each).
void stageReduceScatter(const Staged& s, const Topology& t, const char* in, size_t b);
size_t sumReduceScatter(const Staged& s, const Topology& t, const ReduceSpec& spec, const char* in, void* out,
                        size_t count, size_t esize);
// AllReduce: the whole buffer; every rank sums the staged copies in rank order.
inline void stageAllReduce(const Staged& s, const void* send, size_t bytes) {
  std::memcpy(s.mine(), send, bytes);
}
size_t sumAllReduce(const Staged& s, const Topology& t, const ReduceSpec& spec, const void* send, void* recv,
                    size_t count, size_t esize);
// Broadcast from local rank root_local: the root stages; every other rank copies.
inline void stageBroadcast(const Staged& s, const void* send, size_t bytes) {
  std::memcpy(s.mine(), send, bytes);
}
size_t readBroadcast(const Staged& s, bool is_root, int root_local, const void* send, void* recv, size_t bytes);
// Whether a staged Broadcast's root returns without waiting for its peers to post (they read
// only its staged copy): an unchecked phase (transport/shm/board.h), whose checks fail a later
// call instead. Else (HICOLL_BCAST_ROOT_WAITS) it waits, as every peer does for the root.
inline bool rootLeavesUnchecked(bool is_root, const Config& cfg) {
  return is_root && !cfg.flag(Knob::BcastRootWaits);
}
// Whether a Broadcast of `bytes` on one node runs as a ring phase (board.h): its root neither
// waits for its peers nor reads their posts but every kSlots-th phase's, so a run of them
// flows like MPI's eager sends.
inline bool ringBroadcast(size_t bytes, const Config& cfg) {
  return bytes <= Board::kRingBytes && !cfg.flag(Knob::BcastRootWaits);
}
// AllToAll (alltoall.cc): in the half of its scratch the phase's parity owns, each rank keeps
// a slot per local rank l: what it sends l (AllToAllPair), then, when it is at most
// HICOLL_SHM_EAGER_BYTES, the block itself (the peer's one read takes both, in one line for
// the smallest). When the node's slots fit the half (stagesAllToAll, alike on every rank),
// every such block is staged: a rank knows from the counts alone that its peers staged its
// blocks. Otherwise the slots hold the pairs alone.
struct AllToAllPair {  // what a rank tells a peer, in bytes (also the first message across nodes)
  uint64_t sends, from, expects;
  uint64_t staged;  // local pairs: the block's offset in the sender's scratch, or kNotStaged
};
static_assert(sizeof(AllToAllPair) == 32, "wire layout");
constexpr uint64_t kNotStaged = ~uint64_t{0};
inline size_t allToAllStagedSlot(size_t eager) {
  return (sizeof(AllToAllPair) + eager + 63) & ~size_t{63};
}
inline bool stagesAllToAll(int L, size_t half, size_t eager) {
  return static_cast<size_t>(L) * allToAllStagedSlot(eager) <= half;
}
// Bytes per slot; where rank `owner`'s slot for local rank l lies (phase half at base).
inline size_t allToAllSlot(int L, size_t half, size_t eager) {
  return stagesAllToAll(L, half, eager) ? allToAllStagedSlot(eager) : 64;
}
inline const AllToAllPair& allToAllPair(ShmTransport& shm, int owner, size_t base, size_t slot, int l) {
  return *reinterpret_cast<const AllToAllPair*>(shm.scratch(owner) + base + static_cast<size_t>(l) * slot);
}
// Per communicator rank, in bytes: where its block starts in the send and the receive buffer,
// and how long each is (the arrays hold nranks).
void allToAllLayout(const CollArgs& a, size_t esize, size_t* send_off, size_t* recv_off, size_t* send_len,
                    size_t* recv_len, int nranks);
// Writes this rank's slots into its half at `base` of its scratch, staging its blocks where
// they may be (above). Per communicator rank: where its block starts in `in` and how long it is (bytes),
// what this rank expects from it.
void stageAllToAll(ShmTransport& shm, size_t base, size_t half, size_t eager, const char* in, const size_t* send_off,
                   const size_t* send_len, const size_t* recv_len);
// A peer's word on the pair (its slot for this rank, or its first message across nodes)
// against this rank's: a pair whose counts differ fails naming both ways.
void checkAllToAllPair(const Identity& id, int peer, const AllToAllPair& h, size_t sends_to_peer,
                       size_t expects_from_peer, size_t esize);

// A ring phase: this rank's own phase number from *seq (advanced), its unchecked phases in u.
// Returns the bytes read from the root.
size_t runRingBroadcast(ShmTransport& shm, NodeBoard& board, const Identity& id, uint64_t& seq, UncheckedPhases& u,
                        const CallDesc& desc, int root, const void* send, void* recv, size_t bytes);

// The lean entry: a host call on one node that its memoised plan sends down the hierarchical
// path and that stages (AllGather, ReduceScatter, AllReduce, Broadcast), or an AllToAll whose
// blocks both ways are all staged, runs here, without the general path's plan copy, agreement
// and Run: the same board protocol (descriptor checks, deadline, peer checks), the same steps,
// the same statistics. Returns false, having done nothing, for any other call (the general
// path plans and runs it).
bool runNodeSmall(hcComm& c, const CollArgs& a);

// hcCommDestroy: the checks of this rank's unchecked phases (small Broadcasts on one node)
// against what its peers posted, without waiting for them; an error names the Broadcast.
void settleUnchecked(hcComm& c);

}  // namespace hicoll
