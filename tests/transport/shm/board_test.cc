// The node board protocol (transport/shm/board.h) with ranks as threads of one process: posts
// that agree, posts that differ, a rank that never posts or destroyed its communicator, the
// phase rule (write the segment only after every peer posted; finish), and the ready counters.
#include <gtest/gtest.h>

#include <functional>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/coll.h"
#include "shm_test_util.h"
#include "transport/shm/board.h"

namespace hicoll {
namespace {

using namespace shmtest;

CollArgs allReduce(size_t count, uint64_t call) {
  CollArgs a;
  a.coll = hcCollAllReduce;
  a.count = count;
  a.dtype = hcFloat32;
  a.op.kind = OpKind::Sum;
  a.call = call;
  return a;
}

// A NodeBoard over rank r's transport, with its own deadline.
struct TestBoard {
  Deadline deadline;
  std::function<void()> check;
  NodeBoard nb;
  TestBoard(Rank& r, long timeout_ms)
      : deadline(timeout_ms), check([&r] { r.t().checkPeers(); }),
        nb(r.t(), r.id, deadline, timeout_ms, PeerCheck::of(check)) {}
};

TEST(ShmBoard, SamePostsAgreeAndShowEachRanksRegion) {
  runRanks(4, [&](Rank& r) {
    TestBoard b(r, kTimeoutMs);
    const CallDesc desc = CallDesc::of(allReduce(100, 1)).withPhase(1);
    std::vector<float> buf(100, static_cast<float>(r.rank));
    const auto addrs = allgatherValue(r.bs, reinterpret_cast<uint64_t>(buf.data()));
    b.nb.post(1, desc, buf.data());
    b.nb.waitAllPosted(1, desc);
    for (int l = 0; l < r.size; ++l) {
      if (l == r.rank) continue;
      EXPECT_TRUE(b.nb.waitPosted(l, 1, desc));
      EXPECT_EQ(b.nb.postedSeq(l, 1), 1u);
      EXPECT_TRUE(b.nb.postedDesc(l, 1).sameCall(desc));
      EXPECT_EQ(reinterpret_cast<uint64_t>(b.nb.postedAddr(l, 1)), addrs[l]);
      EXPECT_FALSE(b.nb.postedMem(l, 1).valid());  // heap memory, not hcMemAlloc's
    }
    EXPECT_FALSE(b.nb.allPostedNodeMemory(1));
    b.nb.finish(1, false);
    // The second call, in the other slot.
    const CallDesc desc2 = CallDesc::of(allReduce(100, 2)).withPhase(1);
    b.nb.post(2, desc2, nullptr);
    b.nb.waitAllPosted(2, desc2);
    for (int l = 0; l < r.size; ++l) {
      if (l == r.rank) continue;
      EXPECT_EQ(b.nb.postedSeq(l, 2), 2u);
      EXPECT_EQ(b.nb.postedAddr(l, 2), nullptr);
      EXPECT_EQ(b.nb.postedSeq(l, 1), 1u);  // phase 1's slot is untouched
    }
    b.nb.finish(2, false);
  });
}

// One rank's call differs (count, collective, datatype, op, call number): every rank's wait
// fails at once with hcInvalidUsage naming the other rank, both calls and what differs.
TEST(ShmBoard, ADifferentPostFailsEveryRankNamingWhatDiffers) {
  struct Case {
    const char* name;
    CollArgs odd;
    const char* odd_text;  // describeCall of the odd rank's call
    const char* differs;
  };
  CollArgs count = allReduce(200, 1), coll = allReduce(100, 1), dtype = allReduce(100, 1), op = allReduce(100, 1),
           call = allReduce(100, 2);
  coll.coll = hcCollAllGather;
  dtype.dtype = hcInt32;
  op.op.kind = OpKind::Max;
  const std::vector<Case> cases = {
      {"count", count, "AllReduce(sum) #1 of 200 x float32", "the count"},
      {"collective", coll, "AllGather #1 of 100 x float32", "the collective"},
      {"datatype", dtype, "AllReduce(sum) #1 of 100 x int32", "the datatype"},
      {"op", op, "AllReduce(max) #1 of 100 x float32", "the reduction op"},
      {"call", call, "AllReduce(sum) #2 of 100 x float32", "the call number"},
  };
  const std::string normal = "AllReduce(sum) #1 of 100 x float32";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    runRanks(3, [&](Rank& r) {
      TestBoard b(r, kTimeoutMs);
      const CallDesc mine = CallDesc::of(r.rank == 2 ? c.odd : allReduce(100, 1)).withPhase(1);
      b.nb.post(1, mine, nullptr);
      const auto t0 = Clock::now();
      std::string msg = expectError([&] { b.nb.waitAllPosted(1, mine); }, hcInvalidUsage);
      EXPECT_LT(secondsSince(t0), 1.0);
      const std::string want = r.rank == 2
                                   ? "rank 0 (node 'n0') called " + normal + " where rank 2 called " + c.odd_text +
                                         " (" + c.differs + " differs)"
                                   : "rank 2 (node 'n0') called " + std::string(c.odd_text) + " where rank " +
                                         std::to_string(r.rank) + " called " + normal + " (" + c.differs + " differs)";
      EXPECT_EQ(msg, want);
    });
  }
}

// A rank that rejected its own arguments posts an invalid descriptor after setReason: its
// peers fail with hcRemoteError carrying the reason; a collecting wait returns false.
TEST(ShmBoard, RejectedArgumentsFailPeersWithTheReason) {
  runRanks(3, [&](Rank& r) {
    TestBoard b(r, kTimeoutMs);
    const CallDesc ok = CallDesc::of(allReduce(100, 1)).withPhase(1);
    if (r.rank == 1) {
      r.t().setReason("rank 1: recvbuff is null");
      b.nb.post(1, CallDesc::of(allReduce(100, 1), CallDesc::kInvalid).withPhase(1), nullptr);
      r.bs.barrier();
      return;
    }
    b.nb.post(1, ok, nullptr);
    std::string msg = expectError([&] { b.nb.waitPosted(1, 1, ok); }, hcRemoteError);
    EXPECT_EQ(msg, "rank 1 (node 'n0') rejected its arguments of " + std::string("AllReduce(sum) #1 of 100 x float32") +
                       ": rank 1: recvbuff is null");
    EXPECT_FALSE(b.nb.waitPosted(1, 1, ok, /*collect=*/true));
    EXPECT_TRUE(b.nb.waitPosted(2 - r.rank, 1, ok, /*collect=*/true));
    r.bs.barrier();
  });
}

// A rank that never posts: the wait fails at its deadline (300 ms), not before and well
// within twice it, with hcTimeout naming the missing rank and what its board shows.
TEST(ShmBoard, MissingPostTimesOutNamingTheRank) {
  ShmOptions o;
  o.timeout_ms = 300;
  runRanks(
      3,
      [&](Rank& r) {
        const CallDesc c1 = CallDesc::of(allReduce(100, 1)).withPhase(1);
        const CallDesc c2 = CallDesc::of(allReduce(100, 2)).withPhase(1);
        {
          TestBoard b(r, kTimeoutMs);  // call 1 on every rank
          b.nb.post(1, c1, nullptr);
          b.nb.waitAllPosted(1, c1);
          b.nb.finish(1, true);
        }
        r.bs.barrier();
        if (r.rank == 2) {  // call 2 without rank 2; it stays alive until the others gave up
          r.bs.barrier();
          return;
        }
        TestBoard b(r, 300);
        b.nb.post(2, c2, nullptr);
        const auto t0 = Clock::now();
        std::string msg = expectError([&] { b.nb.waitAllPosted(2, c2); }, hcTimeout);
        const double s = secondsSince(t0);
        EXPECT_GE(s, 0.25);  // the deadline began just before the post
        EXPECT_LT(s, 0.6);
        EXPECT_EQ(msg, "timed out after 300 ms: rank 2 (node 'n0') has not started this call (pid " +
                           std::to_string(getpid()) +
                           ", done with AllReduce(sum) #1 of 100 x float32) (slow, stopped, or it called fewer "
                           "collectives)");
        r.bs.barrier();
      },
      o);
}

// A rank that destroyed its communicator without posting fails its peers' waits at once.
TEST(ShmBoard, PeerThatDestroyedItsCommunicatorFailsTheWaitFast) {
  runRanks(3, [&](Rank& r) {
    const CallDesc c = CallDesc::of(allReduce(100, 1)).withPhase(1);
    if (r.rank == 2) {
      r.tp.reset();
      r.bs.barrier();
      r.bs.barrier();
      return;
    }
    TestBoard b(r, kTimeoutMs);
    b.nb.post(1, c, nullptr);
    r.bs.barrier();
    const auto t0 = Clock::now();
    std::string msg = expectError([&] { b.nb.waitAllPosted(1, c); }, hcRemoteError);
    EXPECT_LT(secondsSince(t0), 1.0);
    EXPECT_EQ(msg, "rank 2 (node 'n0') destroyed its communicator without calling AllReduce(sum) #1 of 100 x float32");
    r.bs.barrier();
  });
}

// A peer may be up to Board::kSlots - 1 phases ahead (a ring phase's root, board.h): waiting
// for phase s then sees phase s still; kSlots ahead is an internal error. Another phase kind
// of the same call is an internal error too.
TEST(ShmBoard, APeerUpToTheRingAheadIsFineFurtherIsAnError) {
  constexpr uint64_t K = Board::kSlots;
  runRanks(2, [&](Rank& r) {
    TestBoard b(r, kTimeoutMs);
    const CallDesc d = CallDesc::of(allReduce(64, 1));
    if (r.rank == 1) {
      for (uint64_t s = 1; s <= K; ++s) b.nb.post(s, d.withPhase(static_cast<int>(s % 8)), nullptr);
      r.bs.barrier();
      r.bs.barrier();
      b.nb.post(K + 1, d.withPhase(1), nullptr);
      r.bs.barrier();
      return;
    }
    r.bs.barrier();
    EXPECT_TRUE(b.nb.waitPosted(1, 1, d.withPhase(1)));
    EXPECT_TRUE(b.nb.waitPosted(1, 2, d.withPhase(2)));
    std::string msg = expectError([&] { b.nb.waitPosted(1, 2, d.withPhase(3)); }, hcInternalError);
    EXPECT_NE(msg.find("rank 1 (node 'n0') is in another phase (0x2 vs 0x3)"), std::string::npos) << msg;
    r.bs.barrier();
    r.bs.barrier();
    EXPECT_EQ(b.nb.postedSeq(1, 1), K + 1);
    msg = expectError([&] { b.nb.waitPosted(1, 1, d.withPhase(1)); }, hcInternalError);
    EXPECT_NE(msg.find("rank 1 (node 'n0') is ahead of this phase"), std::string::npos) << msg;
    // A late check (settle) of a phase whose slot moved on passes.
    EXPECT_TRUE(b.nb.waitPosted(1, 1, d.withPhase(1), false, /*later_ok=*/true));
  });
}

// settle(): the unchecked phases' posts are waited for and checked against this rank's own
// posts of them, up to `upto`; a disagreement names this rank's earlier call.
TEST(ShmBoard, SettleChecksTheUncheckedPhasesUpToWhereAsked) {
  runRanks(2, [&](Rank& r) {
    TestBoard b(r, kTimeoutMs);
    auto bc = [](int root, uint64_t call) {
      CollArgs a{.coll = hcCollBroadcast, .count = 4, .dtype = hcFloat32, .root = root};
      a.call = call;
      return CallDesc::of(a).withPhase(hcCollBroadcast);
    };
    for (uint64_t s = 1; s <= 3; ++s) b.nb.post(s, bc(s == 3 && r.rank == 1 ? 1 : 0, s), nullptr);
    r.bs.barrier();
    if (r.rank == 0) {
      UncheckedPhases u;
      for (uint64_t s = 1; s <= 3; ++s) u.add(s);
      b.nb.settle(u, 2);  // phases 1 and 2 agree
      EXPECT_EQ(u.from, 3u);
      const std::string msg = expectError([&] { b.nb.settle(u); }, hcInvalidUsage);
      EXPECT_NE(msg.find("this rank's earlier call, Broadcast(root 0) #3"), std::string::npos) << msg;
      EXPECT_NE(msg.find("the root differs"), std::string::npos) << msg;
      EXPECT_EQ(u.from, 0u);
    }
    r.bs.barrier();
  });
}

// finish(s, true) returns at once; finish(s, false) waits until every peer is done with s, and
// times out naming a peer that never is.
TEST(ShmBoard, FinishWaitsForPeersOnlyWhenTheyReadUserBuffers) {
  ShmOptions o;
  o.timeout_ms = 300;
  runRanks(
      3,
      [&](Rank& r) {
        const CallDesc d = CallDesc::of(allReduce(8, 1)).withPhase(1);
        TestBoard b(r, kTimeoutMs);
        b.nb.post(1, d, nullptr);
        b.nb.waitAllPosted(1, d);
        r.bs.barrier();
        if (r.rank == 0) {
          auto t0 = Clock::now();
          b.nb.finish(1, true);
          EXPECT_LT(secondsSince(t0), 0.05);
          EXPECT_FALSE(b.nb.peerDone(1, 1));  // rank 1 sleeps before its finish
          r.bs.barrier();
          t0 = Clock::now();
          b.nb.finish(1, false);
          EXPECT_GE(secondsSince(t0), 0.14);  // until rank 1 finished
          EXPECT_LT(secondsSince(t0), 1.0);
          EXPECT_TRUE(b.nb.peerDone(1, 1));
          EXPECT_TRUE(b.nb.peerDone(2, 1));
        } else {
          r.bs.barrier();
          if (r.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(150));
          b.nb.finish(1, true);
        }
        r.bs.barrier();
        // Phase 2: rank 2 never finishes; rank 0's finish(2, false) gives up at its deadline.
        const CallDesc d2 = CallDesc::of(allReduce(8, 2)).withPhase(1);
        b.nb.post(2, d2, nullptr);
        b.nb.waitAllPosted(2, d2);
        if (r.rank == 1) b.nb.finish(2, true);
        r.bs.barrier();
        if (r.rank == 0) {
          Deadline short_deadline(300);
          auto check = [&] { r.t().checkPeers(); };
          NodeBoard nb(r.t(), r.id, short_deadline, 300, PeerCheck::of(check));
          const auto t0 = Clock::now();
          std::string msg = expectError([&] { nb.finish(2, false); }, hcTimeout);
          EXPECT_GE(secondsSince(t0), 0.29);
          EXPECT_LT(secondsSince(t0), 0.6);
          EXPECT_NE(msg.find("shm: timed out after 300 ms waiting for local peers to finish reading: local peer "
                             "rank 2 (pid " +
                             std::to_string(getpid()) + ", in AllReduce(sum) #2 of 8 x float32)"),
                    std::string::npos)
              << msg;
        }
        r.bs.barrier();
      },
      o);
}

// The ready counters alternate with the phase's parity: a peer's count from phase s is not
// read as phase s+2's.
TEST(ShmBoard, ReadyCountersBelongToTheirPhase) {
  runRanks(2, [&](Rank& r) {
    TestBoard b(r, kTimeoutMs);
    const int peer = 1 - r.rank;
    EXPECT_EQ(b.nb.readyOf(peer, 1, 0), 0u);  // nothing published yet
    r.bs.barrier();
    b.nb.publish(1, 0, 5);
    b.nb.publish(1, 1, 7 + r.rank);
    b.nb.publish(2, 0, 9);
    r.bs.barrier();
    EXPECT_EQ(b.nb.readyOf(peer, 1, 0), 5u);
    EXPECT_EQ(b.nb.readyOf(peer, 1, 1), 7u + peer);
    EXPECT_EQ(b.nb.readyOf(peer, 2, 0), 9u);
    EXPECT_EQ(b.nb.readyOf(peer, 2, 1), 0u);
    EXPECT_EQ(b.nb.readyOf(peer, 3, 0), 0u);  // phase 1's slot, phase 3 not reached
    r.bs.barrier();
  });
}

// The phase rule under load: each phase, every rank writes its scratch only after every peer
// posted the phase, publishes it, and reads every peer's. A peer that posted phase s+1 has
// finished reading phase s, so no read ever sees the next phase's bytes. Even phases also read
// the peers' user buffers, which their owners overwrite once finish(s, false) returns.
TEST(ShmBoard, PhaseRuleKeepsEveryReadOnItsPhase) {
  constexpr int kPhases = 300;
  constexpr size_t kBytes = 8192;
  ShmOptions o;
  o.scratch_bytes = kBytes;
  runRanks(
      4,
      [&](Rank& r) {
        TestBoard b(r, 20000);
        std::vector<uint8_t> user(kBytes), got(kBytes);
        size_t wrong_scratch = 0, wrong_user = 0;
        auto seed = [](uint64_t s, int rank, bool user) { return static_cast<uint32_t>(s * 16 + rank * 2 + user); };
        for (uint64_t s = 1; s <= kPhases; ++s) {
          const bool reads_user = s % 2 == 0;
          const CallDesc d = CallDesc::of(allReduce(kBytes, (s + 1) / 2)).withPhase(reads_user ? 2 : 1);
          if (reads_user) {
            const auto data = makeData(kBytes, seed(s, r.rank, true));
            std::memcpy(user.data(), data.data(), kBytes);
          }
          b.nb.post(s, d, user.data());
          b.nb.waitAllPosted(s, d);
          const auto data = makeData(kBytes, seed(s, r.rank, false));
          std::memcpy(r.t().scratch(r.rank), data.data(), kBytes);
          b.nb.publish(s, 0, 1);
          for (int l = 0; l < r.size; ++l) {
            if (l == r.rank) continue;
            ASSERT_TRUE(waitUntil([&] { return b.nb.readyOf(l, s, 0) >= 1; }, b.deadline)) << "phase " << s;
            std::memcpy(got.data(), r.t().scratch(l), kBytes);
            if (firstWrong(got.data(), kBytes, seed(s, l, false)) != -1) ++wrong_scratch;
            if (!reads_user) continue;
            r.t().read(l, b.nb.postedAddr(l, s), got.data(), kBytes);
            if (firstWrong(got.data(), kBytes, seed(s, l, true)) != -1) ++wrong_user;
          }
          b.nb.finish(s, !reads_user);
          // The call returns: its user buffer is the caller's again.
          if (reads_user) std::memset(user.data(), 0xdd, kBytes);
        }
        EXPECT_EQ(wrong_scratch, 0u);
        EXPECT_EQ(wrong_user, 0u);
      },
      o);
}

}  // namespace
}  // namespace hicoll
