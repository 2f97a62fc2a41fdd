// Tier 3 of the tests: ranks as forked processes (the project's launcher, src/launch),
// simulated nodes via HICOLL_TOPO_NODE, bootstrapped through hcCommInitFromEnv (rank 0 hosts the
// rendezvous) with a random HICOLL_COMM_SECRET per job, bounded in time.
#pragma once

#include <functional>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "hicoll/hicoll.h"

namespace hctest {

struct Job {
  int nranks = 2;
  std::vector<std::string> node;                               // node label per rank (empty: all one node)
  std::map<std::string, std::string> env;                      // extra environment for every rank
  std::map<int, std::map<std::string, std::string>> rank_env;  // per-rank overrides
  int timeout_s = 120;
  std::string comm_id;     // host:port of the rendezvous; empty: a free loopback port
  bool no_secret = false;  // true: no HICOLL_COMM_SECRET (the secret is derived, guessable)
};

// 32 random hex digits (what the launchers put in HICOLL_COMM_SECRET).
std::string randomSecret();

// Node labels: contiguous ranks per node ("n0 n0 n1 n1") or interleaved ("n0 n1 n0 n1").
std::vector<std::string> contiguous(int nodes, int per_node);
std::vector<std::string> interleaved(int nodes, int per_node);

// Runs body on every rank in a child process; body returns 0 for success. Returns the exit
// status per rank (128+signal when killed; 124 when the job timed out). Children print their
// failures to stderr with a rank prefix.
std::vector<int> run(const Job& job, const std::function<int(int rank, hcComm_t comm)>& body);
// Same without creating a communicator (for tests of creation itself).
std::vector<int> runRaw(const Job& job, const std::function<int(int rank)>& body);

int freePort();

// A helper process beside the job (a stranger at the rendezvous, say), forked at construction,
// before the ranks are: a helper *thread* in the test process could hold a lock (malloc's, a
// sanitizer's) at the moment the ranks are forked and leave one of them deadlocked. State it
// shares with the test lives in Shared<T>. join() waits at most timeout_s, then kills it.
class Helper {
 public:
  explicit Helper(const std::function<void()>& body);
  ~Helper() { join(); }
  Helper(const Helper&) = delete;
  Helper& operator=(const Helper&) = delete;
  void join(int timeout_s = 60);

 private:
  int pid_ = -1;
};

// One T in memory shared with forked children (Helper, the ranks); T must be trivially
// destructible and work across processes (plain data, lock-free atomics).
void* sharedBytes(size_t n);
void freeSharedBytes(void* p, size_t n);
template <class T>
class Shared {
 public:
  Shared() : p_(new (sharedBytes(sizeof(T))) T()) {}
  ~Shared() { freeSharedBytes(p_, sizeof(T)); }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }

 private:
  T* p_;
};

}  // namespace hctest
