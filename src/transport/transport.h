// The point-to-point interface every transport implements (one folder each: shm/, ofi/).
// Requests are posted asynchronously and completed by test(); progress is driven by the
// caller's thread (manual progress). Messages between a pair of ranks with the same tag match
// in posting order. A receive must be posted with exactly the length that was sent: a
// mismatch is an error naming the peer, not a truncation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/deadline.h"

namespace hicoll {

using ReqId = uint64_t;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Peers are ranks of the communicator the transport was created for.
  virtual bool canConnect(int peer) const = 0;
  virtual ReqId isend(int peer, const void* buf, size_t len, uint64_t tag) = 0;
  virtual ReqId irecv(int peer, void* buf, size_t len, uint64_t tag) = 0;
  // A receive that also takes a shorter message: *received is its length once test() says
  // complete (it must stay valid until then). Transports that cannot take one receive exactly.
  virtual ReqId irecvUpTo(int peer, void* buf, size_t capacity, uint64_t tag, size_t* received) {
    *received = capacity;
    return irecv(peer, buf, capacity, tag);
  }
  // Drives progress; true (and the request is released) once it is complete. Throws
  // hicoll::Error (hcRemoteError, hcSystemError, hcInvalidUsage for a length mismatch) naming
  // the peer and the tag.
  virtual bool test(ReqId req) = 0;
  virtual void progress() = 0;
  // Tag bits the transport carries (tags above them are refused).
  virtual int tagBits() const { return 64; }
  // This rank's IPv4 address on the transport's network ("" when it is not an IP network).
  virtual std::string ipv4() const { return ""; }
  // Cancels everything outstanding; later calls fail fast.
  virtual void abort() = 0;
  // Failure notices (transports that reach other nodes): a rank whose communicator failed
  // tells every peer why, best effort and bounded; a waiting rank checks whether a notice
  // arrived and throws hcRemoteError naming the rank that sent it. Peers of a node learn of a
  // failure through shared memory; this carries it across nodes, where a dead process would
  // otherwise only show as a timeout. A notice is thrown once this rank has reached the call it
  // names (CallClock).
  virtual void announceFailure(const std::string& what) { (void)what; }
  virtual void checkFailureNotices() {}
  // Memory that will be sent from / received into often (scratch, sort buffers).
  virtual void registerRegion(void* base, size_t len) {
    (void)base;
    (void)len;
  }
};

// The one request-polling pass: tests each outstanding request once (test(T&) -> bool), calls
// done(T&) on every completed one and removes it (swap with the last: the order of what is left
// changes). Returns how many completed. A throwing test leaves its request in place. done must
// not add to or remove from reqs.
template <class T, class TestFn, class DoneFn>
size_t completeEach(std::vector<T>& reqs, TestFn&& test, DoneFn&& done) {
  size_t n = 0;
  for (size_t i = 0; i < reqs.size();) {
    if (test(reqs[i])) {
      done(reqs[i]);
      if (i + 1 != reqs.size()) reqs[i] = std::move(reqs.back());
      reqs.pop_back();
      ++n;
    } else {
      ++i;
    }
  }
  return n;
}
template <class T, class TestFn>
size_t completeEach(std::vector<T>& reqs, TestFn&& test) {
  return completeEach(reqs, std::forward<TestFn>(test), [](T&) {});
}

// Waits for all requests (any order) until the deadline; throws hcTimeout naming `what`.
void waitAll(Transport& t, std::vector<ReqId>& reqs, const Deadline& deadline, const std::string& what);

}  // namespace hicoll
