// Tier 3: a rank that dies, a whole node that dies, or a rank that stops, becomes an error on
// every survivor fast (well inside HICOLL_TIMEOUT_MS), and the message names the culprit.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../common/mp.h"
#include "checks.h"

namespace hctest {
namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void killSoon(int ms) {
  std::thread([ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    raise(SIGKILL);
  }).detach();
}

// Survivors loop on `coll` until it fails; each must fail with hcRemoteError within 2.5 s of
// the start (the kill comes after 100 ms; HICOLL_TIMEOUT_MS is 30 s) and name a dead rank.
void expectSurvivorsFailFast(const char* what, Job job, const std::vector<int>& victims,
                             const std::function<hcResult_t(hcComm_t)>& coll) {
  job.env["HICOLL_TIMEOUT_MS"] = "30000";
  job.timeout_s = 90;
  auto st = run(job, [&](int rank, hcComm_t comm) {
    const bool victim = std::count(victims.begin(), victims.end(), rank) > 0;
    if (coll(comm) != hcSuccess) return 10;  // one call that works, then the kill
    if (victim) killSoon(100);
    auto t0 = std::chrono::steady_clock::now();
    hcResult_t r = hcSuccess;
    for (int i = 0; i < 100000 && r == hcSuccess; ++i) r = coll(comm);
    const double took = since(t0);
    const std::string msg = hcGetLastError(comm);
    std::fprintf(stderr, "[%s rank %d] %s after %.2f s: %s\n", what, rank, hcGetErrorString(r), took, msg.c_str());
    if (r != hcRemoteError) return 11;
    if (took > 2.5) return 12;
    bool named = false;
    for (int v : victims) named = named || msg.find("rank " + std::to_string(v)) != std::string::npos;
    return named ? 0 : 13;
  });
  for (int r = 0; r < job.nranks; ++r) {
    if (std::count(victims.begin(), victims.end(), r)) EXPECT_EQ(st[r], 128 + SIGKILL) << what << " rank " << r;
    else EXPECT_EQ(st[r], 0) << what << " rank " << r;
  }
}

hcResult_t reduceScatter(hcComm_t comm) {
  int W = 0;
  hcCommCount(comm, &W);
  static std::vector<float> in, out;
  in.assign(static_cast<size_t>(W) << 20, 1.0f);
  out.assign(1 << 20, 0.0f);
  return hcReduceScatter(in.data(), out.data(), out.size(), hcFloat32, hcSum, comm, nullptr);
}

hcResult_t allGather(hcComm_t comm) {
  int W = 0;
  hcCommCount(comm, &W);
  static std::vector<float> in, out;
  in.assign(1 << 18, 1.0f);
  out.assign(static_cast<size_t>(W) << 18, 0.0f);
  return hcAllGather(in.data(), out.data(), in.size(), hcFloat32, comm, nullptr);
}

// The case that used to cost the whole timeout now and then: the dead rank's rail peer on the
// other node blocked posting a send to it. Repeated, since it was intermittent.
TEST(Death, KilledRankMidHierarchicalReduceScatterRepeated) {
  for (int rep = 0; rep < 6; ++rep) {
    Job job;
    job.nranks = 4;
    job.node = contiguous(2, 2);
    expectSurvivorsFailFast("hier RS kill rank 1", job, {1}, reduceScatter);
  }
}

// No survivor on the dead node sends a notice: the other node learns it through liveness.
TEST(Death, WholeNodeKilled) {
  {
    Job job;
    job.nranks = 4;
    job.node = contiguous(2, 2);
    expectSurvivorsFailFast("2x2 node 1 killed (AG)", job, {2, 3}, allGather);
  }
  {
    Job job;
    job.nranks = 4;
    job.node = contiguous(2, 2);
    expectSurvivorsFailFast("2x2 node 1 killed (RS)", job, {2, 3}, reduceScatter);
  }
  {
    Job job;
    job.nranks = 3;
    job.node = contiguous(3, 1);
    expectSurvivorsFailFast("3x1 node 1 killed", job, {1}, allGather);
  }
  {
    Job job;
    job.nranks = 4;
    job.node = contiguous(4, 1);
    job.env["HICOLL_ALGO"] = "ring";
    expectSurvivorsFailFast("4x1 ring node 2 killed", job, {2}, reduceScatter);
  }
}

// A stopped rank is not dead: the others time out, and the message names who has not arrived.
TEST(Death, StoppedRankIsATimeoutNamingIt) {
  for (auto layout : {contiguous(1, 2), contiguous(2, 1)}) {
    Job job;
    job.nranks = 2;
    job.node = layout;
    job.env["HICOLL_TIMEOUT_MS"] = "1500";
    job.timeout_s = 60;
    char path[] = "/tmp/hicoll-stopped-XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    auto st = run(job, [&](int rank, hcComm_t comm) {
      if (allGather(comm) != hcSuccess) return 10;
      if (rank == 1) {
        if (FILE* f = std::fopen(path, "w")) std::fprintf(f, "%d\n", getpid()), std::fclose(f);
        raise(SIGSTOP);  // rank 0 ends it
        return 0;
      }
      auto t0 = std::chrono::steady_clock::now();
      hcResult_t r = allGather(comm);
      const double took = since(t0);
      const std::string msg = hcGetLastError(comm);
      std::fprintf(stderr, "[stopped rank 0] %s after %.2f s: %s\n", hcGetErrorString(r), took, msg.c_str());
      int pid = 0;
      if (FILE* f = std::fopen(path, "r")) {
        if (std::fscanf(f, "%d", &pid) != 1) pid = 0;
        std::fclose(f);
      }
      if (pid > 0) kill(pid, SIGKILL);
      return r != hcTimeout ? 11 : took > 4.0 ? 12 : msg.find("rank 1") == std::string::npos ? 13 : 0;
    });
    unlink(path);
    EXPECT_EQ(st[1], 128 + SIGKILL);
    EXPECT_EQ(st[0], 0) << layout.back();
  }
}

// A rank stopped in the middle of a run of calls (SIGSTOP from its own helper thread) is named
// in every survivor's error, whatever the collective and wherever the survivor waits: on the
// stopped rank's board, for its messages, or for a peer that waits on it (AllToAll, the
// quantized AllGather / ReduceScatter and the one-node AllGather used to say only "local ranks
// 0,1,2,3"). The last survivor to fail kills the stopped rank.
TEST(Death, StoppedRankIsNamedInEveryCollective) {
  struct Case {
    const char* name;
    std::vector<std::string> layout;
    int victim;
    std::function<hcResult_t(hcComm_t, int)> coll;
  };
  // Buffers filled once: the stop lands inside a call more often than between two.
  auto allToAll = [](hcComm_t comm, int W) {
    static std::vector<float> in(static_cast<size_t>(W) << 16, 1.0f), out(in.size());
    return hcAllToAll(in.data(), out.data(), 1 << 16, hcFloat32, comm, nullptr);
  };
  auto quantAG = [](hcComm_t comm, int W) {
    static std::vector<float> in(1 << 17, 0.5f), out(static_cast<size_t>(W) << 17);
    hcQuant q = HC_QUANT_INITIALIZER;
    return hcAllGatherQuantized(in.data(), out.data(), in.size(), hcFloat32, &q, comm, nullptr);
  };
  auto quantRS = [](hcComm_t comm, int W) {
    static std::vector<float> in(static_cast<size_t>(W) << 17, 0.5f), out(1 << 17);
    hcQuant q = HC_QUANT_INITIALIZER;
    return hcReduceScatterQuantized(in.data(), out.data(), out.size(), hcFloat32, hcSum, &q, comm, nullptr);
  };
  auto gather = [](hcComm_t comm, int W) {
    static std::vector<float> in(1 << 18, 1.0f), out(static_cast<size_t>(W) << 18);
    return hcAllGather(in.data(), out.data(), in.size(), hcFloat32, comm, nullptr);
  };
  const std::vector<Case> cases = {{"AllToAll 1x3", contiguous(1, 3), 2, allToAll},
                                   {"quantized AllGather 2x2", contiguous(2, 2), 3, quantAG},
                                   {"quantized ReduceScatter 2x2", contiguous(2, 2), 3, quantRS},
                                   {"one-node AllGather 1x4", contiguous(1, 4), 3, gather}};
  for (const Case& k : cases) {
    struct State {
      std::atomic<int> victim_pid{0};
      std::atomic<int> failed{0};
    };
    Shared<State> state;
    Job job;
    job.nranks = static_cast<int>(k.layout.size());
    job.node = k.layout;
    job.env["HICOLL_TIMEOUT_MS"] = "1500";
    job.timeout_s = 40;
    auto st = run(job, [&](int rank, hcComm_t comm) {
      if (k.coll(comm, job.nranks) != hcSuccess) return 10;
      if (rank == k.victim) {
        state->victim_pid = getpid();
        std::thread([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          raise(SIGSTOP);  // the last survivor to fail kills it
        }).detach();
      }
      auto t0 = std::chrono::steady_clock::now();
      hcResult_t r = hcSuccess;
      for (int i = 0; i < 1000000 && r == hcSuccess; ++i) r = k.coll(comm, job.nranks);
      const double took = since(t0);
      const std::string msg = hcGetLastError(comm);
      std::fprintf(stderr, "[%s rank %d] %s after %.2f s: %s\n", k.name, rank, hcGetErrorString(r), took, msg.c_str());
      if (rank != k.victim && state->failed.fetch_add(1) + 2 == job.nranks) kill(state->victim_pid.load(), SIGKILL);
      if (r != hcTimeout && r != hcRemoteError) return 11;
      if (took > 4.0) return 12;
      return msg.find("rank " + std::to_string(k.victim)) == std::string::npos ? 13 : 0;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], r == k.victim ? 128 + SIGKILL : 0) << k.name << " rank " << r;
  }
}

// The survivors of a kill shrink the communicator and go on computing, without the dead rank's
// help, in well under the timeout.
TEST(Death, SurvivorsShrinkAndContinue) {
  struct Case {
    std::vector<std::string> layout;
    int victim;
  };
  for (const Case& c : {Case{contiguous(2, 2), 3}, Case{contiguous(1, 4), 2}, Case{contiguous(3, 1), 1}}) {
    Job job;
    job.nranks = static_cast<int>(c.layout.size());
    job.node = c.layout;
    job.env["HICOLL_TIMEOUT_MS"] = "20000";
    job.timeout_s = 60;
    auto st = run(job, [&](int rank, hcComm_t comm) {
      if (allGather(comm) != hcSuccess) return 10;
      if (rank == c.victim) killSoon(50);
      hcResult_t r = hcSuccess;
      for (int i = 0; i < 100000 && r == hcSuccess; ++i) r = allGather(comm);
      if (r != hcRemoteError) return 11;
      auto t0 = std::chrono::steady_clock::now();
      hcComm_t small = nullptr;
      const int excluded[] = {c.victim};
      r = hcCommShrink(comm, excluded, 1, &small, HC_SHRINK_ABORT);
      if (r != hcSuccess) {
        std::fprintf(stderr, "[rank %d] hcCommShrink: %s\n", rank, hcGetLastError(nullptr));
        return 12;
      }
      int n = 0, me = -1;
      hcCommCount(small, &n);
      hcCommUserRank(small, &me);
      if (n != job.nranks - 1 || me != rank - (rank > c.victim ? 1 : 0)) return 13;
      int f = checkAllReduce(small, hcFloat32, hcSum, 100000, false, 3) +
              checkAllGather(small, hcInt32, 1000, true, 4) +
              checkReduceScatter(small, hcFloat32, hcSum, 4096, false, 5);
      std::fprintf(stderr, "[rank %d] shrank to %d ranks and ran 3 collectives in %.2f s\n", rank, n, since(t0));
      hcCommDestroy(small);
      return f ? 14 : since(t0) < 5.0 ? 0 : 15;
    });
    for (int r = 0; r < job.nranks; ++r)
      EXPECT_EQ(st[r], r == c.victim ? 128 + SIGKILL : 0) << "victim " << c.victim << " rank " << r;
  }
}

// Using the network must not change how a rank dies: libfabric's PSM libraries, loaded with it,
// would install handlers that turn SIGTERM into exit status 1 and write *.btr files here.
TEST(Death, SignalsStaySignalsAfterTheNetworkIsUp) {
  auto btrFiles = [] {
    int n = 0;
    if (DIR* d = opendir(".")) {
      while (dirent* e = readdir(d)) n += std::strstr(e->d_name, ".btr") != nullptr;
      closedir(d);
    }
    return n;
  };
  const int before = btrFiles();
  Job job;
  job.nranks = 2;
  job.node = contiguous(2, 1);
  auto st = run(job, [&](int rank, hcComm_t comm) {
    if (allGather(comm) != hcSuccess) return 10;
    if (rank == 1) raise(SIGTERM);
    return 0;
  });
  EXPECT_EQ(st[1], 128 + SIGTERM);
  EXPECT_EQ(btrFiles(), before);
  struct sigaction sa {};
  sigaction(SIGINT, nullptr, &sa);
  EXPECT_EQ(sa.sa_handler, SIG_DFL) << "loading hicoll changed this process's SIGINT handler";
}

}  // namespace
}  // namespace hctest
