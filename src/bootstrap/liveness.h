// Liveness across nodes: one TCP connection between each rank and a few ranks of the
// neighbouring nodes, held open for the communicator's life. A killed process's sockets are
// closed by its kernel at once, so a rank that dies on another node (or every rank of a node)
// is seen by the ranks watching it within milliseconds, whether or not a survivor on its node
// sends a failure notice; a silent host is caught by TCP keepalive well inside the timeout.
// A rank that destroys its communicator says so first ("bye"), so the others can tell a
// destroy from a death, or that it failed, in which call and why. Nothing else travels on
// these connections.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "bootstrap/socket.h"

namespace hicoll {

class Bootstrap;

class Liveness {
 public:
  // Collective over bs (every rank calls it, with symmetric peer lists: p in peers of r iff r
  // in peers of p). ip: the IPv4 address peers reach this rank at ("" = the host name's).
  // who(rank) names a rank in messages; call_now is the call this rank is in (a peer that
  // failed in a later call is reported once this rank gets there).
  Liveness(Bootstrap& bs, const std::vector<int>& peers, const std::string& ip, long timeout_ms,
           std::function<std::string(int)> who, CallClock call_now = {});
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Throws hcRemoteError naming a watched rank whose connection closed. At most one system
  // call every few milliseconds (waits call it in their idle loops).
  void check() { poll(/*causes_only=*/false); }
  // Throws only where a watched rank's failure with its cause has arrived: what a rank whose
  // link to a peer broke asks before it reports the broken link (the peer may have closed its
  // endpoint, losing the failure notice it sent on that link, but its cause comes here first).
  void explain() { poll(/*causes_only=*/true); }
  // This rank's communicator failed (why: the cause, kept from the first call): its
  // destruction says so instead of "bye", with the cause, so that a watcher whose failure
  // notice is slow to come still names the rank behind it.
  void markFailed(const std::string& why = "") {
    if (!failed_) why_ = why;
    failed_ = true;
  }
  static constexpr size_t kReasonBytes = 1000;  // of why, carried (a relayed cause names the culprit late)

 private:
  void poll(bool causes_only);
  bool failed_ = false;
  std::string why_;
  struct Peer {
    int rank;
    Fd fd;
    bool failed_later = false;  // it failed in failed_call, a call this rank has not reached
    uint64_t failed_call = 0;
    std::string why;  // what its 'F' said
  };
  std::vector<Peer> peers_;
  std::function<std::string(int)> who_;
  CallClock call_now_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace hicoll
