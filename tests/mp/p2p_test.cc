// Tier 3: point-to-point (hcSend / hcRecv, hcIsend / hcIrecv / hcIrecvAny, their tagged forms,
// groups) between forked ranks on 1-2 simulated nodes, so both the shared-memory queue (a pair
// on one node) and libfabric (a pair across nodes) carry them: values checked byte by byte,
// sizes from 0 to 4 MiB, order, a grouped ring, any source, self, a size that differs, a killed
// peer, p2p between collectives on the same communicator; tags taken out of order (copied
// aside, bounded), any source with a tag, a size that differs naming the tag, hcStats.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "../common/mp.h"

namespace hctest {
namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The byte i of message k from s to d (salt varies it per case).
uint8_t byteOf(int s, int d, size_t i, int k) {
  return static_cast<uint8_t>(s * 37 + d * 11 + k * 5 + i * 13 + (i >> 8) * 7);
}
std::vector<uint8_t> pattern(int s, int d, size_t n, int k) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = byteOf(s, d, i, k);
  return v;
}
// Wrong bytes of what arrived from s (first three printed).
int wrongBytes(const std::vector<uint8_t>& got, int s, int d, int k, int me) {
  int wrong = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != byteOf(s, d, i, k) && wrong++ < 3)
      std::fprintf(stderr, "rank %d: byte %zu of message %d from rank %d is %d, not %d\n", me, i, k, s, got[i],
                   byteOf(s, d, i, k));
  return wrong;
}

int fail(int me, const char* what, hcComm_t comm) {
  std::fprintf(stderr, "rank %d: %s failed: %s\n", me, what, hcGetLastError(comm));
  return 1;
}

Job jobOf(int nodes, int per_node, int timeout_ms = 30000) {
  Job job;
  job.nranks = nodes * per_node;
  job.node = contiguous(nodes, per_node);
  job.env["HICOLL_TIMEOUT_MS"] = std::to_string(timeout_ms);
  job.timeout_s = 60;
  return job;
}

void expectAllZero(const std::vector<int>& st, const char* what) {
  for (size_t r = 0; r < st.size(); ++r) EXPECT_EQ(st[r], 0) << what << " rank " << r;
}

const size_t kSizes[] = {0, 1, 8, 64 << 10, 4 << 20};

// Ping-pong with `peer` at every size: the lower rank sends first, the other echoes its own
// pattern back; both check every byte.
int pingPong(hcComm_t comm, int me, int peer, int k0) {
  int f = 0, k = k0;
  for (size_t n : kSizes) {
    ++k;
    std::vector<uint8_t> out = pattern(me, peer, n, k), in(n, 0xee);
    const bool first = me < peer;
    for (int leg = 0; leg < 2; ++leg) {
      const bool sending = (leg == 0) == first;
      const hcResult_t r = sending ? hcSend(out.data(), n, hcUint8, peer, comm, nullptr)
                                   : hcRecv(in.data(), n, hcUint8, peer, comm, nullptr);
      if (r != hcSuccess) return fail(me, sending ? "hcSend" : "hcRecv", comm) + 100;
    }
    f += wrongBytes(in, peer, me, k, me);
  }
  return f;
}

// 1x2: the pair on one node (shared memory). 2x2: first the pairs of each node, then the pairs
// across nodes (libfabric). Values checked both ways at every size; then 8-byte round trips timed.
TEST(P2p, PingPongEverySizeWithinAndAcrossNodes) {
  for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 2}}) {
    Job job = jobOf(nodes, per);
    auto st = run(job, [&](int me, hcComm_t comm) {
      int f = pingPong(comm, me, me ^ 1, 0);                // same node
      if (nodes == 2) f += pingPong(comm, me, me ^ 2, 10);  // across nodes
      // Latency of 8-byte round trips with each partner (printed, not asserted).
      for (int peer : nodes == 2 ? std::vector<int>{me ^ 1, me ^ 2} : std::vector<int>{me ^ 1}) {
        uint64_t x = static_cast<uint64_t>(me), y = 0;
        const int iters = 2000;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters && f == 0; ++i) {
          if (me < peer) {
            if (hcSend(&x, 8, hcUint8, peer, comm, nullptr) || hcRecv(&y, 8, hcUint8, peer, comm, nullptr)) ++f;
          } else {
            if (hcRecv(&y, 8, hcUint8, peer, comm, nullptr) || hcSend(&x, 8, hcUint8, peer, comm, nullptr)) ++f;
          }
        }
        if (y != static_cast<uint64_t>(peer)) ++f;
        if (me < peer)
          std::fprintf(stderr, "[%dx%d] ping-pong rank %d <-> %d: %.2f us per 8-byte round trip\n", nodes, per, me,
                       peer, since(t0) * 1e6 / iters);
      }
      return f;
    });
    expectAllZero(st, nodes == 1 ? "1x2" : "2x2");
  }
}

// Several messages to one peer arrive in the order they were posted, sizes differing (so a
// reordering would also be a size mismatch), non-blocking sends, blocking receives.
TEST(P2p, MessagesToOnePeerArriveInPostingOrder) {
  for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 1}}) {
    Job job = jobOf(nodes, per);
    auto st = run(job, [&](int me, hcComm_t comm) {
      const int peer = 1 - me, n = 6;
      int f = 0;
      if (me == 0) {
        std::vector<std::vector<uint8_t>> out;
        std::vector<hcRequest_t> reqs(n);
        for (int k = 0; k < n; ++k) out.push_back(pattern(me, peer, 1000 + 4096 * k, k));
        for (int k = 0; k < n; ++k)
          if (hcIsend(out[k].data(), out[k].size(), hcUint8, peer, comm, &reqs[k]) != hcSuccess)
            return fail(me, "hcIsend", comm);
        for (int k = n - 1; k >= 0; --k)  // waited in reverse: completion order is not the point
          if (hcWait(reqs[k]) != hcSuccess) return fail(me, "hcWait", comm);
      } else {
        for (int k = 0; k < n; ++k) {
          std::vector<uint8_t> in(1000 + 4096 * k);
          if (hcRecv(in.data(), in.size(), hcUint8, peer, comm, nullptr) != hcSuccess) return fail(me, "hcRecv", comm);
          f += wrongBytes(in, peer, me, k, me);
        }
      }
      return f;
    });
    expectAllZero(st, nodes == 1 ? "1x2" : "2x1");
  }
}

// Every rank sends 4 MiB to the next and receives from the previous inside one group: with
// blocking calls outside a group every rank would wait in its send (the shared-memory send
// completes when the receiver has taken it). 1x3 and 2x2 (a ring crossing nodes twice).
TEST(P2p, GroupedRingExchangeDoesNotDeadlock) {
  for (auto [nodes, per] : {std::pair{1, 3}, std::pair{2, 2}}) {
    Job job = jobOf(nodes, per, 20000);
    auto st = run(job, [&](int me, hcComm_t comm) {
      int W = 0;
      hcCommCount(comm, &W);
      const int next = (me + 1) % W, prev = (me + W - 1) % W;
      const size_t n = 4 << 20;
      int f = 0;
      for (int round = 0; round < 2; ++round) {
        std::vector<uint8_t> out = pattern(me, next, n, round), in(n);
        if (hcGroupStart() != hcSuccess) return 20;
        // The receive first on even ranks, the send first on odd ones: order inside a group
        // does not matter.
        hcResult_t a = hcSuccess, b = hcSuccess;
        if (me % 2 == 0) {
          a = hcRecv(in.data(), n, hcUint8, prev, comm, nullptr);
          b = hcSend(out.data(), n, hcUint8, next, comm, nullptr);
        } else {
          b = hcSend(out.data(), n, hcUint8, next, comm, nullptr);
          a = hcRecv(in.data(), n, hcUint8, prev, comm, nullptr);
        }
        const hcResult_t e = hcGroupEnd();
        if (a != hcSuccess || b != hcSuccess || e != hcSuccess) return fail(me, "grouped ring", comm);
        f += wrongBytes(in, prev, me, round, me);
      }
      return f;
    });
    expectAllZero(st, nodes == 1 ? "1x3" : "2x2");
  }
}

// One group over two communicators (the parent and a split of it): every rank sends 4 MiB to
// the next and receives from the previous, the two on different communicators, the receive
// posted first; one wait over both completes every operation. 1x2 and 2x1.
TEST(P2p, GroupOverTwoCommunicators) {
  for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 1}}) {
    Job job = jobOf(nodes, per, 20000);
    auto st = run(job, [&](int me, hcComm_t comm) {
      hcComm_t other = nullptr;
      if (hcCommSplit(comm, 0, me, &other) != hcSuccess || !other) return fail(me, "hcCommSplit", comm);
      // Across nodes a communicator's network opens in a call every rank makes (p2p.h).
      if (nodes == 2 && (hcBarrier(comm) != hcSuccess || hcBarrier(other) != hcSuccess))
        return fail(me, "hcBarrier", comm);
      const int W = nodes * per, next = (me + 1) % W, prev = (me + W - 1) % W;
      const size_t n = 4 << 20;
      std::vector<uint8_t> out = pattern(me, next, n, 3), in(n);
      // Odd ranks send on the parent, even ones on the split; a receive uses its sender's.
      hcComm_t sends = me % 2 ? comm : other, recvs = prev % 2 ? comm : other;
      if (hcGroupStart() != hcSuccess) return 20;
      const hcResult_t a = hcRecv(in.data(), n, hcUint8, prev, recvs, nullptr);
      const hcResult_t b = hcSend(out.data(), n, hcUint8, next, sends, nullptr);
      const hcResult_t e = hcGroupEnd();
      if (a != hcSuccess || b != hcSuccess || e != hcSuccess) return fail(me, "grouped over two communicators", comm);
      const int wrong = wrongBytes(in, prev, me, 3, me);
      return hcCommDestroy(other) == hcSuccess ? wrong : 21;
    });
    expectAllZero(st, nodes == 1 ? "1x2" : "2x1");
  }
}

// hcIsend / hcIrecv completed by polling hcTest; the request names its peer; a completed
// request stays valid until hcWait frees it.
TEST(P2p, NonBlockingCompletedByPollingTest) {
  for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 1}}) {
    Job job = jobOf(nodes, per);
    auto st = run(job, [&](int me, hcComm_t comm) {
      const int peer = 1 - me;
      const size_t n = 256 << 10;
      std::vector<uint8_t> out = pattern(me, peer, n, 7), in(n);
      hcRequest_t rr = nullptr, sr = nullptr;
      if (hcIrecv(in.data(), n, hcUint8, peer, comm, &rr) != hcSuccess) return fail(me, "hcIrecv", comm);
      if (hcIsend(out.data(), n, hcUint8, peer, comm, &sr) != hcSuccess) return fail(me, "hcIsend", comm);
      int rdone = 0, sdone = 0, polls = 0;
      const auto t0 = std::chrono::steady_clock::now();
      while ((!rdone || !sdone) && since(t0) < 10) {
        if (!rdone && hcTest(rr, &rdone) != hcSuccess) return fail(me, "hcTest", comm);
        if (!sdone && hcTest(sr, &sdone) != hcSuccess) return fail(me, "hcTest", comm);
        ++polls;
      }
      if (!rdone || !sdone) return 30;
      int src = -1;
      if (hcRequestSource(rr, &src) != hcSuccess || src != peer) return 31;
      int again = 0;
      if (hcTest(rr, &again) != hcSuccess || again != 1) return 32;  // still valid, still done
      if (hcWait(rr) != hcSuccess || hcWait(sr) != hcSuccess) return fail(me, "hcWait", comm);
      if (hcTest(rr, &again) != hcInvalidArgument) return 33;  // freed
      std::fprintf(stderr, "rank %d: done after %d polls\n", me, polls);
      return wrongBytes(in, peer, me, 7, me);
    });
    expectAllZero(st, nodes == 1 ? "1x2" : "2x1");
  }
}

// Rank 0 receives one message from every rank (itself included) with hcIrecvAny and learns
// each source: the contents say who sent it, every source exactly once. 1x3 (shared memory) and
// 2x2 (a local peer and two across nodes).
TEST(P2p, ReceiveFromAnySourceNamesTheSource) {
  for (auto [nodes, per] : {std::pair{1, 3}, std::pair{2, 2}}) {
    Job job = jobOf(nodes, per);
    auto st = run(job, [&](int me, hcComm_t comm) {
      int W = 0;
      hcCommCount(comm, &W);
      if (hcBarrier(comm) != hcSuccess) return fail(me, "hcBarrier", comm);  // opens the network
      const size_t n = 4096;
      std::vector<uint8_t> out = pattern(me, 0, n, 3);
      if (me != 0) {
        if (hcSend(out.data(), n, hcUint8, 0, comm, nullptr) != hcSuccess) return fail(me, "hcSend", comm);
        return 0;
      }
      if (hcSend(out.data(), n, hcUint8, 0, comm, nullptr) != hcSuccess) return fail(me, "hcSend to self", comm);
      std::vector<std::vector<uint8_t>> in(W, std::vector<uint8_t>(n));
      std::vector<hcRequest_t> reqs(W);
      for (int i = 0; i < W; ++i)
        if (hcIrecvAny(in[i].data(), n, hcUint8, comm, &reqs[i]) != hcSuccess) return fail(me, "hcIrecvAny", comm);
      std::vector<int> seen;
      int f = 0;
      for (int i = 0; i < W; ++i) {
        int done = 0, src = -1;
        while (!done)
          if (hcTest(reqs[i], &done) != hcSuccess) return fail(me, "hcTest", comm);
        if (hcRequestSource(reqs[i], &src) != hcSuccess || src < 0 || src >= W) return 40;
        if (hcWait(reqs[i]) != hcSuccess) return fail(me, "hcWait", comm);
        f += wrongBytes(in[i], src, 0, 3, me);
        seen.push_back(src);
      }
      std::sort(seen.begin(), seen.end());
      for (int i = 0; i < W; ++i)
        if (seen[i] != i) ++f;
      return f;
    });
    expectAllZero(st, nodes == 1 ? "1x3" : "2x2");
  }
}

// Blocking messages of sizes around the limits of the pair's queue (inline in the descriptor,
// through the bounce ring, read in one copy) sent back and forth until the 256 KiB ring has
// wrapped many times, messages straddling its end; with single-copy reads and without
// (HICOLL_SHM_CMA=0: everything through the ring, larger than it too). Every byte checked.
TEST(P2p, RingSizesAcrossTheRingsEndWithAndWithoutSingleCopy) {
  for (const char* cma : {"auto", "0"}) {
    Job job = jobOf(1, 2);
    job.env["HICOLL_SHM_CMA"] = cma;
    auto st = run(job, [&](int me, hcComm_t comm) {
      const size_t sizes[] = {39, 40, 41, 1000, 3001, 4096, 4097, 100003, 300007};
      int f = 0, k = 0;
      for (size_t n : sizes) {
        const int reps = n < 10000 ? 400 : 6;
        for (int rep = 0; rep < reps && f == 0; ++rep) {
          ++k;
          std::vector<uint8_t> out = pattern(me, 1 - me, n, k), in(n, 0xee);
          for (int leg = 0; leg < 2; ++leg) {
            const bool sending = (leg == 0) == (me == 0);
            const hcResult_t r = sending ? hcSend(out.data(), n, hcUint8, 1 - me, comm, nullptr)
                                         : hcRecv(in.data(), n, hcUint8, 1 - me, comm, nullptr);
            if (r != hcSuccess) return fail(me, sending ? "hcSend" : "hcRecv", comm) + 100;
          }
          f += wrongBytes(in, 1 - me, me, k, me);
        }
      }
      return f;
    });
    expectAllZero(st, cma);
  }
}

// A blocking receive whose message never comes, and a send never received, time out naming the
// operation, the peer and what is missing (1x2: shared memory; 2x1: libfabric).
TEST(P2p, AWaitThatTimesOutNamesWhatIsLate) {
  for (bool send : {false, true}) {
    for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 1}}) {
      Job job = jobOf(nodes, per, 1000);
      auto st = run(job, [&](int me, hcComm_t comm) {
        uint64_t x = 0;
        if (nodes == 2 && hcBarrier(comm) != hcSuccess) return fail(me, "hcBarrier", comm);
        if (me == 1) {  // in no call until rank 0 has timed out
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          return 0;
        }
        const auto t0 = std::chrono::steady_clock::now();
        const hcResult_t r = send ? hcSend(&x, 8, hcUint8, 1, comm, nullptr) : hcRecv(&x, 8, hcUint8, 1, comm, nullptr);
        const double took = since(t0);
        const std::string msg = hcGetLastError(comm);
        std::fprintf(stderr, "[%dx%d rank 0] %s after %.2f s: %s\n", nodes, per, hcGetErrorString(r), took,
                     msg.c_str());
        if (r != hcTimeout) return 70;
        if (took < 0.9 || took > 2.4) return 71;
        if (msg.find(send ? "hcSend of 8 bytes to rank 1" : "hcRecv of 8 bytes from rank 1") == std::string::npos)
          return 72;
        if (msg.find(send ? "the receiver has not taken it" : "no message from it with this tag has arrived") ==
            std::string::npos)
          return 73;
        return 0;
      });
      expectAllZero(st, send ? "send" : "recv");
    }
  }
}

// A send to self is a copy: blocking send then receive, and a receive posted before the send.
TEST(P2p, SendToSelfCopies) {
  Job job = jobOf(1, 2);
  auto st = run(job, [&](int me, hcComm_t comm) {
    const size_t n = 100000;
    std::vector<uint8_t> out = pattern(me, me, n, 1), in(n), in2(n);
    if (hcSend(out.data(), n, hcUint8, me, comm, nullptr) != hcSuccess) return fail(me, "hcSend self", comm);
    if (hcRecv(in.data(), n, hcUint8, me, comm, nullptr) != hcSuccess) return fail(me, "hcRecv self", comm);
    hcRequest_t r = nullptr;
    if (hcIrecv(in2.data(), n, hcUint8, me, comm, &r) != hcSuccess) return fail(me, "hcIrecv self", comm);
    std::vector<uint8_t> out2 = pattern(me, me, n, 2);
    if (hcSend(out2.data(), n, hcUint8, me, comm, nullptr) != hcSuccess) return fail(me, "hcSend self 2", comm);
    if (hcWait(r) != hcSuccess) return fail(me, "hcWait self", comm);
    return wrongBytes(in, me, me, 1, me) + wrongBytes(in2, me, me, 2, me);
  });
  expectAllZero(st, "1x2");
}

// Rank 0 sends 100 int32, rank 1 expects 200: both fail fast, each naming the other rank and
// both sizes in bytes; within a node (shared memory) and across nodes (libfabric).
TEST(P2p, SizeMismatchFailsBothRanksNamingThePeer) {
  for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 1}}) {
    Job job = jobOf(nodes, per, 20000);
    auto st = run(job, [&](int me, hcComm_t comm) {
      std::vector<int32_t> buf(200, me);
      if (nodes == 2 && hcBarrier(comm) != hcSuccess) return fail(me, "hcBarrier", comm);
      const auto t0 = std::chrono::steady_clock::now();
      const hcResult_t r = me == 0 ? hcSend(buf.data(), 100, hcInt32, 1, comm, nullptr)
                                   : hcRecv(buf.data(), 200, hcInt32, 0, comm, nullptr);
      const double took = since(t0);
      const std::string msg = hcGetLastError(comm);
      std::fprintf(stderr, "[%dx%d rank %d] %s after %.2f s: %s\n", nodes, per, me, hcGetErrorString(r), took,
                   msg.c_str());
      if (r == hcSuccess) return 50;
      if (took > 5) return 51;
      if (msg.find("rank " + std::to_string(1 - me)) == std::string::npos) return 52;
      if (msg.find("400 bytes") == std::string::npos || msg.find("800 bytes") == std::string::npos) return 53;
      if (msg.find(me == 0 ? "hcSend" : "hcRecv") == std::string::npos) return 54;
      // The communicator failed: later calls fail at once.
      if (hcBarrier(comm) == hcSuccess) return 55;
      return 0;
    });
    expectAllZero(st, nodes == 1 ? "1x2" : "2x1");
  }
}

// The peer is killed while this rank waits in hcRecv: an error naming it long before the
// timeout (30 s), within and across nodes.
TEST(P2p, KilledPeerFailsTheReceiveFast) {
  for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 1}}) {
    Job job = jobOf(nodes, per, 30000);
    auto st = run(job, [&](int me, hcComm_t comm) {
      int x = me, y = -1;
      const int peer = 1 - me;
      // One exchange that works (it opens the network across nodes).
      hcGroupStart();
      hcSend(&x, 1, hcInt32, peer, comm, nullptr);
      hcRecv(&y, 1, hcInt32, peer, comm, nullptr);
      if (hcGroupEnd() != hcSuccess || y != peer) return fail(me, "first exchange", comm);
      if (me == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        raise(SIGKILL);
      }
      const auto t0 = std::chrono::steady_clock::now();
      const hcResult_t r = hcRecv(&y, 1, hcInt32, 1, comm, nullptr);
      const double took = since(t0);
      const std::string msg = hcGetLastError(comm);
      std::fprintf(stderr, "[%dx%d rank 0] %s after %.2f s: %s\n", nodes, per, hcGetErrorString(r), took, msg.c_str());
      if (r != hcRemoteError) return 60;
      if (took > 5) return 61;
      if (msg.find("rank 1") == std::string::npos) return 62;
      return 0;
    });
    EXPECT_EQ(st[0], 0) << nodes << "x" << per;
    EXPECT_EQ(st[1], 128 + SIGKILL) << nodes << "x" << per;
  }
}

// P2p between collectives on one communicator, and a non-blocking pair left in flight across a
// barrier (posted in the same order on both ranks): every value checked.
TEST(P2p, InterleavedWithCollectives) {
  Job job = jobOf(2, 2);
  auto st = run(job, [&](int me, hcComm_t comm) {
    const int W = 4, next = (me + 1) % W, prev = (me + W - 1) % W;
    int f = 0;
    for (int it = 0; it < 4; ++it) {
      int64_t v = me + it, sum = 0;
      if (hcAllReduce(&v, &sum, 1, hcInt64, hcSum, comm, nullptr) != hcSuccess) return fail(me, "hcAllReduce", comm);
      if (sum != 6 + 4 * it) ++f;
      std::vector<uint8_t> out = pattern(me, next, 70000, it), in(70000);
      hcGroupStart();
      hcSend(out.data(), out.size(), hcUint8, next, comm, nullptr);
      hcRecv(in.data(), in.size(), hcUint8, prev, comm, nullptr);
      if (hcGroupEnd() != hcSuccess) return fail(me, "group", comm);
      f += wrongBytes(in, prev, me, it, me);
      std::vector<int32_t> all(W, -1);
      int32_t mine = me * 10 + it;
      if (hcAllGather(&mine, all.data(), 1, hcInt32, comm, nullptr) != hcSuccess) return fail(me, "hcAllGather", comm);
      for (int r = 0; r < W; ++r)
        if (all[r] != r * 10 + it) ++f;
      // A pair across the barrier: the node partner (me ^ 1).
      const int partner = me ^ 1;
      std::vector<uint8_t> po = pattern(me, partner, 5000, it + 20), pi(5000);
      hcRequest_t rs = nullptr, rr = nullptr;
      if (me < partner) {
        if (hcIsend(po.data(), po.size(), hcUint8, partner, comm, &rs) ||
            hcIrecv(pi.data(), pi.size(), hcUint8, partner, comm, &rr))
          return fail(me, "post", comm);
      } else {
        if (hcIrecv(pi.data(), pi.size(), hcUint8, partner, comm, &rr) ||
            hcIsend(po.data(), po.size(), hcUint8, partner, comm, &rs))
          return fail(me, "post", comm);
      }
      if (hcBarrier(comm) != hcSuccess) return fail(me, "hcBarrier", comm);
      if (hcWait(rs) != hcSuccess || hcWait(rr) != hcSuccess) return fail(me, "hcWait", comm);
      f += wrongBytes(pi, partner, me, it + 20, me);
    }
    return f;
  });
  expectAllZero(st, "2x2");
}

// ---- Tags ----

struct Tagged {
  int tag;
  size_t n;
};
// What the sender sends, in this order (blocking sends); the receiver takes them in kTakeOrder:
// tags 3 and 0 first (so tags 1 and 2 are copied aside), then 2, then tag 1 twice (the same tag
// in posting order: a swap would also be a size mismatch).
const Tagged kSent[] = {{1, 1000}, {2, 300 << 10}, {3, 8}, {1, 2 << 20}, {0, 77}};
const int kTakeOrder[] = {2, 4, 1, 0, 3};

// The lower rank sends kSent with blocking hcSendTag, the higher one receives with blocking
// hcRecvTag in kTakeOrder; then the other way round.
int tagsOutOfOrder(hcComm_t comm, int me, int peer, int k0) {
  int f = 0;
  for (int leg = 0; leg < 2; ++leg) {
    const bool sending = (leg == 0) == (me < peer);
    if (sending) {
      for (int k = 0; k < 5; ++k) {
        std::vector<uint8_t> out = pattern(me, peer, kSent[k].n, k0 + k);
        if (hcSendTag(out.data(), out.size(), hcUint8, peer, kSent[k].tag, comm, nullptr) != hcSuccess)
          return fail(me, "hcSendTag", comm) + 100;
      }
      continue;
    }
    for (int k : kTakeOrder) {
      std::vector<uint8_t> in(kSent[k].n, 0xee);
      if (hcRecvTag(in.data(), in.size(), hcUint8, peer, kSent[k].tag, comm, nullptr) != hcSuccess)
        return fail(me, "hcRecvTag", comm) + 100;
      f += wrongBytes(in, peer, me, k0 + k, me);
    }
  }
  return f;
}

// The same with non-blocking calls: the receives posted in kTakeOrder before the sends are
// posted, every request waited in reverse.
int tagsNonBlocking(hcComm_t comm, int me, int peer, int k0) {
  std::vector<std::vector<uint8_t>> out(5), in(5);
  std::vector<hcRequest_t> reqs;
  for (int k : kTakeOrder) {
    in[k].assign(kSent[k].n, 0xee);
    hcRequest_t r = nullptr;
    if (hcIrecvTag(in[k].data(), in[k].size(), hcUint8, peer, kSent[k].tag, comm, &r) != hcSuccess)
      return fail(me, "hcIrecvTag", comm) + 100;
    reqs.push_back(r);
  }
  for (int k = 0; k < 5; ++k) {
    out[k] = pattern(me, peer, kSent[k].n, k0 + k);
    hcRequest_t r = nullptr;
    if (hcIsendTag(out[k].data(), out[k].size(), hcUint8, peer, kSent[k].tag, comm, &r) != hcSuccess)
      return fail(me, "hcIsendTag", comm) + 100;
    reqs.push_back(r);
  }
  for (auto it = reqs.rbegin(); it != reqs.rend(); ++it)
    if (hcWait(*it) != hcSuccess) return fail(me, "hcWait", comm) + 100;
  int f = 0;
  for (int k = 0; k < 5; ++k) f += wrongBytes(in[k], peer, me, k0 + k, me);
  return f;
}

// Tags received in another order than sent, blocking and non-blocking: 1x2 (shared memory), 2x2
// with the node pairs and then the pairs across nodes (libfabric).
TEST(P2p, TagsReceivedInADifferentOrderThanSent) {
  for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 2}}) {
    Job job = jobOf(nodes, per);
    auto st = run(job, [&](int me, hcComm_t comm) {
      if (nodes == 2 && hcBarrier(comm) != hcSuccess) return fail(me, "hcBarrier", comm);  // opens the network
      int x = 0;
      if (hcSendTag(&x, 1, hcInt32, me, -1, comm, nullptr) != hcInvalidArgument) return 90;
      if (std::string(hcGetLastError(comm)).find("tag -1") == std::string::npos) return 91;
      int f = tagsOutOfOrder(comm, me, me ^ 1, 0) + tagsNonBlocking(comm, me, me ^ 1, 10);
      if (nodes == 2) f += tagsOutOfOrder(comm, me, me ^ 2, 20) + tagsNonBlocking(comm, me, me ^ 2, 30);
      // The communicator still works for collectives afterwards.
      int64_t v = me, sum = 0;
      if (hcAllReduce(&v, &sum, 1, hcInt64, hcSum, comm, nullptr) != hcSuccess) return fail(me, "hcAllReduce", comm);
      return f + (sum != (nodes * per) * (nodes * per - 1) / 2);
    });
    expectAllZero(st, nodes == 1 ? "1x2" : "2x2");
  }
}

// Every rank but 0 first sends rank 0 a decoy with tag 9, then a message with tag 4 (blocking
// sends); rank 0 receives tag 4 from any source first, learning each sender once, then each
// decoy by name. 1x3 and 2x2 (a local peer and two across nodes).
TEST(P2p, ReceiveFromAnySourceWithATag) {
  for (auto [nodes, per] : {std::pair{1, 3}, std::pair{2, 2}}) {
    Job job = jobOf(nodes, per);
    auto st = run(job, [&](int me, hcComm_t comm) {
      int W = 0;
      hcCommCount(comm, &W);
      if (hcBarrier(comm) != hcSuccess) return fail(me, "hcBarrier", comm);
      const size_t n = 40000, decoy = 5000;
      if (me != 0) {
        std::vector<uint8_t> d = pattern(me, 0, decoy, 9), out = pattern(me, 0, n, 4);
        if (hcSendTag(d.data(), decoy, hcUint8, 0, 9, comm, nullptr) != hcSuccess) return fail(me, "decoy", comm);
        if (hcSendTag(out.data(), n, hcUint8, 0, 4, comm, nullptr) != hcSuccess) return fail(me, "hcSendTag", comm);
        return 0;
      }
      std::vector<std::vector<uint8_t>> in(W, std::vector<uint8_t>(n));
      std::vector<hcRequest_t> reqs(W);
      for (int i = 1; i < W; ++i)
        if (hcIrecvAnyTag(in[i].data(), n, hcUint8, 4, comm, &reqs[i]) != hcSuccess)
          return fail(me, "hcIrecvAnyTag", comm);
      // Each source once, and each message what that source sent.
      std::vector<int> seen;
      int f = 0;
      for (int i = 1; i < W; ++i) {
        int done = 0, src = -1;
        while (!done)
          if (hcTest(reqs[i], &done) != hcSuccess) return fail(me, "hcTest", comm);
        if (hcRequestSource(reqs[i], &src) != hcSuccess || src < 1 || src >= W) return 40;
        if (hcWait(reqs[i]) != hcSuccess) return fail(me, "hcWait", comm);
        f += wrongBytes(in[i], src, 0, 4, me);
        seen.push_back(src);
      }
      std::sort(seen.begin(), seen.end());
      for (int i = 1; i < W; ++i)
        if (seen[static_cast<size_t>(i - 1)] != i) ++f;
      for (int s = 1; s < W; ++s) {
        std::vector<uint8_t> d(decoy);
        if (hcRecvTag(d.data(), decoy, hcUint8, s, 9, comm, nullptr) != hcSuccess) return fail(me, "decoy", comm);
        f += wrongBytes(d, s, 0, 9, me);
      }
      return f;
    });
    expectAllZero(st, nodes == 1 ? "1x3" : "2x2");
  }
}

// A size that differs between a send and a receive of one tag fails both ranks naming the tag,
// the peer and both sizes (1x2, 2x1). Sent ahead of another tag, the message is copied aside and
// its send completes: the receiver fails naming the same, the sender in its next call.
TEST(P2p, TagSizeMismatchNamesTheTag) {
  for (bool aside : {false, true}) {
    for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 1}}) {
      Job job = jobOf(nodes, per, 20000);
      auto st = run(job, [&](int me, hcComm_t comm) {
        std::vector<int32_t> buf(200, me);
        if (nodes == 2 && hcBarrier(comm) != hcSuccess) return fail(me, "hcBarrier", comm);
        const auto t0 = std::chrono::steady_clock::now();
        hcResult_t r = hcSuccess;
        if (me == 0) {
          r = hcSendTag(buf.data(), 100, hcInt32, 1, 7, comm, nullptr);
          if (aside && r == hcSuccess) r = hcSendTag(buf.data(), 1, hcInt32, 1, 8, comm, nullptr);
          if (aside && r == hcSuccess) r = hcBarrier(comm);  // the receiver's failure reaches it here
        } else {
          if (aside) r = hcRecvTag(buf.data(), 1, hcInt32, 0, 8, comm, nullptr);
          if (r == hcSuccess) r = hcRecvTag(buf.data(), 200, hcInt32, 0, 7, comm, nullptr);
        }
        const double took = since(t0);
        const std::string msg = hcGetLastError(comm);
        std::fprintf(stderr, "[%dx%d%s rank %d] %s after %.2f s: %s\n", nodes, per, aside ? " aside" : "", me,
                     hcGetErrorString(r), took, msg.c_str());
        if (r == hcSuccess) return 50;
        if (took > 5) return 51;
        if (msg.find("tag 7") == std::string::npos) return 52;
        if (msg.find("400 bytes") == std::string::npos || msg.find("800 bytes") == std::string::npos) return 53;
        if (msg.find("rank " + std::to_string(1 - me)) == std::string::npos) return 54;
        return 0;
      });
      expectAllZero(st, nodes == 1 ? "1x2" : "2x1");
    }
  }
}

// Copying aside is bounded: a message larger than the bound (64 MiB) ahead of the one a receive
// waits for stays with its sender. Within a node the queue is in order, so that receive waits
// until the large one's receive is posted; across nodes it completes at once (envelopes say
// what comes). Then both complete with their values (1x2, 2x1).
TEST(P2p, UnexpectedMessagesAreBounded) {
  for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 1}}) {
    Job job = jobOf(nodes, per);
    auto st = run(job, [&](int me, hcComm_t comm) {
      if (nodes == 2 && hcBarrier(comm) != hcSuccess) return fail(me, "hcBarrier", comm);
      const size_t big = 80 << 20;
      if (me == 0) {
        std::vector<uint8_t> a = pattern(0, 1, big, 1), b = pattern(0, 1, 8, 2);
        hcRequest_t ra = nullptr, rb = nullptr;
        if (hcIsendTag(a.data(), big, hcUint8, 1, 1, comm, &ra) || hcIsendTag(b.data(), 8, hcUint8, 1, 2, comm, &rb))
          return fail(me, "hcIsendTag", comm);
        if (hcWait(rb) != hcSuccess || hcWait(ra) != hcSuccess) return fail(me, "hcWait", comm);
        return 0;
      }
      std::vector<uint8_t> a(big), b(8);
      hcRequest_t ra = nullptr, rb = nullptr;
      if (hcIrecvTag(b.data(), 8, hcUint8, 0, 2, comm, &rb) != hcSuccess) return fail(me, "hcIrecvTag", comm);
      int done = 0;
      const auto t0 = std::chrono::steady_clock::now();
      while (!done && since(t0) < (nodes == 1 ? 0.5 : 10))
        if (hcTest(rb, &done) != hcSuccess) return fail(me, "hcTest", comm);
      if (done != (nodes == 1 ? 0 : 1)) {
        std::fprintf(stderr, "rank 1: tag 2 %s before tag 1's receive was posted\n", done ? "arrived" : "waited");
        return 60;
      }
      if (hcIrecvTag(a.data(), big, hcUint8, 0, 1, comm, &ra) != hcSuccess) return fail(me, "hcIrecvTag", comm);
      if (hcWait(rb) != hcSuccess || hcWait(ra) != hcSuccess) return fail(me, "hcWait", comm);
      return wrongBytes(a, 0, 1, 1, me) + wrongBytes(b, 0, 1, 2, me);
    });
    expectAllZero(st, nodes == 1 ? "1x2" : "2x1");
  }
}

// hcStats counts completed point-to-point operations, their bytes and the messages copied
// aside: rank 0 sends tags 1, 2, 3 (10, 1000, 0 bytes) and itself 5 bytes; rank 1 takes tag 3
// first (1 and 2 are copied aside), then 2 and 1. 1x2 and 2x1.
TEST(P2p, StatsCountOperationsBytesAndCopiesAside) {
  for (auto [nodes, per] : {std::pair{1, 2}, std::pair{2, 1}}) {
    Job job = jobOf(nodes, per);
    auto st = run(job, [&](int me, hcComm_t comm) {
      if (nodes == 2 && hcBarrier(comm) != hcSuccess) return fail(me, "hcBarrier", comm);
      std::vector<uint8_t> buf(1000, 1);
      const size_t sizes[] = {0, 10, 1000, 0};  // by tag
      if (me == 0) {
        for (int t = 1; t <= 3; ++t)
          if (hcSendTag(buf.data(), sizes[t], hcUint8, 1, t, comm, nullptr) != hcSuccess)
            return fail(me, "hcSendTag", comm);
        if (hcSend(buf.data(), 5, hcUint8, 0, comm, nullptr) || hcRecv(buf.data(), 5, hcUint8, 0, comm, nullptr))
          return fail(me, "self", comm);
      } else {
        for (int t : {3, 2, 1})
          if (hcRecvTag(buf.data(), sizes[t], hcUint8, 0, t, comm, nullptr) != hcSuccess)
            return fail(me, "hcRecvTag", comm);
      }
      hcStats s = HC_STATS_INITIALIZER;
      if (hcCommGetStats(comm, &s) != hcSuccess) return fail(me, "hcCommGetStats", comm);
      std::fprintf(stderr, "[%dx%d rank %d] p2p sends %llu (%llu B), recvs %llu (%llu B), copied aside %llu\n", nodes,
                   per, me, (unsigned long long)s.p2p_sends, (unsigned long long)s.p2p_bytes_sent,
                   (unsigned long long)s.p2p_recvs, (unsigned long long)s.p2p_bytes_received,
                   (unsigned long long)s.p2p_copied_aside);
      if (me == 0)
        return (s.p2p_sends != 4) + (s.p2p_bytes_sent != 1015) + (s.p2p_recvs != 1) + (s.p2p_bytes_received != 5) +
               (s.p2p_copied_aside != 0);
      return (s.p2p_sends != 0) + (s.p2p_bytes_sent != 0) + (s.p2p_recvs != 3) + (s.p2p_bytes_received != 1010) +
             (s.p2p_copied_aside != 2);
    });
    expectAllZero(st, nodes == 1 ? "1x2" : "2x1");
  }
}

}  // namespace
}  // namespace hctest
