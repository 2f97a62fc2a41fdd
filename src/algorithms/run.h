// One call's context: its plan and the communicator's parts it runs on (Identity, Links,
// Buffers, Stats), a deadline, tags, the node board protocol (post, wait for peers, publish
// progress, finish together) and request waiting across transports.
#pragma once

#include <utility>
#include <vector>

#include "algorithms/agree.h"
#include "algorithms/reduce.h"
#include "core/comm.h"
#include "plan/plan.h"
#include "transport/shm/shm_transport.h"
#include "transport/tags.h"
#include "transport/transport.h"

namespace hicoll {

struct Run {
  // plan: the call's (null for a call that only takes part in an agreement). A planned call is
  // counted in the statistics when its Run ends, with the bytes it moved, under one lock.
  Run(hcComm& c, const CollArgs& args, const CollPlan* plan, Agreement* agreement = nullptr);
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  const Identity& id;
  Links& links;
  Buffers& buf;
  Stats& stats;
  const Config& cfg;
  const long timeout_ms;
  const CollArgs& a;
  const CollPlan* plan;
  const CallDesc desc;   // of a: what the node board carries
  Agreement* agreement;  // the call's remote agreement, checked while waiting (may be null)
  Deadline deadline;
  size_t esize;
  ShmTransport& shm;
  NodeBoard board;
  const bool oversubscribed;  // PlanState::oversubscribed(), for the one-node Broadcast
  uint64_t seq = 0;           // of the current phase (one collective may run several)

  // Starts a phase: a fresh sequence number for tags and the board (whose phase rule every
  // phase follows: transport/shm/board.h), once the previous phase's checks are done.
  void beginPhase() {
    board.settle(links.unchecked);
    seq = ++links.seq;
  }
  // Ends this phase before the peers posted it (board.h, unchecked phases): the next phase
  // waits for their posts and checks them.
  void leaveUnchecked() { links.unchecked.add(seq); }
  // Tags (transport/tags.h): phase sequence (wrapping), step, chunk.
  uint64_t tag(unsigned step, unsigned chunk) const {
    return tags::make(tags::Class::Collective,
                      (seq << 28) | (static_cast<uint64_t>(step & 0xff) << 20) | (chunk & 0xfffff));
  }
  ReduceSpec reduceSpec(uint64_t premul_mask, bool final_step) const;
  // The plan's chunking (CollPlan::chunk_bytes, net_window).
  size_t chunkBytes() const { return plan->chunk_bytes; }
  size_t netWindow() const { return plan->net_window; }

  // The node board protocol of this phase (NodeBoard): every phase posts and waits for every
  // local peer's post (which also keeps any rank from running two phases ahead of a peer).
  void post(const void* addr0, int phase_kind, uint64_t flags = 0);  // desc + addr[0], then posted=seq
  bool waitPosted(int local, bool collect = false) {
    return board.waitPosted(local, seq, desc.withPhase(phase_kind_), collect);
  }
  void waitAllPosted() { board.waitAllPosted(seq, desc.withPhase(phase_kind_)); }
  const char* postedAddr(int local) const { return board.postedAddr(local, seq); }  // its addr0 of this phase
  bool allPostedNodeMemory() const { return board.allPostedNodeMemory(seq); }
  // Peer l's posted region [off, off + len) as mapped here (node memory), or null.
  const char* mappedPosted(int local, size_t off, size_t len);
  // One copy of the peer's posted region [off, off + len) into dst: memcpy from node memory,
  // else the transport's single-copy read.
  void readPosted(int local, size_t off, void* dst, size_t len);
  // A copy into the call's output: streaming (base/copy.h) when the call writes at least
  // HICOLL_STREAM_COPY_BYTES here, memcpy otherwise.
  void copyOut(void* dst, const void* src, size_t len);
  void publish(int stream, uint64_t chunks) { board.publish(seq, stream, chunks); }
  uint64_t readyOf(int local, int stream) const { return board.readyOf(local, seq, stream); }
  void finishNode(bool peers_read_only_segment = false) { board.finish(seq, peers_read_only_segment); }

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
  void send(Pending& p, int peer, const void* data, size_t len, uint64_t tag, size_t key = 0, bool payload = true);
  void recv(Pending& p, int peer, void* data, size_t len, uint64_t tag, size_t key = 0);
  // A receive that also takes a shorter message (*received: its length once complete); on
  // transports that cannot, exactly capacity (Transport::irecvUpTo).
  void recvUpTo(Pending& p, int peer, void* data, size_t capacity, uint64_t tag, size_t* received, size_t key = 0);
  // Payload bytes this call moved to or from peer (the statistics' per-level bytes).
  void countBytes(int peer, size_t bytes) { (id.sameNode(peer) ? bytes_intra_ : bytes_inter_) += bytes; }
  void countLocalBytes(size_t bytes) { bytes_intra_ += bytes; }  // read from local peers
  // Tests each once; calls done(key) for every completed request and removes it. Returns the
  // number completed.
  template <class F>
  size_t poll(Pending& p, F&& done);
  size_t poll(Pending& p) {
    return poll(p, [](size_t) {});
  }
  void waitAll(Pending& p, const char* what);
  // The call's progress loop (hicoll::waitUntil): pass() until Done; after a pass that moved
  // nothing, the peers' health and the agreement are checked, then the call's deadline (its
  // timeout names who has not arrived).
  template <class Pass>
  void waitUntil(const char* what, Pass&& pass) {
    hicoll::waitUntil(
        std::forward<Pass>(pass), deadline, [this] { idle(); }, [&] { checkDeadline(what); });
  }
  void checkDeadline(const char* what);

 private:
  void idle();
  // Ranks with requests outstanding, for a timeout's message.
  void track(int peer, int delta);
  bool test(Req& r);
  std::vector<int> outstanding_;
  int phase_kind_ = 0;
  bool stream_out_ = false;
  size_t bytes_intra_ = 0, bytes_inter_ = 0;
};

template <class F>
size_t Run::poll(Pending& p, F&& done) {
  return completeEach(
      p, [this](Req& r) { return test(r); },
      [&](Req& r) {
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
