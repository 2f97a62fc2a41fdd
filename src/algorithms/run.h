// What a running host collective needs: the communicator, a deadline, tags, the node board
// protocol (post, wait for peers, publish progress, finish together) and request waiting
// across transports.
#pragma once

#include <utility>
#include <vector>

#include "algorithms/agree.h"
#include "algorithms/reduce.h"
#include "core/comm.h"
#include "plan/plan.h"
#include "transport/shm/shm_transport.h"
#include "transport/transport.h"

namespace hicoll {

struct Run {
  // plan: the call's (null for a call that only takes part in an agreement).
  Run(hcComm& c, const CollArgs& args, const CollPlan* plan, Agreement* agreement = nullptr);

  hcComm& comm;
  const CollArgs& a;
  const CollPlan* plan;
  const CallDesc desc;     // of a: what the node board carries
  Agreement* agreement;    // the call's remote agreement, checked while waiting (may be null)
  Deadline deadline;
  size_t esize;
  ShmTransport& shm;
  NodeBoard board;
  uint64_t seq = 0;  // of the current phase (one collective may run several)

  // Starts a phase: a fresh sequence number for tags and the board.
  // Rule for every phase: write this rank's segment (scratch, sort, board info) only after
  // post() and waitPosted() of every local peer. A peer that posted phase s+1 has finished
  // reading phase s, so a phase whose peers read only the segment need not wait at its end.
  // (One exception, hierAllGather's eager staging, writes a scratch half no peer can be
  // reading; and Broadcast's holder publishes before its peers posted. So a peer can be one
  // phase ahead, never two: the board's post and ready slots alternate with the phase.)
  void beginPhase() { seq = ++comm.seq; }
  // Tags: phase sequence, step, chunk.
  uint64_t tag(unsigned step, unsigned chunk) const {
    return ((seq & 0xffffffffull) << 28) | (static_cast<uint64_t>(step & 0xff) << 20) | (chunk & 0xfffff);
  }
  ReduceSpec reduceSpec(uint64_t premul_mask, bool final_step) const;
  // The plan's chunking (CollPlan::chunk_bytes, net_window).
  size_t chunkBytes() const { return plan->chunk_bytes; }
  size_t netWindow() const { return plan->net_window; }

  // Node board protocol. Every phase posts and waits for every local peer's post (which also
  // keeps any rank from running two phases ahead of a peer).
  void post(const void* addr0, int phase_kind, uint64_t flags = 0);  // desc + addr[0], then posted=seq
  // Waits until the peer posted this phase; its call must be this rank's, else an error naming
  // both (hcInvalidUsage; hcRemoteError when the peer rejected its own arguments). Collecting
  // (a rejected call's round): returns whether the peer's call was valid instead of throwing.
  bool waitPosted(int local, bool collect = false);
  void waitAllPosted();
  const char* postedAddr(int local) const { return board.postedAddr(local, seq); }  // its addr0 of this phase
  // Node memory (hcMemAlloc): did every rank of the node post a region in it this phase? Then
  // each reads the others' regions with memcpy from its mapping of them (readPosted), no
  // single-copy reads (CMA) needed. Every rank sees the same posts, so all decide alike.
  bool allPostedNodeMemory() const;
  // Peer l's posted region [off, off + len) as mapped here (node memory), or null.
  const char* mappedPosted(int local, size_t off, size_t len);
  // One copy of the peer's posted region [off, off + len) into dst: memcpy from node memory,
  // else the transport's single-copy read.
  void readPosted(int local, size_t off, void* dst, size_t len);
  void publish(int stream, uint64_t chunks) { board.publish(seq, stream, chunks); }
  uint64_t readyOf(int local, int stream) const { return board.readyOf(local, seq, stream); }
  // done=seq, then wait until every local peer is done: they may be reading this rank's user
  // buffers. peers_read_only_segment: they read only its segment, which the rule above
  // protects, so the caller returns at once (one cross-core round trip less per small call).
  void finishNode(bool peers_read_only_segment = false);

  // Point-to-point on whichever transport reaches the peer; key is the caller's (a chunk, a
  // slot) and comes back when the request completes.
  struct Req {
    Transport* t;
    ReqId id;
    size_t key;
    int peer;
    int staged = -1;  // a first receive carrying the agreement descriptor: its index
    void* dst = nullptr;
    size_t len = 0;
  };
  using Pending = std::vector<Req>;
  // payload false: control bytes (not counted in the statistics' payload bytes).
  void send(Pending& p, int peer, const void* buf, size_t len, uint64_t tag, size_t key = 0, bool payload = true);
  void recv(Pending& p, int peer, void* buf, size_t len, uint64_t tag, size_t key = 0);
  // A receive that also takes a shorter message (*received: its length once complete); on
  // transports that cannot, exactly capacity (Transport::irecvUpTo).
  void recvUpTo(Pending& p, int peer, void* buf, size_t capacity, uint64_t tag, size_t* received, size_t key = 0);
  // Tests each once; calls done(key) for every completed request and removes it. Returns the
  // number completed.
  template <class F>
  size_t poll(Pending& p, F&& done);
  size_t poll(Pending& p) {
    return poll(p, [](size_t) {});
  }
  void waitAll(Pending& p, const char* what);
  // End of one pass of a progress loop: when nothing moved, check peers and the deadline and
  // back off; otherwise start spinning again.
  void idle(bool moved, Backoff& backoff, const char* what);
  void checkDeadline(const char* what);

 private:
  void waitPeersDone();
  // Ranks with requests outstanding, for a timeout's message.
  void track(int peer, int delta);
  bool test(Req& r);
  std::vector<int> outstanding_;
  int phase_kind_ = 0;
};

template <class F>
size_t Run::poll(Pending& p, F&& done) {
  return completeEach(p, [this](Req& r) { return test(r); }, [&](Req& r) {
    track(r.peer, -1);
    done(r.key);
  });
}

// Algorithms (host buffers, blocking). count = elements per rank block.
void hierAllGather(Run& r, const void* send, void* recv, size_t count);
void hierReduceScatter(Run& r, const void* send, void* recv, size_t count);
void ringAllGather(Run& r, const void* send, void* recv, size_t count);
void ringReduceScatter(Run& r, const void* send, void* recv, size_t count);
// AllReduce = ReduceScatter + AllGather on the plan's blocks (ring or hierarchical), or for
// small buffers (CollPlan::allreduce_small) one AllGather of everything and a local reduction.
void allReduce(Run& r, const void* send, void* recv, size_t count, bool hier);
void hierBroadcast(Run& r, const void* send, void* recv, size_t count, int root);
void chainBroadcast(Run& r, const void* send, void* recv, size_t count, int root);
// AllToAll(v) of r.a (its counts and displacements): sizes checked pair by pair, then every
// block straight to its rank (alltoall.cc).
void allToAll(Run& r);

}  // namespace hicoll
