// The shared-memory transport's failures with ranks as threads of one process: a peer's abort
// and its reason, calls after abort, an abort from another thread or from a later call, a silent
// peer's timeout, a peer that closed cleanly. With both copy paths (ShmCopyModes).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "shm_test_util.h"

namespace hicoll {
namespace {

using namespace shmtest;

class ShmFailure : public ShmCopyModes {};

// A peer that aborts after setReason: a rank polling test() and one in waitFor both fail at
// once with hcRemoteError carrying the reason, long before their 5 s deadline.
TEST_P(ShmFailure, PeerAbortFailsWaitsFastWithItsReason) {
  const std::string why = "rank 1 gave up: injected by the test";
  runRanks(
      3,
      [&](Rank& r) {
        if (r.rank == 1) {
          r.bs.barrier();
          r.t().setReason(why);
          r.t().abort();
          EXPECT_TRUE(r.t().failed(r.t().localIndex()));
          r.bs.barrier();
          return;
        }
        int32_t v = 0;
        std::vector<uint8_t> big(2 * kBounce, 1);
        std::vector<ReqId> reqs;
        if (r.rank == 0) reqs = {r.t().irecv(1, &v, sizeof v, 3), r.t().isend(1, big.data(), big.size(), 4)};
        r.bs.barrier();
        const auto t0 = Clock::now();
        std::string msg;
        if (r.rank == 0) {
          msg = expectError([&] { waitReqs(r.t(), reqs); }, hcRemoteError);
        } else {
          msg = expectError([&] { r.t().waitFor([] { return false; }, Deadline(kTimeoutMs), "waiting for rank 1", 1); },
                            hcRemoteError);
        }
        const double s = secondsSince(t0);
        EXPECT_LT(s, 1.0);
        EXPECT_NE(msg.find("local peer rank 1 failed: " + why + " (noticed in its abort)"), std::string::npos) << msg;
        EXPECT_TRUE(r.t().failed(1));
        EXPECT_EQ(r.t().reason(1), why);
        EXPECT_FALSE(r.t().failed(r.rank));
        r.bs.barrier();
      },
      opt());
}

// On the rank that aborted: posts, waits and peer checks fail at once.
TEST_P(ShmFailure, CallsAfterAbortFailFast) {
  runRanks(
      2,
      [&](Rank& r) {
        if (r.rank == 1) {
          int32_t v = 0;
          ReqId q = r.t().irecv(0, &v, sizeof v, 3);
          const auto t0 = Clock::now();
          r.t().abort();
          std::string msg = expectError([&] { r.t().isend(0, &v, sizeof v, 5); }, hcRemoteError);
          EXPECT_NE(msg.find("send on an aborted communicator"), std::string::npos) << msg;
          msg = expectError([&] { r.t().irecv(0, &v, sizeof v, 5); }, hcRemoteError);
          EXPECT_NE(msg.find("receive on an aborted communicator"), std::string::npos) << msg;
          msg = expectError([&] { r.t().test(q); }, hcRemoteError);
          EXPECT_NE(msg.find("the communicator was aborted"), std::string::npos) << msg;
          std::vector<ReqId> reqs{q};
          expectError([&] { waitAll(r.t(), reqs, Deadline(kTimeoutMs), "after abort"); }, hcRemoteError);
          expectError([&] { r.t().waitFor([] { return false; }, Deadline(kTimeoutMs), "after abort"); }, hcRemoteError);
          EXPECT_LT(secondsSince(t0), 0.5);
        }
        r.bs.barrier();
      },
      opt());
}

// transport.h: abort() "cancels everything outstanding; later calls fail fast". Every test()
// of an outstanding request after abort throws, and so does progress() (before the fix only
// the first test() did: the aborted check ran through checkPeers(), at most every 20 ms).
TEST_P(ShmFailure, EveryTestAfterAbortThrows) {
  runRanks(
      2,
      [&](Rank& r) {
        if (r.rank == 1) {
          int32_t got = 0;
          ReqId q = r.t().irecv(0, &got, sizeof got, 3);
          r.t().abort();
          for (int i = 0; i < 3; ++i) {
            SCOPED_TRACE("test() number " + std::to_string(i + 1) + " after abort()");
            expectError([&] { r.t().test(q); }, hcRemoteError);
          }
          expectError([&] { r.t().progress(); }, hcRemoteError);
        }
        r.bs.barrier();
      },
      opt());
}

// The same promise: a receive outstanding at abort() is cancelled, so a message its peer sends
// afterwards is not copied into it (before the fix progress() matched and copied it).
TEST_P(ShmFailure, AbortCancelsAnOutstandingReceive) {
  runRanks(
      2,
      [&](Rank& r) {
        int32_t v = 7, got = 0;
        if (r.rank == 0) {
          r.bs.barrier();  // rank 1 aborted
          r.t().isend(1, &v, sizeof v, 3);
          r.bs.barrier();  // the message is in the queue
          r.bs.barrier();  // rank 1 tested
          return;
        }
        ReqId q = r.t().irecv(0, &got, sizeof got, 3);
        r.t().abort();
        r.bs.barrier();
        r.bs.barrier();
        bool completed = false;
        expectError([&] { completed = r.t().test(q); }, hcRemoteError);
        EXPECT_FALSE(completed) << "a receive completed after abort()";
        EXPECT_EQ(got, 0) << "a receive was filled after abort()";
        r.bs.barrier();
      },
      opt());
}

// An abort from another thread ends a wait in progress on this rank.
TEST_P(ShmFailure, AbortFromAnotherThreadEndsAWait) {
  runRanks(
      2,
      [&](Rank& r) {
        if (r.rank == 1) {
          int32_t v = 0;
          std::vector<ReqId> reqs{r.t().irecv(0, &v, sizeof v, 3)};
          std::thread watchdog([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            r.t().abort();
          });
          const auto t0 = Clock::now();
          expectError([&] { waitAll(r.t(), reqs, Deadline(kTimeoutMs), "aborted wait"); }, hcRemoteError);
          EXPECT_LT(secondsSince(t0), 1.0);
          EXPECT_GE(secondsSince(t0), 0.09);
          watchdog.join();
        }
        r.bs.barrier();
      },
      opt());
}

// A peer's abort in a later call (ShmOptions::call_now) does not fail this rank's earlier
// call, which that peer completed; it is thrown once this rank reaches that call.
thread_local uint64_t t_call = 0;

TEST_P(ShmFailure, AbortFromALaterCallWaitsUntilThisRankGetsThere) {
  ShmOptions o = opt();
  o.call_now = [] { return t_call; };
  runRanks(
      2,
      [&](Rank& r) {
        int32_t v = 41;
        if (r.rank == 1) {
          t_call = 5;
          ReqId s = r.t().isend(0, &v, sizeof v, 7);  // what call 4 still needs from rank 1
          r.t().setReason("rank 1: call 5 failed");
          r.t().abort();
          (void)s;
          r.bs.barrier();
          return;
        }
        t_call = 4;
        int32_t got = 0;
        ReqId q = r.t().irecv(1, &got, sizeof got, 7);
        bool done = false;
        const auto t0 = Clock::now();
        try {
          while (secondsSince(t0) < 0.2) {  // checkPeers runs every 20 ms: many chances to throw
            done = done || r.t().test(q);
            r.t().checkPeers();
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
        } catch (const Error& e) {
          ADD_FAILURE() << "call 4 failed on an abort from call 5: " << e.what();
        }
        EXPECT_TRUE(done);
        EXPECT_EQ(got, 41);
        t_call = 5;
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
        std::string msg = expectError([&] { r.t().checkPeers(); }, hcRemoteError);
        EXPECT_NE(msg.find("rank 1: call 5 failed"), std::string::npos) << msg;
        r.bs.barrier();
      },
      o);
}

// A wait for a peer that never comes times out at its deadline naming the peer.
TEST_P(ShmFailure, WaitForASilentPeerTimesOutNamingIt) {
  ShmOptions o = opt();
  o.timeout_ms = 300;
  runRanks(
      3,
      [&](Rank& r) {
        if (r.rank == 0) {
          const auto t0 = Clock::now();
          std::string msg = expectError(
              [&] { r.t().waitFor([] { return false; }, Deadline(300), "waiting for rank 2's flag", 2); }, hcTimeout);
          EXPECT_GE(secondsSince(t0), 0.29);
          EXPECT_LT(secondsSince(t0), 0.6);
          EXPECT_NE(msg.find("shm: timed out after 300 ms waiting for rank 2's flag: local peer rank 2 (pid " +
                             std::to_string(getpid()) + ", no call yet on this communicator)"),
                    std::string::npos)
              << msg;
          EXPECT_EQ(msg.find("rank 1"), std::string::npos) << msg;  // only the peer waited for
        }
        r.bs.barrier();
      },
      o);
}

INSTANTIATE_TEST_SUITE_P(CopyModes, ShmFailure, ::testing::Values("auto", "0"), copyModeName);

// A peer that destroyed its transport cleanly is closed, not failed, and no wait fails on it.
TEST(ShmTransport, ClosedPeerIsNotAFailure) {
  runRanks(2, [&](Rank& r) {
    if (r.rank == 1) {
      r.tp.reset();
      r.bs.barrier();
      r.bs.barrier();
      return;
    }
    r.bs.barrier();
    EXPECT_TRUE(r.t().closed(1));
    EXPECT_FALSE(r.t().failed(1));
    EXPECT_FALSE(r.t().closed(0));
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    r.t().checkPeers();  // no throw
    r.bs.barrier();
  });
}

}  // namespace
}  // namespace hicoll
