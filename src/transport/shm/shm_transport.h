// Shared memory between the ranks of one node.
//
// Each rank owns one segment: a header (its board and its send queues, one per local peer), a
// bounce ring per peer, then its scratch and sort buffers. Every local rank maps every other
// rank's segment, so the hierarchical algorithms read peers' scratch and sort buffers with a
// plain memcpy, and read peers' user buffers with one copy through process_vm_readv (CMA),
// described on the peer's board. Point-to-point messages (the ring algorithms' and hcSend's)
// are single-copy with CMA; small ones (every one when CMA is not permitted, HICOLL_SHM_CMA=0)
// stream through the pair's bounce ring instead, and the smallest ride in their descriptor.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/coll.h"
#include "base/deadline.h"
#include "transport/shm/board.h"
#include "transport/shm/node_memory.h"
#include "transport/shm/segment.h"
#include "transport/transport.h"

namespace hicoll {

class Bootstrap;

struct ShmOptions {
  size_t scratch_bytes = 0;
  size_t sort_bytes = 0;
  std::string cma = "auto";  // auto | 0 | 1
  long timeout_ms = 120000;
  // Peers' node memory this rank keeps mapped between calls (HICOLL_MEM_CACHE_BYTES).
  size_t peer_mem_bytes = size_t{1} << 30;
  // The call this rank is in (CallClock, base/deadline.h): a peer's abort from a later call
  // waits until this rank gets there.
  CallClock call_now;
};

class ShmTransport : public Transport {
 public:
  // Collective over bs: every rank of the communicator calls it. local_ranks are the
  // communicator ranks of this rank's node, ascending.
  ShmTransport(Bootstrap& bs, const std::vector<int>& local_ranks, const ShmOptions& opt);
  ~ShmTransport() override;

  // Transport (point-to-point with ranks of this node).
  const char* name() const override { return "shm"; }
  bool canConnect(int peer) const override {
    return peer >= 0 && static_cast<size_t>(peer) < local_of_.size() && local_of_[static_cast<size_t>(peer)] >= 0;
  }
  ReqId isend(int peer, const void* buf, size_t len, uint64_t tag) override;
  ReqId irecv(int peer, void* buf, size_t len, uint64_t tag) override;
  bool test(ReqId req) override;
  void progress() override;
  void abort() override;
  // The next message from peer that no receive has taken yet (its tag and length; false when
  // it has posted none): a receive from any source looks before it takes, and a mismatch's
  // message names what was sent. With receives posted to peer, it is the first one's.
  bool peek(int peer, uint64_t* tag, size_t* len);
  // For a caller that waits for one message alone (a blocking point-to-point call with nothing
  // else pending), without a request. postNow posts a send to peer when nothing is queued
  // before it and it can go whole at once (inline, into the bounce ring's free room, or for a
  // single-copy read): its queue index, else kNotNow (then isend). taken() says the receiver
  // has it. takeNow receives the message peek() shows when no receive is posted to peer and it
  // is whole (its tag and size are the caller's to check first): false, taking nothing, when
  // it is not (then irecv).
  static constexpr uint64_t kNotNow = UINT64_MAX;
  uint64_t postNow(int peer, const void* buf, size_t len, uint64_t tag);
  bool taken(int peer, uint64_t index);
  bool takeNow(int peer, void* buf, size_t len);
  // Starts fetching what the next message from peer, of about len bytes, will be read from
  // (its descriptor, the bounce ring at this rank's position), for a wait that will read it
  // next: the lines then cross between the cores at once rather than one after the other.
  void prefetchFrom(int peer, size_t len);
  // Receives posted to peer and not complete.
  size_t postedRecvs(int peer) const;
  // A receive, in peer's order like any other, whose buffer is chosen when the message it takes
  // is seen (point-to-point matching by tag): place(req, tag, len, &buf) returns false to leave
  // the message where it is for now, or sets buf (len bytes); it may throw.
  using Placer = std::function<bool(ReqId req, uint64_t tag, size_t len, char** buf)>;
  ReqId irecvPlaced(int peer, Placer place);

  // Direct access for the hierarchical algorithms; `local` indexes this node's ranks.
  int localSize() const { return static_cast<int>(local_ranks_.size()); }
  int localIndex() const { return me_; }
  int commRank(int local) const { return local_ranks_[local]; }
  // The layout NodeBoard's protocol works on; the peer's scratch buffer as mapped here. Inline:
  // a small call reads them a few times per peer.
  Board& board(int local) { return *boards_[static_cast<size_t>(local)]; }
  // Maps local rank `local`'s board ring data (Board::ring) here whole, once: before its first
  // ring phase with data beyond the post (its owner to write it, a peer to read it).
  void mapBoardRing(int local) {
    if (!board_ring_mapped_[static_cast<size_t>(local)]) mapBoardRingNow(local);
  }
  char* scratch(int local) { return scratch_[static_cast<size_t>(local)]; }
  char* sort(int local);
  // One copy of len bytes at remote (an address in the peer's process) into dst.
  void read(int local, const void* remote, void* dst, size_t len);
  // The peer's node memory (hcMemAlloc) ref, as mapped here: where [remote, remote + len) of
  // the peer's address space lies in this process. Throws when ref does not cover it or the
  // name cannot be mapped (naming the peer).
  const char* mapPeerMemory(int local, const NodeMemRef& ref, const void* remote, size_t len);
  // Unmaps peers' node memory their owners released for good (not what call uses).
  void dropFreedPeerMemory(uint64_t call);
  // True when peers' user buffers can be read directly (CMA, or ranks are threads).
  bool directRead() const { return direct_; }
  // Throws hcRemoteError when a local peer died, or aborted in a call this rank has reached.
  void checkPeers();
  // The peer destroyed its communicator (it has finished every call it will make).
  bool closed(int local);
  // The peer failed (and aborted its communicator); reason(local) says why.
  bool failed(int local);
  // Why this rank failed or rejected a call, for local peers' messages (before abort() or a
  // rejected call's post); reason(local) reads a peer's.
  void setReason(const std::string& why);
  std::string reason(int local);
  // Waits until pred() holds, checking peers and the deadline; what names the wait, local the
  // peer waited for (-1: any; a timeout then names the stopped ones).
  template <class Pred>
  void waitFor(Pred pred, const Deadline& deadline, const char* what, int local = -1);
  // For a timeout's message, what local peer `local` is doing as its process and its board show
  // it: "pid 812, stopped (SIGSTOP or a debugger), in AllGather #26 of 262144 x float32".
  std::string peerState(int local);
  // The peer's process is stopped (SIGSTOP, a debugger): it will not arrive by itself.
  bool stopped(int local);

 private:
  struct Req;
  struct Pair;
  struct Header;
  Header& header(int local);
  [[noreturn]] void throwPeerError(int local, const char* what);
  // A timeout waiting for local peer `local` (-1: for any of them) names who has not arrived.
  [[noreturn]] void throwTimeout(int local, const char* what);
  // A single-copy read failed (EFAULT, ESRCH): a peer that failed, died or closed meanwhile
  // freed the buffer; throws that cause if it shows within a moment.
  void explainReadFailure(int local);
  ReqId newReq(bool send, int local, char* buf, size_t len, uint64_t tag);
  Req& req(ReqId id);
  bool progressSend(int local);
  // A message of len bytes goes through the bounce ring (else the receiver reads it with CMA).
  bool viaRing(size_t len) const;
  // The bounce ring sender's segment holds for receiver (both local indices).
  char* ring(int sender, int receiver);
  void mapRing(int sender, int receiver, bool* mapped);
  void mapBoardRingNow(int local);
  bool progressRecv(int local);
  static std::string allowPeerReads(const std::string& mode, const std::vector<int>& pids, int me);
  std::string cma_note_;

  std::vector<int> local_ranks_;
  std::vector<int> local_of_;  // comm rank -> local index (-1: another node's)
  int localOf(int peer) const;
  int me_ = 0;
  ShmOptions opt_;
  size_t bounce_bytes_ = 0;
  size_t header_bytes_ = 0;
  bool direct_ = false;
  bool same_process_ = false;
  std::vector<ShmSegment> segs_;
  std::vector<Board*> boards_;           // in segs_, by local index
  std::vector<char*> scratch_;           // likewise
  std::vector<char> board_ring_mapped_;  // mapBoardRing, by local index
  std::vector<int> pids_;
  int my_pid_ = 0;
  std::vector<int> pidfds_;
  std::vector<std::unique_ptr<Pair>> pairs_;
  // Peers' node memory mapped here, by (local peer, allocation id); bounded in bytes.
  struct PeerMemory {
    ShmSegment seg;
    uint64_t last_call = 0;
  };
  std::map<std::pair<int, uint64_t>, PeerMemory> peer_mem_;
  size_t peer_mem_bytes_ = 0;
  std::vector<uint64_t> freed_seen_;        // per local peer: its free log's ids read
  std::vector<std::unique_ptr<Req>> reqs_;  // the slab; a Req stays put (a placer may post while one is held)
  std::vector<uint32_t> free_reqs_;
  uint32_t next_gen_ = 1;
  Deadline::Clock::time_point last_check_{};
  std::atomic<bool> aborted_{false};  // abort() may come from another thread (hcCommRevoke)
};

template <class Pred>
void ShmTransport::waitFor(Pred pred, const Deadline& deadline, const char* what, int local) {
  waitUntil(
      pred, deadline, [&] { checkPeers(); }, [&] { throwTimeout(local, what); });
}

}  // namespace hicoll
