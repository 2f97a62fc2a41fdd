// Test support: an in-memory Transport between the threads of one test. A send completes only
// once a matching receive took its data (like a rendezvous protocol), receives match sends of
// the same peer and tag in posting order, and a length mismatch is an error naming the peer.
// Failure notices reach every other endpoint at once (the first one each receives is kept).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace hctest {

class LoopFabric : public std::enable_shared_from_this<LoopFabric> {
 public:
  static std::shared_ptr<LoopFabric> create(int nranks);
  std::unique_ptr<hicoll::Transport> endpoint(int rank);

  struct Message;
  struct Recv;
  struct Box;  // messages and posted receives between one (src, dst) pair

 private:
  explicit LoopFabric(int nranks);
  friend class LoopTransport;
  int nranks_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Box>> boxes_;  // [dst * nranks + src]
  std::vector<std::string> notices_;         // [dst]: "rank src: why", "" when none
};

}  // namespace hctest
