// The shared-memory transport's point-to-point side with ranks as threads of one process:
// messages, ordering, length mismatches, peek, peer reads, ranks of two nodes. Every message
// test runs with both copy paths (ShmCopyModes). Aborts and failures: shm_failure_test.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "shm_test_util.h"

namespace hicoll {
namespace {

using namespace shmtest;

class ShmP2p : public ShmCopyModes {};

// Every ordered pair of 2, 3 and 4 ranks, sizes from empty to several bounce rings.
TEST_P(ShmP2p, SizesBetweenEveryPairArriveByteForByte) {
  const std::vector<size_t> sizes = {0, 1, 4096, kBounce, kBounce + 1, (1 << 20) + 3};
  auto seed = [](int src, int dst, size_t i) { return static_cast<uint32_t>(src * 1000 + dst * 100 + i); };
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    runRanks(
        n,
        [&](Rank& r) {
          EXPECT_STREQ(r.t().name(), "shm");
          EXPECT_EQ(r.t().localSize(), n);
          EXPECT_EQ(r.t().localIndex(), r.rank);
          EXPECT_EQ(r.t().directRead(), GetParam() != "0");
          std::vector<std::vector<uint8_t>> out, in;
          std::vector<ReqId> reqs;
          for (int p = 0; p < n; ++p) {
            if (p == r.rank) continue;
            EXPECT_TRUE(r.t().canConnect(p));
            for (size_t i = 0; i < sizes.size(); ++i) {
              in.emplace_back(sizes[i], 0);
              reqs.push_back(r.t().irecv(p, in.back().data(), sizes[i], 10 + i));
              out.push_back(makeData(sizes[i], seed(r.rank, p, i)));
              reqs.push_back(r.t().isend(p, out.back().data(), sizes[i], 10 + i));
            }
          }
          waitReqs(r.t(), reqs);
          size_t k = 0;
          for (int p = 0; p < n; ++p) {
            if (p == r.rank) continue;
            for (size_t i = 0; i < sizes.size(); ++i, ++k) {
              ASSERT_EQ(in[k].size(), sizes[i]);
              EXPECT_EQ(firstWrong(in[k].data(), sizes[i], seed(p, r.rank, i)), -1)
                  << sizes[i] << " bytes from rank " << p;
            }
          }
        },
        opt());
  }
}

// More messages than the queue has descriptors, alternating sizes below and above one ring,
// all with one tag and all sent before any receive is posted: they arrive in posting order.
TEST_P(ShmP2p, SameTagMessagesArriveInPostingOrder) {
  constexpr int kMsgs = 3 * kQueueDepth + 5;
  auto size = [](int i) { return i % 3 == 2 ? kBounce + 7 : static_cast<size_t>(8 + i); };
  runRanks(
      2,
      [&](Rank& r) {
        std::vector<std::vector<uint8_t>> bufs(kMsgs);
        std::vector<ReqId> reqs;
        if (r.rank == 0) {
          for (int i = 0; i < kMsgs; ++i) {
            bufs[i] = makeData(size(i), static_cast<uint32_t>(i));
            reqs.push_back(r.t().isend(1, bufs[i].data(), size(i), 42));
          }
          r.bs.barrier();
        } else {
          r.bs.barrier();  // every send is posted (or waits for a descriptor) before any receive
          for (int i = 0; i < kMsgs; ++i) {
            bufs[i].assign(size(i), 0);
            reqs.push_back(r.t().irecv(0, bufs[i].data(), size(i), 42));
          }
        }
        waitReqs(r.t(), reqs);
        if (r.rank == 1) {
          for (int i = 0; i < kMsgs; ++i)
            EXPECT_EQ(firstWrong(bufs[i].data(), size(i), static_cast<uint32_t>(i)), -1) << "message " << i;
        }
      },
      opt());
}

// A receive posted before its send, and one posted after it (the send's descriptor already in
// the queue), small and larger than a ring.
TEST_P(ShmP2p, ReceivePostedBeforeOrAfterTheSend) {
  for (size_t n : {size_t{13}, 3 * kBounce + 5}) {
    SCOPED_TRACE(n);
    runRanks(
        2,
        [&](Rank& r) {
          auto out = makeData(n, 21), out2 = makeData(n, 22);
          std::vector<uint8_t> in(n, 0), in2(n, 0);
          if (r.rank == 1) {
            ReqId q = r.t().irecv(0, in.data(), n, 1);
            r.bs.barrier();  // receive posted; rank 0 sends now
            waitReqs(r.t(), {q});
            r.bs.barrier();  // rank 0 posts its second send
            r.bs.barrier();
            waitReqs(r.t(), {r.t().irecv(0, in2.data(), n, 2)});
            EXPECT_EQ(firstWrong(in.data(), n, 21), -1);
            EXPECT_EQ(firstWrong(in2.data(), n, 22), -1);
          } else {
            r.bs.barrier();
            waitReqs(r.t(), {r.t().isend(1, out.data(), n, 1)});
            r.bs.barrier();
            ReqId s = r.t().isend(1, out2.data(), n, 2);
            EXPECT_FALSE(r.t().test(s));  // nobody has received it yet
            r.bs.barrier();
            waitReqs(r.t(), {s});
          }
        },
        opt());
  }
}

// A receive must have the sent length: an error naming the peer, both lengths and both tags.
TEST_P(ShmP2p, LengthMismatchIsAnErrorNamingThePeerAndBothLengths) {
  const std::vector<std::pair<size_t, size_t>> cases = {{100, 64}, {32, 64}, {0, 8}, {kBounce + 1, 4096}};
  for (auto [sent, expected] : cases) {
    SCOPED_TRACE(std::to_string(sent) + " sent, " + std::to_string(expected) + " expected");
    runRanks(
        2,
        [&, sent = sent, expected = expected](Rank& r) {
          auto out = makeData(sent, 3);
          std::vector<uint8_t> in(expected, 0xee);
          if (r.rank == 0) {
            r.t().isend(1, out.data(), sent, 9);  // never taken: not waited for
            r.bs.barrier();
            r.bs.barrier();
            return;
          }
          r.bs.barrier();
          const auto t0 = Clock::now();
          std::string msg =
              expectError([&] { waitReqs(r.t(), {r.t().irecv(0, in.data(), expected, 9)}); }, hcInvalidUsage);
          EXPECT_LT(secondsSince(t0), 1.0);
          EXPECT_NE(msg.find("message mismatch from rank 0"), std::string::npos) << msg;
          EXPECT_NE(msg.find("it sent " + std::to_string(sent) + " bytes with tag 0x9"), std::string::npos) << msg;
          EXPECT_NE(msg.find("this rank expected " + std::to_string(expected) + " bytes with tag 0x9"),
                    std::string::npos)
              << msg;
          // Not a truncation: nothing was copied.
          EXPECT_EQ(in, std::vector<uint8_t>(expected, 0xee));
          r.bs.barrier();
        },
        opt());
  }
}

// Receives from one peer take its messages in posting order: a receive whose tag is not the
// next message's is the same error (shm does not search ahead by tag, unlike ofi).
TEST_P(ShmP2p, ReceiveForAnotherTagThanTheNextMessageIsAnError) {
  runRanks(
      2,
      [&](Rank& r) {
        uint32_t a = 1, b = 2, got = 0;
        if (r.rank == 0) {
          r.t().isend(1, &a, sizeof a, 0x10);
          r.t().isend(1, &b, sizeof b, 0x11);
          r.bs.barrier();
          r.bs.barrier();
          return;
        }
        r.bs.barrier();
        std::string msg =
            expectError([&] { waitReqs(r.t(), {r.t().irecv(0, &got, sizeof got, 0x11)}); }, hcInvalidUsage);
        EXPECT_NE(msg.find("it sent 4 bytes with tag 0x10, this rank expected 4 bytes with tag 0x11"),
                  std::string::npos)
            << msg;
        EXPECT_EQ(got, 0u);
        r.bs.barrier();
      },
      opt());
}

TEST_P(ShmP2p, PeekShowsTheNextUnreceivedMessage) {
  runRanks(
      3,
      [&](Rank& r) {
        uint64_t tag = 77;
        size_t len = 77;
        std::vector<uint8_t> a = makeData(100, 1), got(100, 0);
        uint8_t empty = 0;
        if (r.rank == 0) {
          EXPECT_FALSE(r.t().peek(1, &tag, &len));  // nothing sent to rank 0
          r.bs.barrier();
          ReqId s1 = r.t().isend(1, a.data(), a.size(), 5);
          ReqId s2 = r.t().isend(1, &empty, 0, 6);
          r.bs.barrier();  // both posted
          waitReqs(r.t(), {s1, s2});
          r.bs.barrier();
          return;
        }
        if (r.rank == 2) {
          r.bs.barrier();
          r.bs.barrier();
          r.bs.barrier();
          return;
        }
        EXPECT_FALSE(r.t().peek(0, &tag, &len));
        EXPECT_EQ(tag, 77u);  // untouched when there is nothing
        EXPECT_EQ(len, 77u);
        r.bs.barrier();
        r.bs.barrier();
        ASSERT_TRUE(r.t().peek(0, &tag, &len));
        EXPECT_EQ(tag, 5u);
        EXPECT_EQ(len, 100u);
        EXPECT_FALSE(r.t().peek(2, &tag, &len));  // per peer: rank 2 sent nothing
        ASSERT_TRUE(r.t().peek(0, &tag, &len));   // peeking takes nothing
        EXPECT_EQ(tag, 5u);
        ReqId q = r.t().irecv(0, got.data(), got.size(), 5);
        ASSERT_TRUE(r.t().peek(0, &tag, &len));  // a posted receive not yet matched: still the first
        EXPECT_EQ(tag, 5u);
        EXPECT_EQ(len, 100u);
        waitReqs(r.t(), {q});
        EXPECT_EQ(got, a);
        ASSERT_TRUE(r.t().peek(0, &tag, &len));
        EXPECT_EQ(tag, 6u);
        EXPECT_EQ(len, 0u);
        waitReqs(r.t(), {r.t().irecv(0, &empty, 0, 6)});
        EXPECT_FALSE(r.t().peek(0, &tag, &len));
        r.bs.barrier();
      },
      opt());
}

// Peer reads: a peer's user buffer (its address in the peer's process) and its scratch buffer
// (in its segment), whole and in part.
TEST_P(ShmP2p, ReadCopiesAPeersBuffer) {
  ShmOptions o = opt();
  o.scratch_bytes = 100000;
  o.sort_bytes = 5000;
  runRanks(
      3,
      [&](Rank& r) {
        constexpr size_t kLen = 300001;
        auto mine = makeData(kLen, 500 + r.rank);
        auto scratch = makeData(o.scratch_bytes, 600 + r.rank);
        std::memcpy(r.t().scratch(r.rank), scratch.data(), scratch.size());
        std::memset(r.t().sort(r.rank), 0x40 + r.rank, o.sort_bytes);
        // A path that could not read at all would have to say so: directRead() is the switch.
        EXPECT_EQ(r.t().directRead(), GetParam() != "0");
        struct Where {
          uint64_t user, scratch;
        };
        const auto where = allgatherValue(
            r.bs, Where{reinterpret_cast<uint64_t>(mine.data()), reinterpret_cast<uint64_t>(r.t().scratch(r.rank))});
        for (int p = 0; p < r.size; ++p) {
          if (p == r.rank) continue;
          SCOPED_TRACE("peer " + std::to_string(p));
          std::vector<uint8_t> got(kLen, 0);
          r.t().read(p, reinterpret_cast<const void*>(where[p].user), got.data(), kLen);
          EXPECT_EQ(firstWrong(got.data(), kLen, 500 + p), -1);
          std::vector<uint8_t> part(1000, 0);
          r.t().read(p, reinterpret_cast<const void*>(where[p].user + 4097), part.data(), part.size());
          for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], pattern(4097 + i, 500 + p)) << i;
          uint8_t untouched = 0x5a;
          r.t().read(p, reinterpret_cast<const void*>(where[p].user), &untouched, 0);
          EXPECT_EQ(untouched, 0x5a);
          // The peer's segment, through read() and as mapped here.
          std::vector<uint8_t> s(o.scratch_bytes, 0);
          r.t().read(p, reinterpret_cast<const void*>(where[p].scratch), s.data(), s.size());
          EXPECT_EQ(firstWrong(s.data(), s.size(), 600 + p), -1);
          EXPECT_EQ(firstWrong(reinterpret_cast<const uint8_t*>(r.t().scratch(p)), o.scratch_bytes, 600 + p), -1);
          EXPECT_EQ(static_cast<uint8_t>(r.t().sort(p)[o.sort_bytes - 1]), 0x40 + p);
        }
        r.bs.barrier();  // nobody frees a buffer a peer still reads
      },
      o);
}

INSTANTIATE_TEST_SUITE_P(CopyModes, ShmP2p, ::testing::Values("auto", "0"), copyModeName);

// Ranks of two nodes: each transport connects only the ranks of its own node.
TEST(ShmTransport, ConnectsOnlyTheRanksOfItsNode) {
  runRanks(4,
           [&](Rank& r) {
             const int node = r.rank % 2;
             EXPECT_EQ(r.t().localSize(), 2);
             EXPECT_EQ(r.t().localIndex(), r.rank / 2);
             EXPECT_EQ(r.t().commRank(0), node);
             EXPECT_EQ(r.t().commRank(1), node + 2);
             for (int p = 0; p < 4; ++p) EXPECT_EQ(r.t().canConnect(p), p % 2 == node) << "peer " << p;
             EXPECT_FALSE(r.t().canConnect(4));
             EXPECT_FALSE(r.t().canConnect(-1));
             // Local indices are not communicator ranks: rank 2 (local 1 of node 0) talks to rank 0.
             const int peer = r.rank < 2 ? r.rank + 2 : r.rank - 2;
             int32_t v = 100 + r.rank, got = -1;
             waitReqs(r.t(), {r.t().irecv(peer, &got, sizeof got, 1), r.t().isend(peer, &v, sizeof v, 1)});
             EXPECT_EQ(got, 100 + peer);
           },
           ShmOptions{}, {0, 1, 0, 1});
}

}  // namespace
}  // namespace hicoll