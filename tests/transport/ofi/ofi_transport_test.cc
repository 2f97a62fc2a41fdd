// The libfabric transport with ranks as threads of one process, over loopback only (iface lo).
#include <gtest/gtest.h>
#include <rdma/fabric.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "../../common/thread_ranks.h"
#include "base/deadline.h"
#include "base/error.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/store.h"
#include "transport/ofi/fabric_lib.h"
#include "transport/ofi/fi_resources.h"
#include "transport/ofi/ofi_detail.h"
#include "transport/ofi/ofi_transport.h"

namespace hicoll {
namespace {

using ofi_detail::OfiTuning;
using Clock = std::chrono::steady_clock;

constexpr long kTimeoutMs = 5000;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

OfiOptions loopback(const std::string& provider) {
  OfiOptions o;
  o.provider = provider;
  o.iface = "lo";
  o.timeout_ms = kTimeoutMs;
  return o;
}

// FI_PROVIDER (process-wide) overrides the provider a test asks for.
bool providerOverridden() {
  const char* env = std::getenv("FI_PROVIDER");
  return env && *env;
}

bool providerAvailable(const std::string& prov) {
  fi_info* hints = fi_allocinfo();
  hints->caps = FI_TAGGED | FI_DIRECTED_RECV;
  hints->ep_attr->type = FI_EP_RDM;
  hints->fabric_attr->prov_name = strdup(prov.c_str());
  hints->domain_attr->name = strdup("lo");
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, hints, &info);
  fi_freeinfo(hints);
  if (info) fi_freeinfo(info);
  return rc == 0;
}

uint8_t pattern(size_t i, uint32_t seed) {
  return static_cast<uint8_t>(((i + 1) * 2654435761u + seed * 40503u) >> 11);
}

std::vector<uint8_t> makeData(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(i, seed);
  return v;
}

// Index of the first byte that differs from the pattern, or -1.
long firstWrong(const uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != pattern(i, seed)) return static_cast<long>(i);
  return -1;
}

void wait(Transport& t, std::vector<ReqId> reqs, long ms = kTimeoutMs) {
  waitAll(t, reqs, Deadline(ms), "ofi test");
}
void wait1(Transport& t, ReqId r, long ms = kTimeoutMs) {
  wait(t, {r}, ms);
}

// Runs fn(rank, bs, transport) on n threads; failures inside threads become test failures.
// Ranks meet at a barrier before closing their transports: with net (libfabric 1.17) a message
// whose sender closed its endpoint before the receive was matched is lost.
struct Rank {
  int rank, size;
  Bootstrap& bs;
  Transport& t;
  bool close_at_once = false;  // set by fn to skip the final barrier
};
void runRanks(int n, const std::function<void(Rank&)>& fn, const OfiOptions& opt, const OfiTuning& tuning = {}) {
  hctest::onRankThreads(n, "ofi-test", kTimeoutMs, [&](int r, Bootstrap& bs) {
    auto t = ofi_detail::makeOfiTransport(bs, opt, tuning);
    Rank ctx{r, n, bs, *t};
    fn(ctx);
    if (!ctx.close_at_once) bs.barrier();
  });
}

using hctest::expectError;

class OfiProviderTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!providerAvailable(GetParam())) GTEST_SKIP() << "libfabric provider " << GetParam() << " not available on lo";
  }
  OfiOptions opt() const { return loopback(GetParam()); }
};

TEST_P(OfiProviderTest, ChoosesRequestedProviderOnLoopback) {
  runRanks(
      2,
      [&](Rank& r) {
        auto info = ofi_detail::ofiInfo(r.t);
        if (!providerOverridden()) {
          EXPECT_EQ(info.provider, GetParam());
        }
        EXPECT_EQ(info.domain, "lo");
        EXPECT_EQ(info.address.find("127."), info.address.find("://") + 3) << info.address;
        EXPECT_GE(info.tag_bits, 63);
        EXPECT_STREQ(r.t.name(), "ofi");
        EXPECT_TRUE(r.t.canConnect(1 - r.rank));
        EXPECT_FALSE(r.t.canConnect(2));
        EXPECT_FALSE(r.t.canConnect(-1));
      },
      opt());
}

TEST_P(OfiProviderTest, PingPongSizes) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{4097}, size_t{1} << 20, size_t{64} << 20}) {
    SCOPED_TRACE(n);
    runRanks(
        2,
        [&](Rank& r) {
          const uint64_t tag = 7;
          if (r.rank == 0) {
            auto out = makeData(n, 11);
            std::vector<uint8_t> back(n, 0);
            auto t0 = Clock::now();
            wait1(r.t, r.t.isend(1, out.data(), n, tag));
            wait1(r.t, r.t.irecv(1, back.data(), n, tag + 1));
            double s = secondsSince(t0);
            EXPECT_EQ(out, back);
            if (n >= (size_t{64} << 20))
              std::printf("[ofi %s] 64 MiB ping-pong: %.1f ms round trip, %.2f GB/s per direction\n",
                          ofi_detail::ofiInfo(r.t).provider.c_str(), s * 1e3, 2.0 * n / s / 1e9);
          } else {
            std::vector<uint8_t> in(n, 0);
            wait1(r.t, r.t.irecv(0, in.data(), n, tag));
            EXPECT_EQ(firstWrong(in.data(), n, 11), -1);
            wait1(r.t, r.t.isend(0, in.data(), n, tag + 1));
          }
        },
        opt());
  }
}

TEST_P(OfiProviderTest, ManyOutstandingTagsMatchCorrectly) {
  constexpr int kMsgs = 200;
  auto size = [](int i) { return static_cast<size_t>((i * 7919) % 20000); };  // 0 .. ~20 KB, some rendezvous
  runRanks(
      2,
      [&](Rank& r) {
        const int peer = 1 - r.rank;
        std::vector<std::vector<uint8_t>> out(kMsgs), in(kMsgs);
        std::vector<ReqId> reqs;
        // Receives in reverse tag order, sends in tag order: only the tag can pair them.
        for (int i = kMsgs - 1; i >= 0; --i) {
          in[i].assign(size(i), 0);
          reqs.push_back(r.t.irecv(peer, in[i].data(), in[i].size(), 1000 + i));
        }
        for (int i = 0; i < kMsgs; ++i) {
          out[i] = makeData(size(i), static_cast<uint32_t>(r.rank * 100000 + i));
          reqs.push_back(r.t.isend(peer, out[i].data(), out[i].size(), 1000 + i));
        }
        wait(r.t, reqs);
        for (int i = 0; i < kMsgs; ++i)
          EXPECT_EQ(firstWrong(in[i].data(), in[i].size(), static_cast<uint32_t>(peer * 100000 + i)), -1)
              << "tag " << i;
      },
      opt());
}

// More operations than the provider's queues hold: posts see -FI_EAGAIN, progress, and retry.
TEST_P(OfiProviderTest, MoreOperationsThanTheQueueHolds) {
  constexpr int kMsgs = 5000;
  runRanks(
      2,
      [&](Rank& r) {
        std::vector<uint32_t> vals(kMsgs);
        std::vector<ReqId> reqs;
        reqs.reserve(kMsgs);
        if (r.rank == 0) {
          for (int i = 0; i < kMsgs; ++i) {
            vals[i] = static_cast<uint32_t>(i * 3 + 1);
            reqs.push_back(r.t.isend(1, &vals[i], sizeof(uint32_t), 11));
          }
          r.bs.barrier();  // every send is posted before the receiver posts anything
        } else {
          r.bs.barrier();
          for (int i = 0; i < kMsgs; ++i) reqs.push_back(r.t.irecv(0, &vals[i], sizeof(uint32_t), 11));
        }
        wait(r.t, reqs);
        if (r.rank == 1) {
          for (int i = 0; i < kMsgs; ++i) ASSERT_EQ(vals[i], static_cast<uint32_t>(i * 3 + 1)) << "message " << i;
        }
        std::printf("[ofi %s] rank %d: %llu posts retried after -FI_EAGAIN\n",
                    ofi_detail::ofiInfo(r.t).provider.c_str(), r.rank,
                    static_cast<unsigned long long>(ofi_detail::ofiInfo(r.t).post_retries));
      },
      opt());
}

TEST_P(OfiProviderTest, SameTagMessagesArriveInPostingOrder) {
  constexpr int kMsgs = 64;
  // Alternate small (eager) and large (rendezvous) messages: the order must hold across protocols.
  auto size = [](int i) { return i % 2 ? size_t{200000} : size_t{8}; };
  runRanks(
      2,
      [&](Rank& r) {
        std::vector<std::vector<uint8_t>> bufs(kMsgs);
        std::vector<ReqId> reqs;
        for (int i = 0; i < kMsgs; ++i) {
          if (r.rank == 0) {
            bufs[i] = makeData(size(i), static_cast<uint32_t>(i));
            reqs.push_back(r.t.isend(1, bufs[i].data(), size(i), 42));
          } else {
            bufs[i].assign(size(i), 0);
            reqs.push_back(r.t.irecv(0, bufs[i].data(), size(i), 42));
          }
        }
        wait(r.t, reqs);
        if (r.rank == 1) {
          for (int i = 0; i < kMsgs; ++i) EXPECT_EQ(firstWrong(bufs[i].data(), size(i), i), -1) << "message " << i;
        }
      },
      opt());
}

TEST_P(OfiProviderTest, ReceiveMatchesOnlyItsPeer) {
  runRanks(
      3,
      [&](Rank& r) {
        const uint64_t tag = 5;
        int32_t v = 100 + r.rank;
        if (r.rank == 1) {
          wait1(r.t, r.t.isend(0, &v, sizeof v, tag));
          r.bs.barrier();  // rank 1's message has been sent before rank 2 sends
          r.bs.barrier();
        } else if (r.rank == 2) {
          r.bs.barrier();
          r.bs.barrier();  // rank 0 checked that its receive from 2 is still pending
          wait1(r.t, r.t.isend(0, &v, sizeof v, tag));
        } else {
          int32_t from2 = -1, from1 = -1;
          ReqId q2 = r.t.irecv(2, &from2, sizeof from2, tag);
          r.bs.barrier();
          // Rank 1's message (same tag) is in flight or arrived: it must not satisfy q2.
          auto t0 = Clock::now();
          while (secondsSince(t0) < 0.2) ASSERT_FALSE(r.t.test(q2));
          r.bs.barrier();
          wait1(r.t, q2);
          wait1(r.t, r.t.irecv(1, &from1, sizeof from1, tag));
          EXPECT_EQ(from2, 102);
          EXPECT_EQ(from1, 101);
        }
      },
      opt());
}

TEST_P(OfiProviderTest, SizeMismatchIsAnErrorNamingThePeer) {
  // {sent, expected}: longer and shorter than the receive, eager and rendezvous sizes.
  const std::vector<std::pair<size_t, size_t>> cases = {{100, 64}, {32, 64}, {2 << 20, 1 << 20}, {1 << 20, 2 << 20}};
  for (auto [sent, expected] : cases) {
    SCOPED_TRACE(fmt::format("sent {} expected {}", sent, expected));
    runRanks(
        2,
        [&](Rank& r) {
          if (r.rank == 0) {
            auto out = makeData(sent, 3);
            // The sender may or may not hear of it, but must not hang.
            try {
              wait1(r.t, r.t.isend(1, out.data(), sent, 9));
            } catch (const Error& e) {
              EXPECT_NE(e.code(), hcTimeout) << e.what();
            }
            r.bs.barrier();
          } else {
            std::vector<uint8_t> in(expected);
            std::string msg = expectError([&] { wait1(r.t, r.t.irecv(0, in.data(), expected, 9)); }, hcInvalidUsage);
            EXPECT_NE(msg.find(fmt::format("size mismatch from rank 0")), std::string::npos) << msg;
            // Providers do not always say by how much a message overflowed (see ofi_transport.cc).
            bool exact = msg.find(fmt::format("expected {} got {} bytes", expected, sent)) != std::string::npos;
            bool more = sent > expected && msg.find(fmt::format("expected {} got more than {} bytes", expected,
                                                                expected)) != std::string::npos;
            EXPECT_TRUE(exact || more) << msg;
            EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
            EXPECT_NE(msg.find("tag 0x9"), std::string::npos) << msg;
            r.bs.barrier();
          }
        },
        opt());
  }
}

TEST_P(OfiProviderTest, SilentPeerTimesOut) {
  runRanks(
      2,
      [&](Rank& r) {
        if (r.rank == 1) {
          int32_t v = 0;
          ReqId q = r.t.irecv(0, &v, sizeof v, 77);
          auto t0 = Clock::now();
          std::vector<ReqId> reqs{q};
          std::string msg = expectError([&] { waitAll(r.t, reqs, Deadline(300), "silent peer"); }, hcTimeout);
          EXPECT_NE(msg.find("silent peer"), std::string::npos) << msg;
          EXPECT_LT(secondsSince(t0), 2.0);
          EXPECT_GE(secondsSince(t0), 0.29);
        }
        r.bs.barrier();
        // The receive is still posted: destruction must cancel it without waiting.
      },
      opt());
}

TEST_P(OfiProviderTest, AllToAll) {
  for (int n : {3, 4}) {
    SCOPED_TRACE(n);
    runRanks(
        n,
        [&](Rank& r) {
          auto size = [](int src, int dst) {
            return static_cast<size_t>(1000 * (src + 1) + 4099 * dst + (src == dst ? 0 : 65536));
          };
          auto seed = [](int src, int dst) { return static_cast<uint32_t>(src * 31 + dst); };
          std::vector<std::vector<uint8_t>> out(n), in(n);
          std::vector<ReqId> reqs;
          for (int p = 0; p < n; ++p) {
            in[p].assign(size(p, r.rank), 0);
            reqs.push_back(r.t.irecv(p, in[p].data(), in[p].size(), static_cast<uint64_t>(p * 64 + r.rank)));
          }
          for (int p = 0; p < n; ++p) {
            out[p] = makeData(size(r.rank, p), seed(r.rank, p));
            reqs.push_back(r.t.isend(p, out[p].data(), out[p].size(), static_cast<uint64_t>(r.rank * 64 + p)));
          }
          wait(r.t, reqs);
          for (int p = 0; p < n; ++p)
            EXPECT_EQ(firstWrong(in[p].data(), in[p].size(), seed(p, r.rank)), -1) << "from " << p;
        },
        opt());
  }
}

TEST_P(OfiProviderTest, AbortFailsOutstandingAndLaterCallsFast) {
  runRanks(
      2,
      [&](Rank& r) {
        if (r.rank == 1) {
          int32_t v = 0;
          ReqId q = r.t.irecv(0, &v, sizeof v, 3);
          std::vector<uint8_t> big(8 << 20, 1);
          ReqId s = r.t.isend(0, big.data(), big.size(), 4);  // rank 0 never receives it
          auto t0 = Clock::now();
          r.t.abort();
          expectError([&] { r.t.test(q); }, hcRemoteError);
          expectError([&] { r.t.test(s); }, hcRemoteError);
          std::string msg = expectError([&] { r.t.isend(0, &v, sizeof v, 5); }, hcRemoteError);
          EXPECT_NE(msg.find("aborted"), std::string::npos) << msg;
          EXPECT_NE(msg.find("tag 0x5"), std::string::npos) << msg;
          expectError([&] { r.t.irecv(0, &v, sizeof v, 5); }, hcRemoteError);
          expectError([&] { r.t.progress(); }, hcRemoteError);
          EXPECT_LT(secondsSince(t0), 0.5);
        }
        r.bs.barrier();
      },
      opt());
}

TEST_P(OfiProviderTest, AbortFromAnotherThreadEndsAWait) {
  runRanks(
      2,
      [&](Rank& r) {
        if (r.rank == 1) {
          int32_t v = 0;
          std::vector<ReqId> reqs{r.t.irecv(0, &v, sizeof v, 3)};
          std::thread watchdog([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            r.t.abort();
          });
          auto t0 = Clock::now();
          expectError([&] { waitAll(r.t, reqs, Deadline(kTimeoutMs), "aborted wait"); }, hcRemoteError);
          EXPECT_LT(secondsSince(t0), 1.0);
          watchdog.join();
        }
        r.bs.barrier();
      },
      opt());
}

// A peer that failed in a later call than this rank is in does not fail this one (the peer
// completed it): its notice is held until this rank reaches that call, then thrown at once.
thread_local uint64_t t_call = 0;

TEST_P(OfiProviderTest, NoticeFromALaterCallWaitsUntilThisRankGetsThere) {
  OfiOptions o = opt();
  o.call_now = [] { return t_call; };
  runRanks(
      2,
      [&](Rank& r) {
        if (r.t.tagBits() < 61) return;  // no failure notices (both ranks return)
        int32_t v = 41;
        if (r.rank == 1) {
          t_call = 5;
          r.t.announceFailure("rank 1: call 5 failed");
          wait1(r.t, r.t.isend(0, &v, sizeof v, 7));  // what call 4 still needed from rank 1
          r.bs.barrier();
          return;
        }
        t_call = 4;
        ReqId q = r.t.irecv(1, &v, sizeof v, 7);
        bool got = false;
        const auto t0 = Clock::now();
        try {
          while (secondsSince(t0) < 0.3) {  // notices are polled every 10 ms: many chances to throw
            r.t.checkFailureNotices();
            got = got || r.t.test(q);
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
        } catch (const Error& e) {
          ADD_FAILURE() << "call 4 failed on a notice from call 5: " << e.what();
        }
        EXPECT_TRUE(got);
        EXPECT_EQ(v, 41);
        t_call = 5;
        const std::string msg = expectError([&] { r.t.checkFailureNotices(); }, hcRemoteError);
        EXPECT_NE(msg.find("rank 1: call 5 failed"), std::string::npos) << msg;
        r.bs.barrier();
      },
      o);
}

TEST_P(OfiProviderTest, DestructionWithPendingTrafficIsBounded) {
  auto t0 = Clock::now();
  runRanks(
      2,
      [&](Rank& r) {
        std::vector<uint8_t> big(16 << 20, 2);
        int32_t v = 0;
        // Nobody receives the large send; nobody sends to the receive.
        r.t.isend(1 - r.rank, big.data(), big.size(), 100 + r.rank);
        r.t.irecv(1 - r.rank, &v, sizeof v, 200);
        for (int i = 0; i < 100; ++i) r.t.progress();
        r.bs.barrier();
      },
      opt());
  EXPECT_LT(secondsSince(t0), 5.0);
}

TEST_P(OfiProviderTest, DeadPeerBecomesAnErrorNotAHang) {
  runRanks(
      2,
      [&](Rank& r) {
        if (r.rank == 0) {
          r.bs.barrier();  // then rank 0's transport is destroyed (the function returns)
          r.close_at_once = true;
          return;
        }
        r.close_at_once = true;
        r.bs.barrier();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::vector<uint8_t> big(4 << 20, 1);
        int32_t v = 0;
        auto t0 = Clock::now();
        try {
          wait(r.t, {r.t.isend(0, big.data(), big.size(), 1), r.t.irecv(0, &v, sizeof v, 2)}, 1000);
          ADD_FAILURE() << "traffic with a closed peer completed";
        } catch (const Error& e) {
          EXPECT_TRUE(e.code() == hcRemoteError || e.code() == hcTimeout) << e.what();
        }
        EXPECT_LT(secondsSince(t0), 3.0);
      },
      opt());
}

TEST_P(OfiProviderTest, TagsOutsideTheProviderWidthAreRejected) {
  runRanks(
      2,
      [&](Rank& r) {
        const int bits = ofi_detail::ofiInfo(r.t).tag_bits;
        // Widest usable: all ones is the warm-up's, all ones - 1 the failure notices'.
        const uint64_t top = bits >= 64 ? ~0ull - 2 : (1ull << bits) - 3;
        uint64_t v = 0x1234, got = 0;
        if (r.rank == 0) wait1(r.t, r.t.isend(1, &v, sizeof v, top));
        else wait1(r.t, r.t.irecv(0, &got, sizeof got, top));
        if (r.rank == 1) {
          EXPECT_EQ(got, v);
        }
        if (bits < 64) {
          std::string msg = expectError([&] { r.t.isend(1 - r.rank, &v, sizeof v, 1ull << 63); }, hcInvalidArgument);
          EXPECT_NE(msg.find("tag bits"), std::string::npos) << msg;
        }
      },
      opt());
}

TEST_P(OfiProviderTest, SplitMessagesAboveMaxMsgSize) {
  OfiTuning tuning;
  tuning.max_msg_size = 64 << 10;
  runRanks(
      2,
      [&](Rank& r) {
        EXPECT_EQ(ofi_detail::ofiInfo(r.t).max_chunk, size_t{64} << 10);
        // Split and whole messages with one tag, in order; then a mismatch on a split message.
        const std::vector<size_t> sizes = {(1 << 20) + 3, 5, 64 << 10, (64 << 10) + 1, 0, 3 << 20};
        std::vector<std::vector<uint8_t>> bufs(sizes.size());
        std::vector<ReqId> reqs;
        for (size_t i = 0; i < sizes.size(); ++i) {
          if (r.rank == 0) {
            bufs[i] = makeData(sizes[i], static_cast<uint32_t>(i + 50));
            reqs.push_back(r.t.isend(1, bufs[i].data(), sizes[i], 8));
          } else {
            bufs[i].assign(sizes[i], 0);
            reqs.push_back(r.t.irecv(0, bufs[i].data(), sizes[i], 8));
          }
        }
        wait(r.t, reqs);
        if (r.rank == 1) {
          for (size_t i = 0; i < sizes.size(); ++i)
            EXPECT_EQ(firstWrong(bufs[i].data(), sizes[i], static_cast<uint32_t>(i + 50)), -1) << "message " << i;
        }
        // 100 KiB sent (two chunks) into a 200 KiB receive (four chunks): reported, and the two
        // unmatched receive chunks must not swallow the next message.
        std::vector<uint8_t> a(100 << 10, 1), b(200 << 10), c(16, 0);
        if (r.rank == 0) {
          wait1(r.t, r.t.isend(1, a.data(), a.size(), 9));
          r.bs.barrier();
          wait1(r.t, r.t.isend(1, c.data(), c.size(), 9));
        } else {
          std::string msg = expectError([&] { wait1(r.t, r.t.irecv(0, b.data(), b.size(), 9)); }, hcInvalidUsage);
          EXPECT_NE(msg.find("size mismatch from rank 0"), std::string::npos) << msg;
          r.bs.barrier();
          std::vector<uint8_t> got(16, 7);
          wait1(r.t, r.t.irecv(0, got.data(), got.size(), 9));
          EXPECT_EQ(got, c);
        }
      },
      opt(), tuning);
}

TEST_P(OfiProviderTest, LocalMrRegistrationOnTheFlyAndRegions) {
  OfiTuning tuning;
  tuning.force_local_mr = true;
  tuning.max_msg_size = 256 << 10;  // chunks of one message share one registration
  runRanks(
      2,
      [&](Rank& r) {
        const int peer = 1 - r.rank;
        std::vector<uint8_t> region(4 << 20);
        r.t.registerRegion(region.data(), region.size());
        r.t.registerRegion(region.data(), region.size());  // idempotent
        for (int round = 0; round < 3; ++round) {
          std::vector<uint8_t> out = makeData(1 << 20, 900 + r.rank + round), in(1 << 20, 0);
          // Unregistered buffers (registered on the fly) and the registered region, both directions.
          uint8_t* rin = region.data() + (1 << 20);
          uint8_t* rout = region.data() + (2 << 20);
          std::memcpy(rout, out.data(), out.size());
          wait(r.t, {r.t.irecv(peer, in.data(), in.size(), 1), r.t.isend(peer, out.data(), out.size(), 1),
                     r.t.irecv(peer, rin, 1 << 20, 2), r.t.isend(peer, rout, 1 << 20, 2)});
          EXPECT_EQ(firstWrong(in.data(), in.size(), 900 + peer + round), -1);
          EXPECT_EQ(firstWrong(rin, 1 << 20, 900 + peer + round), -1);
        }
        auto info = ofi_detail::ofiInfo(r.t);
        EXPECT_TRUE(info.local_mr);
        EXPECT_GE(info.mr_regs, 6u);      // in and out, three rounds
        EXPECT_GE(info.mr_reuses, 18u);   // the other three chunks of each registered message
        EXPECT_EQ(info.region_hits, 6u);  // region rin and rout, three rounds
      },
      opt(), tuning);
}

std::string paramName(const ::testing::TestParamInfo<std::string>& p) {
  std::string s;
  for (char c : p.param) s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
}
INSTANTIATE_TEST_SUITE_P(Providers, OfiProviderTest, ::testing::Values("tcp;ofi_rxm", "net"), paramName);

TEST(OfiTransport, RanksThatChooseDifferentProvidersFailClearly) {
  if (providerOverridden() || !providerAvailable("net") || !providerAvailable("tcp;ofi_rxm"))
    GTEST_SKIP() << "needs both tcp;ofi_rxm and net, and FI_PROVIDER unset";
  auto store = makeInMemoryStore();
  std::vector<std::string> msgs(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Bootstrap bs(store, "mix", r, 2, kTimeoutMs);
      msgs[r] = expectError([&] { makeOfiTransport(bs, loopback(r == 0 ? "tcp;ofi_rxm" : "net")); }, hcInvalidUsage);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NE(msgs[0].find("rank 1 chose provider 'net'"), std::string::npos) << msgs[0];
  EXPECT_NE(msgs[1].find("rank 0 chose provider 'tcp;ofi_rxm'"), std::string::npos) << msgs[1];
}

TEST(OfiTransport, UnknownProviderIsUnsupported) {
  if (providerOverridden()) GTEST_SKIP() << "FI_PROVIDER is set";
  auto store = makeInMemoryStore();
  Bootstrap bs(store, "none", 0, 1, kTimeoutMs);
  std::string msg = expectError([&] { makeOfiTransport(bs, loopback("no-such-provider")); }, hcUnsupported);
  EXPECT_NE(msg.find("no-such-provider"), std::string::npos) << msg;
}

// Run by ctest with FI_PROVIDER=net (libfabric reads it once per process): it wins over the
// provider the caller asks for.
TEST(OfiTransport, FiProviderEnvTakesPrecedence) {
  const char* env = std::getenv("FI_PROVIDER");
  if (!env || std::string(env) != "net") GTEST_SKIP() << "run with FI_PROVIDER=net";
  runRanks(
      2,
      [&](Rank& r) {
        EXPECT_EQ(ofi_detail::ofiInfo(r.t).provider, "net");
        int32_t v = 10 + r.rank, got = -1;
        wait(r.t, {r.t.irecv(1 - r.rank, &got, sizeof got, 1), r.t.isend(1 - r.rank, &v, sizeof v, 1)});
        EXPECT_EQ(got, 11 - r.rank);
      },
      loopback("tcp;ofi_rxm"));
}

// The one rule for which provider hicoll asks libfabric for (the transport and the device
// path's FI_HMEM probe both call it): FI_PROVIDER when it names one provider, else the knob; a
// list or an exclusion is libfabric's filter, not a name.
TEST(OfiProvider, OneRuleForEveryUser) {
  const char* saved = std::getenv("FI_PROVIDER");
  const std::string keep = saved ? saved : "";
  auto with = [](const char* env, const std::string& knob) {
    if (env) setenv("FI_PROVIDER", env, 1);
    else unsetenv("FI_PROVIDER");
    return ofi::resolveProvider(knob);
  };
  EXPECT_EQ(with(nullptr, ""), "tcp;ofi_rxm");
  EXPECT_EQ(with(nullptr, "net"), "net");
  EXPECT_EQ(with("net", "tcp;ofi_rxm"), "net");
  EXPECT_EQ(with("^psm2", "tcp;ofi_rxm"), "tcp;ofi_rxm");
  EXPECT_EQ(with("^psm2", ""), "tcp;ofi_rxm");
  EXPECT_EQ(with("tcp,net", "net"), "net");
  if (saved) setenv("FI_PROVIDER", keep.c_str(), 1);
  else unsetenv("FI_PROVIDER");
}

// Runs this test binary again, with the rxm variables hicoll sets and the knobs behind them
// cleared, then `env` and HC_LOAD_PROBE=1 (where the test named by filter only prints what it
// found); returns what it printed.
std::string probeAtLoad(const char* filter, const std::string& env) {
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return "readlink failed";
  const std::string cmd =
      std::string("env -u FI_OFI_RXM_EAGER_LIMIT -u FI_OFI_RXM_MSG_RX_SIZE -u FI_OFI_RXM_BUFFER_SIZE ") +
      "-u FI_PROVIDER -u HICOLL_OFI_PROVIDER -u HICOLL_NET_CHUNK_SIZE -u HICOLL_CHUNK_SIZE -u HICOLL_ALGO " +
      "-u HICOLL_OFI_RXM_EAGER -u HICOLL_OFI_RXM_LEAN HC_LOAD_PROBE=1 " + env + " " + self +
      " --gtest_filter=" + filter + " 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  return out;
}

// Each {env, expected}: probeAtLoad(filter, env) printed expected.
void expectAtLoad(const char* filter, std::initializer_list<std::pair<const char*, const char*>> cases) {
  for (const auto& [env, expect] : cases) {
    const std::string out = probeAtLoad(filter, env);
    EXPECT_NE(out.find(expect), std::string::npos) << "with '" << env << "': expected " << expect << ", got\n" << out;
  }
}

// HICOLL_OFI_RXM_EAGER: FI_OFI_RXM_EAGER_LIMIT is set when the library loads (a setenv after
// threads exist races their getenv), for rxm only, unless the user set it.
TEST(OfiTransport, RxmEagerLimitIsSetAtLoadForRxmOnly) {
  if (std::getenv("HC_LOAD_PROBE")) {
    const char* v = std::getenv("FI_OFI_RXM_EAGER_LIMIT");
    std::printf("EAGER=%s BY_HICOLL=%d\n", v ? v : "none", ofi::rxmEagerLimitSetByHicoll() ? 1 : 0);
    return;
  }
  expectAtLoad("OfiTransport.RxmEagerLimitIsSetAtLoadForRxmOnly",
               {
                   {"", "EAGER=1048576 BY_HICOLL=1"},  // the model may raise the chunk to HICOLL_CHUNK_SIZE
                   {"HICOLL_NET_CHUNK_SIZE=65536", "EAGER=65536 BY_HICOLL=1"},
                   {"HICOLL_ALGO=ring", "EAGER=262144 BY_HICOLL=1"},
                   {"HICOLL_CHUNK_SIZE=2M", "EAGER=2097152 BY_HICOLL=1"},
                   {"HICOLL_OFI_RXM_EAGER=0", "EAGER=none BY_HICOLL=0"},
                   {"FI_PROVIDER=net", "EAGER=none BY_HICOLL=0"},
                   {"HICOLL_OFI_PROVIDER=net", "EAGER=none BY_HICOLL=0"},
                   {"FI_OFI_RXM_EAGER_LIMIT=4096", "EAGER=4096 BY_HICOLL=0"},
                   {"HICOLL_NET_CHUNK_SIZE=junk", "EAGER=none BY_HICOLL=0"},  // reported at creation, not at load
               });
}

// HICOLL_OFI_RXM_LEAN: rxm's receive buffers (count and size) are set when the library loads,
// for rxm only, each unless the user set it; the eager limit the ranks agree on follows the
// buffers' size when no limit is set (rxm's rule).
TEST(OfiTransport, RxmReceiveBuffersAreSetAtLoadForRxmOnly) {
  if (std::getenv("HC_LOAD_PROBE")) {
    const char* rx = std::getenv("FI_OFI_RXM_MSG_RX_SIZE");
    const char* buf = std::getenv("FI_OFI_RXM_BUFFER_SIZE");
    const char* knob = std::getenv("HICOLL_OFI_PROVIDER");
    std::printf("RX=%s BUF=%s LIMIT=%zu\n", rx ? rx : "none", buf ? buf : "none",
                ofiEagerLimit(loopback(knob ? knob : "")));
    return;
  }
  expectAtLoad("OfiTransport.RxmReceiveBuffersAreSetAtLoadForRxmOnly",
               {
                   {"", "RX=1024 BUF=8192 LIMIT=1048576"},
                   {"HICOLL_OFI_RXM_EAGER=0", "RX=1024 BUF=8192 LIMIT=8192"},
                   {"HICOLL_OFI_RXM_LEAN=0", "RX=none BUF=none LIMIT=1048576"},
                   {"HICOLL_OFI_RXM_LEAN=0 HICOLL_OFI_RXM_EAGER=0", "RX=none BUF=none LIMIT=16384"},
                   {"FI_OFI_RXM_BUFFER_SIZE=16384", "RX=1024 BUF=16384 LIMIT=1048576"},
                   {"FI_OFI_RXM_MSG_RX_SIZE=4096", "RX=4096 BUF=8192 LIMIT=1048576"},
                   {"FI_PROVIDER=net", "RX=none BUF=none LIMIT=0"},
                   {"HICOLL_OFI_PROVIDER=net", "RX=none BUF=none LIMIT=0"},
                   {"HICOLL_OFI_RXM_LEAN=junk", "RX=none BUF=none"},  // reported at creation, not at load
               });
}

// Messages at and above the eager limit hicoll sets arrive intact.
TEST(OfiTransport, RxmMessagesAroundTheEagerLimitArrive) {
  runRanks(
      2,
      [](Rank& r) {
        for (size_t len : {size_t{262144}, size_t{300000}, size_t{1048576}, size_t{1048577}}) {
          auto out = makeData(len, 7 + r.rank), in = std::vector<uint8_t>(len);
          wait(r.t, {r.t.irecv(1 - r.rank, in.data(), len, 2), r.t.isend(1 - r.rank, out.data(), len, 2)});
          EXPECT_EQ(in, makeData(len, 8 - r.rank)) << len << " bytes";
        }
      },
      loopback("tcp;ofi_rxm"));
}

TEST(OfiTransport, SingleRankSendsToItself) {
  runRanks(
      1,
      [&](Rank& r) {
        auto out = makeData(300000, 5);
        std::vector<uint8_t> in(out.size());
        wait(r.t, {r.t.irecv(0, in.data(), in.size(), 1), r.t.isend(0, out.data(), out.size(), 1)});
        EXPECT_EQ(in, out);
      },
      loopback("tcp;ofi_rxm"));
}

}  // namespace
}  // namespace hicoll
