// Tier 3, what must not happen: hangs, leaks, silent corruption, silent fallbacks.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "../common/mp.h"
#include "../common/reference.h"
#include "checks.h"

namespace hctest {
namespace {

std::set<std::string> shmSegments() {
  std::set<std::string> s;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::strncmp(e->d_name, "hicoll-", 7) == 0) s.insert(e->d_name);
    closedir(d);
  }
  return s;
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Failure, KilledRankBecomesAnErrorOnEveryOtherRankWithinTheTimeout) {
  const auto before = shmSegments();
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  job.env["HICOLL_TIMEOUT_MS"] = "4000";
  job.timeout_s = 60;
  auto st = run(job, [&](int rank, hcComm_t comm) {
    std::vector<float> in(1 << 20, 1.0f), out(4 << 20);
    if (hcAllGather(in.data(), out.data(), in.size(), hcFloat32, comm, nullptr) != hcSuccess) return 10;
    if (rank == 3) raise(SIGKILL);  // dies between two collectives
    auto t0 = std::chrono::steady_clock::now();
    hcResult_t r = hcAllGather(in.data(), out.data(), in.size(), hcFloat32, comm, nullptr);
    double took = seconds(t0);
    std::fprintf(stderr, "[rank %d] after the kill: %s in %.2f s: %s\n", rank, hcGetErrorString(r), took,
                 hcGetLastError(comm));
    if (r != hcRemoteError && r != hcTimeout) return 11;
    if (took > 4.0 + 2.0) return 12;
    // The communicator stays failed, quickly.
    if (hcAllGather(in.data(), out.data(), in.size(), hcFloat32, comm, nullptr) == hcSuccess) return 13;
    return 0;
  });
  EXPECT_EQ(st[3], 128 + SIGKILL);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
  EXPECT_EQ(shmSegments(), before) << "shared-memory segments were left in /dev/shm";
}

TEST(Failure, KilledRankMidCollectiveOnOneNode) {
  Job job;
  job.nranks = 3;
  job.env["HICOLL_TIMEOUT_MS"] = "4000";
  auto st = run(job, [&](int rank, hcComm_t comm) {
    if (rank == 2) {
      // Announces itself on the board, then dies: the others are waiting for it mid-collective.
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        raise(SIGKILL);
      }).detach();
    }
    std::vector<float> in(8 << 20, 1.0f), out(3 * in.size());
    hcResult_t r = hcSuccess;
    for (int i = 0; i < 200 && r == hcSuccess; ++i)
      r = hcAllGather(in.data(), out.data(), in.size(), hcFloat32, comm, nullptr);
    return (r == hcRemoteError || r == hcTimeout) ? 0 : 11;
  });
  EXPECT_EQ(st[2], 128 + SIGKILL);
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
}

// The pipelined ring ReduceScatter (many chunks in flight) turns a peer that dies mid-call into
// an error on the others: on its node through shared memory, on the other node through the
// failure notice of the rank that noticed, in well under HICOLL_TIMEOUT_MS.
TEST(Failure, KilledRankMidRingReduceScatter) {
  for (auto layout : {contiguous(1, 3), contiguous(2, 2)}) {
    Job job;
    job.nranks = static_cast<int>(layout.size());
    job.node = layout;
    job.env["HICOLL_TIMEOUT_MS"] = "4000";
    job.env["HICOLL_ALGO"] = "ring";
    job.timeout_s = 60;
    const int victim = job.nranks - 1;
    auto st = run(job, [&](int rank, hcComm_t comm) {
      if (rank == victim) {
        std::thread([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          raise(SIGKILL);
        }).detach();
      }
      std::vector<float> in(static_cast<size_t>(job.nranks) << 20, 1.0f), out(1 << 20);
      hcResult_t r = hcSuccess;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 500 && r == hcSuccess; ++i)
        r = hcReduceScatter(in.data(), out.data(), out.size(), hcFloat32, hcSum, comm, nullptr);
      const double took = seconds(t0);
      std::fprintf(stderr, "[rank %d] %s after %.2f s: %s\n", rank, hcGetErrorString(r), took, hcGetLastError(comm));
      if (r != hcRemoteError) return 11;
      return took < 2.0 ? 0 : 12;
    });
    EXPECT_EQ(st[victim], 128 + SIGKILL);
    for (int r = 0; r < victim; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << " of " << job.nranks;
  }
}

// After a peer fails, the survivors report its cause, not the symptom it left: a local peer
// that failed and then unmapped the buffer its post described is "failed: <why>", not
// "process_vm_readv ... Bad address" (1x2); a peer on another node is named by its node, not
// by its fabric address (2x1, 2x2).
TEST(Failure, SurvivorsNameTheCauseNotTheSymptom) {
  {
    Job job;
    job.nranks = 2;
    job.env["HICOLL_TIMEOUT_MS"] = "10000";
    job.timeout_s = 40;
    Shared<std::atomic<int>> unmapped;
    auto st = run(job, [&](int rank, hcComm_t comm) {
      const size_t n = 1 << 20;  // 4 MiB per rank: read where it lies (single-copy reads)
      std::vector<int32_t> out(2 * n);
      if (rank == 1) {
        void* p = mmap(nullptr, n * 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return 10;
        std::memset(p, 1, n * 4);
        hcResult_t r = hcSuccess;
        std::thread call([&] { r = hcAllGather(p, out.data(), n, hcInt32, comm, nullptr); });
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // posted, waiting for rank 0
        hcCommRevoke(comm);
        call.join();
        munmap(p, n * 4);  // the call failed: its buffer is the caller's again
        *unmapped = 1;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        return r == hcRemoteError ? 0 : 11;
      }
      while (!*unmapped) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::vector<int32_t> in(n, 0);
      const hcResult_t r = hcAllGather(in.data(), out.data(), n, hcInt32, comm, nullptr);
      const std::string msg = hcGetLastError(comm);
      std::fprintf(stderr, "[1x2 rank 0] %s: %s\n", hcGetErrorString(r), msg.c_str());
      return r == hcRemoteError && msg.find("rank 1 failed: it revoked the communicator") != std::string::npos &&
                     msg.find("Bad address") == std::string::npos
                 ? 0
                 : 12;
    });
    EXPECT_EQ(st[0], 0);
    EXPECT_EQ(st[1], 0);
  }
  for (int nodes_of_two : {0, 1}) {
    Job job;
    job.nranks = nodes_of_two ? 4 : 2;
    job.node = contiguous(2, nodes_of_two ? 2 : 1);
    job.env["HICOLL_TIMEOUT_MS"] = "10000";
    job.timeout_s = 40;
    const int victim = job.nranks - 1;
    auto st = run(job, [&](int rank, hcComm_t comm) {
      std::vector<float> in(1024, 1.f), out(1024 * static_cast<size_t>(job.nranks));
      if (hcAllGather(in.data(), out.data(), in.size(), hcFloat32, comm, nullptr) != hcSuccess) return 10;
      if (rank == victim) {
        hcCommRevoke(comm);
        std::this_thread::sleep_for(std::chrono::milliseconds(500));  // its notice tells, not its exit
        return 0;
      }
      const hcResult_t r = hcAllGather(in.data(), out.data(), in.size(), hcFloat32, comm, nullptr);
      const std::string msg = hcGetLastError(comm);
      std::fprintf(stderr, "[%dx%d rank %d] %s: %s\n", 2, job.nranks / 2, rank, hcGetErrorString(r), msg.c_str());
      if (r != hcRemoteError) return 11;
      if (msg.find("fi_") != std::string::npos || msg.find("://") != std::string::npos ||
          msg.find("127.0.0.1") != std::string::npos)
        return 12;  // a fabric address
      // The victim is named; a rank of the other node names the one that told it by its node.
      const bool remote = job.node[static_cast<size_t>(rank)] != job.node[static_cast<size_t>(victim)];
      if (msg.find("rank " + std::to_string(victim)) == std::string::npos) return 13;
      return !remote || msg.find("(node 'node1')") != std::string::npos ? 0 : 14;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << job.nranks << " ranks, rank " << r;
  }
}

TEST(Failure, MismatchedCountsAreReportedNotCorrupted) {
  for (auto layout : {contiguous(1, 2), contiguous(2, 1), contiguous(2, 2)}) {
    Job job;
    job.nranks = static_cast<int>(layout.size());
    job.node = layout;
    job.env["HICOLL_TIMEOUT_MS"] = "3000";
    auto st = run(job, [&](int rank, hcComm_t comm) {
      const size_t count = rank == 1 ? 1001 : 1000;
      std::vector<float> in(count, 1.0f), out(job.nranks * 1001 + 64, 7.0f);
      hcResult_t r = hcAllGather(in.data(), out.data(), count, hcFloat32, comm, nullptr);
      std::fprintf(stderr, "[rank %d] mismatched AllGather: %s: %s\n", rank, hcGetErrorString(r), hcGetLastError(comm));
      for (size_t i = job.nranks * count; i < out.size(); ++i)
        if (out[i] != 7.0f) return 12;  // wrote past what this rank asked for
      return r == hcSuccess ? 11 : 0;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << " of " << job.nranks;
  }
}

TEST(Failure, InvalidBufferSizesFailCreationNamingTheVariable) {
  for (const char* bad : {"12345", "abc", "-8192", "0"}) {
    Job job;
    job.nranks = 1;
    job.env["SMDDP_AG_SORT_BUFFER_SIZE_BYTES"] = bad;
    auto st = runRaw(job, [&](int) {
      hcComm_t comm = nullptr;
      hcResult_t r = hcCommInitFromEnv(&comm);
      std::string msg = hcGetLastError(nullptr);
      if (r != hcInvalidArgument) return 11;
      if (msg.find("SMDDP_AG_SORT_BUFFER_SIZE_BYTES") == std::string::npos || msg.find(bad) == std::string::npos)
        return 12;
      return 0;
    });
    EXPECT_EQ(st[0], 0) << bad;
  }
}

TEST(Failure, ConfigurationThatMustAgreeIsChecked) {
  Job job;
  job.nranks = 2;
  job.rank_env[1]["SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES"] = "32768";
  job.env["HICOLL_TIMEOUT_MS"] = "5000";
  auto st = runRaw(job, [&](int) {
    hcComm_t comm = nullptr;
    hcResult_t r = hcCommInitFromEnv(&comm);
    std::string msg = hcGetLastError(nullptr);
    if (r == hcSuccess) return 11;
    return msg.find("SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES") != std::string::npos ? 0 : 12;
  });
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
}

// A knob that must agree and differs across nodes fails creation at once on every rank, naming
// the variable and both values (HICOLL_OFI_RXM_EAGER used to hang creation for the timeout).
TEST(Failure, DisagreeingRxmEagerFailsCreationNamingBothValues) {
  Job job;
  job.nranks = 2;
  job.node = contiguous(2, 1);
  job.rank_env[1]["HICOLL_OFI_RXM_EAGER"] = "0";
  job.env["HICOLL_TIMEOUT_MS"] = "20000";
  auto st = runRaw(job, [&](int rank) {
    auto t0 = std::chrono::steady_clock::now();
    hcComm_t comm = nullptr;
    hcResult_t r = hcCommInitFromEnv(&comm);
    std::string msg = hcGetLastError(nullptr);
    std::fprintf(stderr, "[rank %d] %s in %.2f s: %s\n", rank, hcGetErrorString(r), seconds(t0), msg.c_str());
    if (r != hcInvalidUsage) return 11;
    if (msg.find("HICOLL_OFI_RXM_EAGER") == std::string::npos || msg.find("rank 0 has '1'") == std::string::npos ||
        msg.find("rank 1 has '0'") == std::string::npos)
      return 12;
    return seconds(t0) < 3.0 ? 0 : 13;
  });
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
}

// The seed's rule (HICOLL_SCRATCH_STRICT=1; without it larger blocks stream through in pieces:
// scratch_test.cc), at its boundary: hierarchical when the buffer is exactly big enough, the
// announced fallback when it is 8192 bytes short, exact results either way.
TEST(Fallback, ScratchAndSortBoundaries) {
  const size_t count = 16384;  // floats: 64 KiB per rank
  const size_t b = count * 4;
  struct Case {
    const char* var;
    size_t value;
    bool ag_hier, rs_hier;  // ReduceScatter needs only the sort buffer (N blocks)
  } cases[] = {{"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", 2 * b, true, true},
               {"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", 2 * b - 8192, false, false},
               {"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", b, true, true},
               {"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", b - 8192, false, true},
               {"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", 8192, false, true},
               {"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", 8192, false, false}};
  for (const Case& c : cases) {
    Job job;
    job.nranks = 4;
    job.node = interleaved(2, 2);
    job.env[c.var] = std::to_string(c.value);
    job.env["HICOLL_SCRATCH_STRICT"] = "1";
    job.env["HICOLL_DEBUG"] = "INFO";
    auto st = run(job, [&](int, hcComm_t comm) {
      int f = checkAllGather(comm, hcFloat32, count, false, 5) +
              checkReduceScatter(comm, hcFloat32, hcSum, count, false, 6);
      hcStats s = HC_STATS_INITIALIZER;
      hcCommGetStats(comm, &s);
      for (hcColl_t coll : {hcCollAllGather, hcCollReduceScatter}) {
        const bool want_hier = coll == hcCollAllGather ? c.ag_hier : c.rs_hier;
        const auto& cs = s.coll[coll];
        bool hier = cs.calls[hcPathHierarchical] == 1 && cs.calls[hcPathFallback] == 0;
        bool fb =
            cs.calls[hcPathFallback] == 1 && std::string(cs.last_fallback_reason).find(c.var) != std::string::npos;
        if (want_hier ? !hier : !fb) {
          std::fprintf(stderr, "%s=%zu: coll %d took hier %lu fallback %lu (%s)\n", c.var, c.value, coll,
                       (unsigned long)cs.calls[hcPathHierarchical], (unsigned long)cs.calls[hcPathFallback],
                       cs.last_fallback_reason);
          ++f;
        }
      }
      return f;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << c.var << "=" << c.value << " rank " << r;
  }
}

TEST(Fallback, ForcedFallbackIsAnnouncedAtInfo) {
  char path[] = "/tmp/hicoll-log-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  Job job;
  job.nranks = 2;
  job.env["HICOLL_FORCE_FALLBACK"] = "allgather";
  job.env["HICOLL_DEBUG"] = "INFO";
  auto st = run(job, [&](int rank, hcComm_t comm) {
    if (rank == 0) {
      int lf = open(path, O_WRONLY | O_APPEND);
      dup2(lf, 2);
      close(lf);
    }
    int f = checkAllGather(comm, hcInt32, 100, false, 1) + checkAllReduce(comm, hcFloat32, hcSum, 100, false, 2);
    hcStats s = HC_STATS_INITIALIZER;
    hcCommGetStats(comm, &s);
    if (s.coll[hcCollAllGather].calls[hcPathFallback] == 0) ++f;
    if (s.coll[hcCollAllReduce].calls[hcPathFallback] != 0) ++f;  // only what was named
    return f;
  });
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  unlink(path);
  EXPECT_NE(ss.str().find("fallback"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("HICOLL_FORCE_FALLBACK=allgather"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("[rank 0"), std::string::npos) << ss.str();
}

// Inter-node bytes per node of a hierarchical AllGather are (N-1) * L * b, the lower bound;
// the ring moves more.
TEST(Stats, InterNodeBytesAreTheLowerBound) {
  const size_t count = 1 << 18, b = count * 4;
  for (const char* algo : {"auto", "ring"}) {
    Job job;
    job.nranks = 4;
    job.node = contiguous(2, 2);
    job.env["HICOLL_ALGO"] = algo;
    auto st = run(job, [&](int rank, hcComm_t comm) {
      int f = checkAllGather(comm, hcFloat32, count, false, 1);
      hcStats s = HC_STATS_INITIALIZER;
      hcCommGetStats(comm, &s);
      uint64_t mine = s.coll[hcCollAllGather].bytes_inter, all[4];
      // Node totals: gather every rank's count with the library itself.
      if (hcAllGather(&mine, all, 1, hcUint64, comm, nullptr) != hcSuccess) return 20;
      uint64_t node0 = all[0] + all[1];
      std::fprintf(stderr, "[rank %d] %s: inter-node bytes per node %lu (lower bound %zu)\n", rank, algo,
                   (unsigned long)node0, b * 2);
      if (std::string(algo) == "auto" ? node0 != (2 - 1) * 2 * b : node0 <= (2 - 1) * 2 * b) ++f;
      return f;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << algo << " rank " << r;
  }
}

// Strangers at the rendezvous (garbage, a wrong secret, silence) neither join nor break the job.
TEST(Bootstrap, StrangersCannotJoinOrCrashTheJob) {
  Job job;
  job.nranks = 3;
  job.node = contiguous(3, 1);
  const int port = freePort();
  job.comm_id = "127.0.0.1:" + std::to_string(port);
  Shared<std::atomic<bool>> stop;
  Helper stranger([&] {
    for (int i = 0; i < 200 && !*stop; ++i) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
        char junk[64];
        for (size_t j = 0; j < sizeof junk; ++j) junk[j] = static_cast<char>(i * 31 + j);
        if (i % 3 != 2) (void)!write(fd, junk, i % 2 ? sizeof junk : 7);  // every third one stays silent
        if (i % 3 != 2) close(fd);
      } else {
        close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  auto st = run(job, [&](int, hcComm_t comm) { return checkAllReduce(comm, hcInt32, hcSum, 1000, false, 1); });
  *stop = true;
  stranger.join();
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

TEST(Split, SubCommunicatorsComputeWithinTheirGroup) {
  Job job;
  job.nranks = 4;
  job.node = interleaved(2, 2);
  auto st = run(job, [&](int rank, hcComm_t comm) {
    hcComm_t sub = nullptr;
    if (hcCommSplit(comm, rank % 2, -rank, &sub) != hcSuccess || !sub) return 20;
    int n = 0, sr = 0;
    hcCommCount(sub, &n);
    hcCommUserRank(sub, &sr);
    int f = (n != 2) + (sr != (rank < 2 ? 1 : 0));  // key -rank reverses the order
    int32_t mine = rank, sum = 0;
    if (hcAllReduce(&mine, &sum, 1, hcInt32, hcSum, sub, nullptr) != hcSuccess) ++f;
    f += sum != (rank % 2 == 0 ? 0 + 2 : 1 + 3);
    f += checkMatrix(sub, {5});
    hcComm_t none = reinterpret_cast<hcComm_t>(1);
    if (hcCommSplit(comm, rank == 0 ? 0 : HC_SPLIT_NOCOLOR, 0, &none) != hcSuccess) ++f;
    if ((rank == 0) != (none != nullptr)) ++f;
    if (none) hcCommDestroy(none);
    hcCommDestroy(sub);
    return f;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace hctest
