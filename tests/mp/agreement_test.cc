// Tier 3: ranks that disagree about a call fail it, every one of them, fast, naming who
// called what; nothing returns hcSuccess with wrong data, and a rank that rejects its own
// arguments makes its peers fail that same call instead of pairing with its next one.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include "../common/mp.h"
#include "checks.h"

namespace hctest {
namespace {

struct Layout {
  const char* name;
  int nranks;
  std::vector<std::string> node;
};

std::vector<Layout> layouts() {
  return {{"1x2", 2, contiguous(1, 2)},
          {"2x1", 2, contiguous(2, 1)},
          {"2x2", 4, contiguous(2, 2)},
          {"2x2i", 4, interleaved(2, 2)}};
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `call` on every rank of every layout; the ranks of the last node (or rank W-1 on one
// node) pass the "odd" arguments. Every rank must fail within 3 s (HICOLL_TIMEOUT_MS is 20 s)
// with hcInvalidUsage or hcRemoteError, and the rank that saw it must name both calls.
// small_broadcast: the call is a Broadcast staged on one node, rooted at W-1 by the odd ranks
// and at 0 by the others; a rank that is its root by its own arguments may return once its
// data is staged (HICOLL_BCAST_ROOT_WAITS=0), and then its next call fails, naming the
// Broadcast.
void expectEveryRankFails(const char* what, const std::function<hcResult_t(hcComm_t, int rank, bool odd)>& call,
                          const char* must_mention, bool small_broadcast = false) {
  for (const Layout& lay : layouts()) {
    Job job;
    job.nranks = lay.nranks;
    job.node = lay.node;
    job.env["HICOLL_TIMEOUT_MS"] = "20000";
    job.timeout_s = 60;
    auto st = run(job, [&](int rank, hcComm_t comm) {
      const bool odd =
          lay.node[rank] == lay.node.back() && (lay.node.front() != lay.node.back() || rank == lay.nranks - 1);
      auto t0 = std::chrono::steady_clock::now();
      hcResult_t r = call(comm, rank, odd);
      const bool one_node = lay.node.front() == lay.node.back();
      const bool deferred = r == hcSuccess && small_broadcast && one_node && rank == (odd ? lay.nranks - 1 : 0);
      if (deferred) {
        t0 = std::chrono::steady_clock::now();
        int32_t x = 1;
        r = hcAllReduce(&x, &x, 1, hcInt32, hcSum, comm, nullptr);
      }
      const double took = since(t0);
      const std::string msg = hcGetLastError(comm);
      std::fprintf(stderr, "[%s %s rank %d] %s%s in %.2f s: %s\n", what, lay.name, rank, deferred ? "next call " : "",
                   hcGetErrorString(r), took, msg.c_str());
      if (r == hcSuccess) return 11;
      if (deferred && msg.find("earlier call, Broadcast") == std::string::npos) return 16;
      if (r != hcInvalidUsage && r != hcRemoteError) return 12;
      if (took > 3.0) return 13;
      if (r == hcInvalidUsage &&
          (msg.find(" called ") == std::string::npos || msg.find(must_mention) == std::string::npos))
        return 14;
      // The communicator is unusable afterwards, on every rank, at once.
      int32_t x = 1;
      if (hcAllReduce(&x, &x, 1, hcInt32, hcSum, comm, nullptr) == hcSuccess) return 15;
      return 0;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << what << " " << lay.name << " rank " << r;
  }
}

TEST(Agreement, DifferentReductionOps) {
  expectEveryRankFails(
      "allreduce sum/max",
      [](hcComm_t comm, int rank, bool odd) {
        std::vector<float> x(1000, static_cast<float>(rank + 1));
        return hcAllReduce(x.data(), x.data(), x.size(), hcFloat32, odd ? hcMax : hcSum, comm, nullptr);
      },
      "reduction op");
  expectEveryRankFails(
      "reducescatter sum/min",
      [](hcComm_t comm, int rank, bool odd) {
        int W = 0;
        hcCommCount(comm, &W);
        std::vector<float> in(W * 4096, 1.0f), out(4096);
        return hcReduceScatter(in.data(), out.data(), out.size(), hcFloat32, odd ? hcMin : hcSum, comm, nullptr);
      },
      "reduction op");
}

TEST(Agreement, DatatypesOfTheSameSize) {
  expectEveryRankFails(
      "allreduce float32/int32",
      [](hcComm_t comm, int, bool odd) {
        std::vector<float> x(1 << 16, 1.0f);
        return hcAllReduce(x.data(), x.data(), x.size(), odd ? hcInt32 : hcFloat32, hcSum, comm, nullptr);
      },
      "datatype");
  expectEveryRankFails(
      "allgather float32/int32",
      [](hcComm_t comm, int, bool odd) {
        int W = 0;
        hcCommCount(comm, &W);
        std::vector<float> in(100, 1.0f), out(W * 100);
        return hcAllGather(in.data(), out.data(), in.size(), odd ? hcInt32 : hcFloat32, comm, nullptr);
      },
      "datatype");
}

TEST(Agreement, CountsThatDiffer) {
  expectEveryRankFails(
      "allreduce 100000/100001",
      [](hcComm_t comm, int, bool odd) {
        std::vector<float> x(100001, 1.0f);
        return hcAllReduce(x.data(), x.data(), odd ? 100001 : 100000, hcFloat32, hcSum, comm, nullptr);
      },
      "count");
  // Small enough that the descriptor rides on the first message: the rank that receives the
  // longer one must still name the calls, or relay the peer's notice that does.
  expectEveryRankFails(
      "allgather 3000/3001",
      [](hcComm_t comm, int, bool odd) {
        int W = 0;
        hcCommCount(comm, &W);
        std::vector<float> in(3001, 1.0f), out(W * 3001);
        return hcAllGather(in.data(), out.data(), odd ? 3001 : 3000, hcFloat32, comm, nullptr);
      },
      "count");
}

TEST(Agreement, DifferentCollectivesDoNotWaitForTheTimeout) {
  expectEveryRankFails(
      "allgather/reducescatter",
      [](hcComm_t comm, int, bool odd) {
        int W = 0;
        hcCommCount(comm, &W);
        std::vector<float> big(W * 1024, 1.0f), small(1024, 1.0f);
        return odd ? hcReduceScatter(big.data(), small.data(), 1024, hcFloat32, hcSum, comm, nullptr)
                   : hcAllGather(small.data(), big.data(), 1024, hcFloat32, comm, nullptr);
      },
      "collective");
}

TEST(Agreement, BroadcastRoots) {
  expectEveryRankFails(
      "broadcast root",
      [](hcComm_t comm, int rank, bool odd) {
        int W = 0;
        hcCommCount(comm, &W);
        std::vector<int32_t> x(5000, rank);
        return hcBroadcast(x.data(), x.data(), x.size(), hcInt32, odd ? W - 1 : 0, comm, nullptr);
      },
      "root", /*small_broadcast=*/true);
}

// A small Broadcast's root on one node returns once its data is staged: its peers check the
// call at once, the root at its next call (which waits for them) or at hcCommDestroy (which
// finds the peers that destroyed their communicator without the call), which fail naming the
// Broadcast. With HICOLL_BCAST_ROOT_WAITS=1 the root's call fails itself.
TEST(Agreement, SmallBroadcastRootLearnsAtItsNextCall) {
  enum Next { kCall, kDestroy };
  for (int L : {2, 3})
    for (const char* waits : {"0", "1"})
      for (Next next : {kCall, kDestroy}) {
        // kDestroy: the peers destroy their communicator instead of calling (no disagreement
        // to find on the board: the root finds them gone).
        Job job;
        job.nranks = L;
        job.env["HICOLL_TIMEOUT_MS"] = "20000";
        job.env["HICOLL_BCAST_ROOT_WAITS"] = waits;
        job.timeout_s = 60;
        const bool root_waits = waits[0] == '1';
        auto st = runRaw(job, [&](int rank) {
          hcComm_t comm = nullptr;
          if (hcCommInitFromEnv(&comm) != hcSuccess) return 2;
          std::vector<float> a(4 * L, 1.0f), b(4 * L);
          const char* tag = next == kCall ? "call" : "destroy";
          if (rank != 0) {
            if (next == kDestroy) return hcCommDestroy(comm) == hcSuccess ? 0 : 3;
            const hcResult_t r = hcAllGather(a.data(), b.data(), 4, hcFloat32, comm, nullptr);
            const std::string msg = hcGetLastError(comm);
            std::fprintf(stderr, "[bcast %s 1x%d waits=%s rank %d] %s: %s\n", tag, L, waits, rank, hcGetErrorString(r),
                         msg.c_str());
            hcCommDestroy(comm);
            return r == hcInvalidUsage && msg.find("Broadcast") != std::string::npos ? 0 : 11;
          }
          auto t0 = std::chrono::steady_clock::now();
          hcResult_t r = hcBroadcast(a.data(), b.data(), 4, hcFloat32, 0, comm, nullptr);
          std::string msg = hcGetLastError(comm);
          std::fprintf(stderr, "[bcast %s 1x%d waits=%s rank 0] Broadcast: %s in %.2f s: %s\n", tag, L, waits,
                       hcGetErrorString(r), since(t0), msg.c_str());
          if (root_waits) {
            hcCommDestroy(comm);
            return r != hcSuccess && since(t0) < 3.0 ? 0 : 12;
          }
          if (r != hcSuccess) return 13;
          // hcCommDestroy waits for nobody: it finds the peers gone once they are.
          if (next == kDestroy) usleep(300000);
          t0 = std::chrono::steady_clock::now();
          r = next == kCall ? hcAllReduce(a.data(), b.data(), 4, hcFloat32, hcSum, comm, nullptr) : hcCommDestroy(comm);
          msg = hcGetLastError(comm);
          std::fprintf(stderr, "[bcast %s 1x%d waits=%s rank 0] then %s in %.2f s: %s\n", tag, L, waits,
                       hcGetErrorString(r), since(t0), msg.c_str());
          if (next == kCall) hcCommDestroy(comm);
          if (r == hcSuccess || since(t0) > 3.0) return 14;
          return msg.find("earlier call, Broadcast") != std::string::npos ? 0 : 15;
        });
        for (int r = 0; r < job.nranks; ++r)
          EXPECT_EQ(st[r], 0) << "1x" << L << " waits=" << waits << (next == kCall ? " call" : " destroy") << " rank "
                              << r;
      }
}

TEST(Agreement, PreMulSumScalars) {
  expectEveryRankFails(
      "premulsum scalar",
      [](hcComm_t comm, int, bool odd) {
        float scalar = odd ? 0.5f : 0.25f;
        hcRedOp_t op;
        if (hcRedOpCreatePreMulSum(&op, &scalar, hcFloat32, comm) != hcSuccess) return hcInternalError;
        std::vector<float> x(2048, 1.0f);
        return hcAllReduce(x.data(), x.data(), x.size(), hcFloat32, op, comm, nullptr);
      },
      "scalar");
}

// A quantized AllGather's block, its datatype, and quantized against exact: each is a
// disagreement the node board and the network both catch.
TEST(Agreement, QuantizedAllGathers) {
  auto gather = [](hcComm_t comm, hcDataType_t t, size_t block, bool quantized) {
    int W = 0;
    hcCommCount(comm, &W);
    std::vector<float> in(3000, 1.5f), out(W * in.size());
    hcQuant q = HC_QUANT_INITIALIZER;
    q.block = block;
    return quantized ? hcAllGatherQuantized(in.data(), out.data(), in.size(), t, &q, comm, nullptr)
                     : hcAllGather(in.data(), out.data(), in.size(), t, comm, nullptr);
  };
  expectEveryRankFails(
      "quantized block 256/2048",
      [&](hcComm_t comm, int, bool odd) { return gather(comm, hcFloat32, odd ? 2048 : 256, true); },
      "quantization block");
  expectEveryRankFails(
      "quantized bfloat16/float16",
      [&](hcComm_t comm, int, bool odd) { return gather(comm, odd ? hcFloat16 : hcBfloat16, 256, true); }, "datatype");
  expectEveryRankFails(
      "quantized/exact", [&](hcComm_t comm, int, bool odd) { return gather(comm, hcFloat32, 256, !odd); },
      "quantized or exact");
}

// Small calls on one node whose shape was planned before take the lean entry
// (algorithms/node_small.h): a disagreement there must fail every rank as on the general path,
// whether the odd rank's call is of a known shape (lean on both sides) or not (it takes the
// general path, its peers the lean one).
TEST(Agreement, SmallCallsOfAKnownShapeStillDisagree) {
  auto warm = [](hcComm_t comm, int W) {
    std::vector<float> a(W * 4, 1.0f), b(W * 4, 0.0f);
    for (int i = 0; i < 3; ++i) {
      if (hcAllReduce(a.data(), b.data(), 4, hcFloat32, hcSum, comm, nullptr) != hcSuccess ||
          hcAllGather(a.data(), b.data(), 4, hcFloat32, comm, nullptr) != hcSuccess ||
          hcReduceScatter(a.data(), b.data(), 4, hcFloat32, hcSum, comm, nullptr) != hcSuccess ||
          hcBroadcast(a.data(), b.data(), 4, hcFloat32, 0, comm, nullptr) != hcSuccess)
        return false;
    }
    return true;
  };
  struct Case {
    const char* what;
    const char* mention;
    std::function<hcResult_t(hcComm_t, int W, bool odd)> call;
  };
  const std::vector<Case> cases = {
      {"warm allreduce sum/max", "reduction op",
       [](hcComm_t comm, int, bool odd) {
         std::vector<float> a(4, 1.0f), b(4);
         return hcAllReduce(a.data(), b.data(), 4, hcFloat32, odd ? hcMax : hcSum, comm, nullptr);
       }},
      {"warm broadcast root", "root",
       [](hcComm_t comm, int W, bool odd) {
         std::vector<float> a(4, 1.0f), b(4);
         return hcBroadcast(a.data(), b.data(), 4, hcFloat32, odd ? W - 1 : 0, comm, nullptr);
       }},
      {"warm allgather 4/5", "count",
       [](hcComm_t comm, int W, bool odd) {
         std::vector<float> a(5, 1.0f), b(W * 5);
         return hcAllGather(a.data(), b.data(), odd ? 5 : 4, hcFloat32, comm, nullptr);
       }},
      {"warm allgather/reducescatter", "collective",
       [](hcComm_t comm, int W, bool odd) {
         std::vector<float> a(W * 4, 1.0f), b(W * 4);
         return odd ? hcReduceScatter(a.data(), b.data(), 4, hcFloat32, hcSum, comm, nullptr)
                    : hcAllGather(a.data(), b.data(), 4, hcFloat32, comm, nullptr);
       }},
  };
  for (const Case& k : cases)
    expectEveryRankFails(
        k.what,
        [&](hcComm_t comm, int, bool odd) {
          int W = 0;
          hcCommCount(comm, &W);
          return warm(comm, W) ? k.call(comm, W, odd) : hcInternalError;
        },
        k.mention, std::string(k.what) == "warm broadcast root");
}

// In place on some ranks and not on others is a valid call (as in NCCL): it must succeed.
TEST(Agreement, MixedInPlaceIsValid) {
  for (const Layout& lay : layouts()) {
    Job job;
    job.nranks = lay.nranks;
    job.node = lay.node;
    auto st = run(job, [&](int rank, hcComm_t comm) {
      const size_t n = 3000, W = static_cast<size_t>(lay.nranks);
      std::vector<int32_t> in(n, rank), out(W * n, -1);
      const int32_t* send = rank % 2 ? in.data() : out.data() + rank * n;
      if (rank % 2 == 0) std::fill(out.begin() + rank * n, out.begin() + (rank + 1) * n, rank);
      if (hcAllGather(send, out.data(), n, hcInt32, comm, nullptr) != hcSuccess) return 11;
      for (size_t i = 0; i < W * n; ++i)
        if (out[i] != static_cast<int32_t>(i / n)) return 12;
      return 0;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << lay.name << " rank " << r;
  }
}

// Rank 0 passes a NULL buffer: it gets hcInvalidArgument, every other rank fails that same
// call with hcRemoteError naming rank 0's reason, and nobody pairs it with the next call.
TEST(Agreement, OneSidedArgumentErrorFailsThatCallEverywhere) {
  for (const Layout& lay : layouts()) {
    Job job;
    job.nranks = lay.nranks;
    job.node = lay.node;
    job.env["HICOLL_TIMEOUT_MS"] = "20000";
    job.timeout_s = 60;
    auto st = run(job, [&](int rank, hcComm_t comm) {
      const size_t n = 1000, W = static_cast<size_t>(lay.nranks);
      std::vector<float> in(n, 1.0f), out(W * n);
      auto t0 = std::chrono::steady_clock::now();
      hcResult_t r = hcAllGather(rank == 0 ? nullptr : in.data(), out.data(), n, hcFloat32, comm, nullptr);
      const double took = since(t0);
      std::string msg = hcGetLastError(comm);
      std::fprintf(stderr, "[null %s rank %d] %s in %.2f s: %s\n", lay.name, rank, hcGetErrorString(r), took,
                   msg.c_str());
      if (rank == 0 ? r != hcInvalidArgument : r != hcRemoteError) return 11;
      if (rank != 0 && msg.find("NULL buffer") == std::string::npos) return 12;
      if (took > 3.0) return 13;
      // The next call does not pair with anything: it fails at once on every rank.
      t0 = std::chrono::steady_clock::now();
      r = hcAllGather(in.data(), out.data(), n, hcFloat32, comm, nullptr);
      if (r == hcSuccess || since(t0) > 1.0) return 14;
      return 0;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << lay.name << " rank " << r;
  }
}

// Every rank rejects its arguments alike: each gets hcInvalidArgument, nothing moved, and the
// communicator goes on.
TEST(Agreement, SymmetricArgumentErrorsLeaveTheCommunicatorUsable) {
  for (const Layout& lay : layouts()) {
    Job job;
    job.nranks = lay.nranks;
    job.node = lay.node;
    job.env["HICOLL_TIMEOUT_MS"] = "20000";
    auto st = run(job, [&](int rank, hcComm_t comm) {
      std::vector<float> x(64, 1.0f);
      if (hcAllReduce(x.data(), x.data(), x.size(), static_cast<hcDataType_t>(42), hcSum, comm, nullptr) !=
          hcInvalidArgument)
        return 11;
      if (hcBroadcast(x.data(), x.data(), x.size(), hcFloat32, -1, comm, nullptr) != hcInvalidArgument) return 12;
      return checkAllReduce(comm, hcFloat32, hcSum, 1000, false, 2) + checkAllGather(comm, hcInt32, 77, true, 3);
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << lay.name << " rank " << r;
  }
}

// A rank that destroys its communicator while its peers still call a collective on it: the
// peers fail that call at once (destroy's barrier disagrees with their call), not at the timeout.
TEST(Agreement, PeerDestroyingEndsTheOthersCallFast) {
  for (const Layout& lay : layouts()) {
    for (size_t count : {size_t{1000}, size_t{24992}, size_t{1} << 20}) {
      Job job;
      job.nranks = lay.nranks;
      job.node = lay.node;
      job.env["HICOLL_TIMEOUT_MS"] = "10000";
      job.timeout_s = 60;
      auto st = runRaw(job, [&](int rank) {
        hcComm_t comm = nullptr;
        if (hcCommInitFromEnv(&comm) != hcSuccess) return 2;
        auto t0 = std::chrono::steady_clock::now();
        if (rank == lay.nranks - 1) {
          hcCommDestroy(comm);
          return 0;
        }
        std::vector<float> x(count, 1.0f);
        hcResult_t r = hcAllReduce(x.data(), x.data(), x.size(), hcFloat32, hcSum, comm, nullptr);
        const double took = since(t0);
        std::fprintf(stderr, "[destroy %s %zu rank %d] %s in %.2f s: %s\n", lay.name, count, rank, hcGetErrorString(r),
                     took, hcGetLastError(comm));
        hcCommDestroy(comm);
        return r == hcSuccess ? 11 : took > 3.0 ? 12 : 0;
      });
      for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << lay.name << " " << count << " rank " << r;
    }
  }
}

// With the flat ring too: the descriptor is checked whatever the path.
TEST(Agreement, RingPathChecksToo) {
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  job.env["HICOLL_ALGO"] = "ring";
  job.env["HICOLL_TIMEOUT_MS"] = "20000";
  auto st = run(job, [&](int rank, hcComm_t comm) {
    std::vector<float> x(5000, 1.0f);
    hcResult_t r = hcAllReduce(x.data(), x.data(), x.size(), hcFloat32, rank == 3 ? hcMax : hcSum, comm, nullptr);
    std::fprintf(stderr, "[ring rank %d] %s: %s\n", rank, hcGetErrorString(r), hcGetLastError(comm));
    return r == hcInvalidUsage || r == hcRemoteError ? 0 : 11;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace hctest
