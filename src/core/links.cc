#include "core/links.h"

#include <chrono>
#include <thread>

#include "base/deadline.h"
#include "base/error.h"
#include "transport/shm/shm_transport.h"

namespace hicoll {

Links::Links(const Identity& id) : id_(id) {}
Links::~Links() {
  close();
}

void Links::close() {
  liveness.reset();
  ofi.reset();
  shm.reset();
  bootstrap.reset();
}

Transport& Links::to(int peer) {
  if (id_.sameNode(peer)) return *shm;
  HC_CHECK(ofi, hcInternalError, "no inter-node transport to rank {}", peer);
  return *ofi;
}

void Links::checkPeers() {
  shm->checkPeers();
  if (ofi) ofi->checkFailureNotices();
  if (liveness) liveness->check();
}

void Links::explainSymptom(long ms) {
  if (!ofi) return;
  Deadline d(ms);
  while (!d.expired()) {
    ofi->checkFailureNotices();
    if (liveness) liveness->explain();  // a peer that closed its endpoint told its cause here
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace hicoll
