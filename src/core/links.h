// How a communicator reaches its peers: the bootstrap, the node's shared memory, the network
// endpoint and the liveness connections that name a dead rank on another node; the call and
// phase numbers their messages carry; and the checks that turn a peer's failure into an error.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "base/identity.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/liveness.h"
#include "transport/ofi/ofi_transport.h"
#include "transport/shm/board.h"
#include "transport/transport.h"

namespace hicoll {

class ShmTransport;

struct Links {
  explicit Links(const Identity& id);
  ~Links();
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  std::unique_ptr<Bootstrap> bootstrap;
  std::unique_ptr<ShmTransport> shm;  // ranks of this node (always present)
  // The libfabric endpoint opens at the first call, not at creation (hcComm::ensureNetwork):
  // an idle communicator holds no endpoint (ofi_rxm's buffers are tens of MB) and no fabric
  // connections. Liveness is made at creation: it names a dead rank fast, also while the
  // endpoint opens. Both are null on one node; ofi is set under ApiState::lifecycle_mu (a
  // revoke from another thread reads it).
  std::unique_ptr<Transport> ofi;      // ranks of other nodes
  std::unique_ptr<Liveness> liveness;  // watches ranks of other nodes
  OfiOptions net_opt;                  // what ensureNetwork opens ofi with
  uint64_t seq = 0;                    // board phases run (a call runs one or more)
  UncheckedPhases unchecked;           // settled at the start of the next phase (NodeBoard::settle)
  // Calls that communicated or were rejected (CollArgs::call): their messages carry it, and a
  // revoke from another thread reads it (the failure it reports names the call).
  std::atomic<uint64_t> calls{0};
  // The next call's number. One writer, the thread in the call (CallGate): a store, not a
  // locked increment.
  uint64_t nextCall(uint64_t n = 1) {
    const uint64_t v = calls.load(std::memory_order_relaxed) + n;
    calls.store(v, std::memory_order_release);
    return v;
  }
  uint64_t shrinks = 0;  // hcCommShrink calls (names the survivors' bootstrap keys)

  // The transport that reaches peer: shm on the same node, ofi otherwise.
  Transport& to(int peer);
  // Throws hcRemoteError when a rank this one depends on is known to be gone: a local peer
  // died or aborted, a failure notice arrived, a watched rank's liveness connection closed.
  // Cheap enough for every idle pass of a wait (each source is rate-limited).
  void checkPeers();
  // checkPeers() as the node board's waits call it.
  PeerCheck peerCheck() {
    return {[](void* l) { static_cast<Links*>(l)->checkPeers(); }, this};
  }
  // After an error that is a symptom (a broken link): waits up to ms for a failure notice, or
  // a watched rank's failure with its cause on liveness, and throws it if one arrives.
  void explainSymptom(long ms);
  // Closes everything, the network first (hcCommDestroy, hcCommAbort).
  void close();

 private:
  const Identity& id_;
};

}  // namespace hicoll
