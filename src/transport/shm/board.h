// The node board: what each rank tells the ranks of its node about the phase of a collective it
// runs (its post: the call's descriptor and the region it exposes), how far it got (counters
// of chunks ready, per data stream), and when it finished reading its peers. One board per
// rank, in its shared segment; the protocol is NodeBoard's.
//
// Every slot alternates with the phase's parity: a peer may post phase s+1 while this rank
// still checks its phase s, and no rank runs two phases ahead of a local peer (each phase waits
// for every local peer's post, Run::waitAllPosted).
#pragma once

#include <atomic>
#include <cstdint>

#include "base/coll.h"
#include "transport/shm/node_memory.h"

namespace hicoll {

class ShmTransport;

struct alignas(64) Board {
  struct alignas(64) Post {
    std::atomic<uint64_t> posted{0};  // seq of the phase the fields below describe
    CallDesc desc;                    // the call (and phase): checked against the peers'
    uint64_t addr[2] = {};            // regions exposed to the node, in the owner's address space
    NodeMemRef mem;                   // the node memory (hcMemAlloc) holding addr[0], if any
  };
  Post post[2];
  // (seq << 24) | chunks ready, per phase parity and stream of data a collective publishes.
  struct alignas(64) Counter {
    std::atomic<uint64_t> v{0};
  };
  Counter ready[2][2];
  alignas(64) std::atomic<uint64_t> done{0};  // last seq whose reads of peers this rank finished
};

class NodeBoard {
 public:
  explicit NodeBoard(ShmTransport& shm) : shm_(shm) {}

  // This rank's post of phase seq.
  void post(uint64_t seq, const CallDesc& desc, const void* addr0);
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
};

}  // namespace hicoll
