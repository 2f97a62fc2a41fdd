// Bootstrap: small collectives among the ranks of a communicator, out of band, used at
// creation (addresses, host names, configuration), by hcCommSplit, and by the NCCL fallback
// (its unique id). Built on a Store plus a key prefix; every operation uses fresh keys.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/store.h"

namespace hicoll {

class Bootstrap {
 public:
  Bootstrap(std::shared_ptr<Store> store, std::string prefix, int rank, int size, long timeout_ms);
  // Its last operation's keys may still be read by slower ranks: they go to the parent's
  // next completed allgather (the ranks have finished with a destroyed child by then).
  ~Bootstrap();

  int rank() const { return rank_; }
  int size() const { return size_; }
  long timeoutMs() const { return timeout_ms_; }
  // Its key prefix in the store: the same on every rank, one per communicator.
  const std::string& key() const { return prefix_; }

  // all (size * len bytes) receives every rank's `mine` (len bytes) in rank order. With
  // while_waiting, on a store that can be polled, it is called between tries (it throws when a
  // rank this one waits for is known to be gone), so a dead peer fails the wait at once.
  void allgather(const void* mine, void* all, size_t len, const std::function<void()>& while_waiting = {});
  void barrier();
  // root's len bytes to everyone.
  void broadcast(void* data, size_t len, int root);
  // Collective: ranks with the same color (>= 0) get a bootstrap ordered by (key, rank);
  // color < 0 returns nullptr. members (if given) receives the parent ranks of the new group.
  std::unique_ptr<Bootstrap> split(int color, int key, std::vector<int>* members = nullptr);
  // Not collective over this bootstrap: the ranks outside `excluded` (ascending) get one of
  // their own, ranked in order, under keys named by `id` and the excluded set (nobody else
  // uses them). nullptr for an excluded rank.
  std::unique_ptr<Bootstrap> shrink(const std::vector<int>& excluded, uint64_t id) const;

  const std::shared_ptr<Store>& store() const { return store_; }

 private:
  std::string nextKey(const char* what);
  // Keys this rank set, freed once every rank is known to have read them: when an allgather
  // completes, every rank has set its key of it, so every rank finished the operations before.
  void eraseKeysBefore(uint64_t op);
  std::vector<std::pair<uint64_t, std::string>> my_keys_;
  // Keys of destroyed children (splits), shared with them; erased with this bootstrap's own.
  std::shared_ptr<std::vector<std::string>> orphans_ = std::make_shared<std::vector<std::string>>();
  std::shared_ptr<std::vector<std::string>> parent_orphans_;
  std::shared_ptr<Store> store_;
  std::string prefix_;
  int rank_, size_;
  long timeout_ms_;
  uint64_t seq_ = 0;
};

}  // namespace hicoll
