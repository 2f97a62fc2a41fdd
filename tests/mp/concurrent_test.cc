// Tier 3: a communicator used from two threads at once. Calls on one communicator must come
// from one thread at a time (hicoll.h); a second thread's call while one is in progress is
// refused on its rank (hcInvalidUsage, naming both calls), the communicator is revoked so the
// call in progress and the peers' calls fail too, and no call returns wrong data as success.
// hcCommDestroy / hcCommAbort from another thread during a call never crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../common/mp.h"

namespace hctest {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
void sleepMs(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

struct Layout {
  const char* name;
  std::vector<std::string> node;
};
// 1x2 and 1x4: one node (the board); 2x1: two simulated nodes (the network).
const std::vector<Layout> kLayouts = {{"1x2", contiguous(1, 2)}, {"2x1", contiguous(2, 1)}, {"1x4", contiguous(1, 4)}};

Job jobFor(const Layout& l) {
  Job job;
  job.nranks = static_cast<int>(l.node.size());
  job.node = l.node;
  job.env["HICOLL_TIMEOUT_MS"] = "10000";
  job.timeout_s = 60;
  return job;
}

// An AllGather whose every element says which rank and index it came from: a result is right
// or it is not, whichever thread's call it paired with.
struct Gather {
  size_t n;
  int rank, W;
  std::vector<int32_t> in, out;
  Gather(size_t count, int r, int w) : n(count), rank(r), W(w), in(count), out(count * static_cast<size_t>(w), -1) {
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<int32_t>(rank * 1000003 + static_cast<int>(i));
  }
  hcResult_t operator()(hcComm_t comm) { return hcAllGather(in.data(), out.data(), n, hcInt32, comm, nullptr); }
  size_t wrong() const {
    size_t bad = 0;
    for (int j = 0; j < W; ++j)
      for (size_t i = 0; i < n; ++i) bad += out[j * n + i] != static_cast<int32_t>(j * 1000003 + static_cast<int>(i));
    return bad;
  }
};

hcComm_t splitChild(hcComm_t comm, int rank) {
  hcComm_t child = nullptr;
  if (hcCommSplit(comm, 0, rank, &child) != hcSuccess) {
    std::fprintf(stderr, "[rank %d] hcCommSplit: %s\n", rank, hcGetLastError(nullptr));
    return nullptr;
  }
  return child;
}

bool has(const std::string& msg, const std::string& what) {
  return msg.find(what) != std::string::npos;
}

// Rank 0 has a call in progress (its peers come 300 ms later) when its second thread calls:
// that thread is refused at once naming both calls and the communicator is revoked. The call in
// progress fails; a peer's counterpart of it fails too, or completes with the right data when
// rank 0's part had all arrived; the peers' counterpart of the refused call fails, naming rank 0
// and the cause -- well inside the timeout, with nothing wrong returned as success. Rank 0
// keeps its communicator meanwhile: the peers learn it from rank 0's failure notice.
TEST(Concurrent, SecondThreadIsRefusedNamingBothCalls) {
  for (const Layout& l : kLayouts) {
    Job job = jobFor(l);
    auto st = run(job, [&](int rank, hcComm_t comm) {
      Gather warm(16, rank, job.nranks);
      if (warm(comm) != hcSuccess || warm.wrong()) return 10;  // the network is up, the calls numbered
      Gather first(1 << 16, rank, job.nranks), second(1 << 16, rank, job.nranks);
      const std::string cause =
          "hcAllGather entered on rank 0 while hcAllGather (call 2) is in progress on another thread";
      if (rank != 0) {
        sleepMs(300);
        const auto t0 = Clock::now();
        const hcResult_t r1 = first(comm);
        const std::string msg1 = hcGetLastError(comm);
        const hcResult_t r2 = second(comm);
        const std::string msg2 = hcGetLastError(comm);
        const double took = since(t0);
        std::fprintf(stderr, "[%s rank %d] %s, then %s, after %.2f s: %s\n", l.name, rank, hcGetErrorString(r1),
                     hcGetErrorString(r2), took, msg2.c_str());
        if (r1 == hcSuccess ? first.wrong() != 0 : r1 != hcRemoteError || !has(msg1, cause)) return 11;
        if (r2 == hcSuccess) return second.wrong() ? 12 : 13;
        if (r2 != hcRemoteError || took > 3.0) return 14;
        return has(msg2, "rank 0") && has(msg2, cause) ? 0 : 15;
      }
      hcResult_t ra = hcSuccess;
      std::string msg_a;
      double took_a = 0;
      std::thread a([&] {
        const auto t0 = Clock::now();
        ra = first(comm);
        took_a = since(t0);
        msg_a = hcGetLastError(comm);
      });
      sleepMs(100);
      const auto t0 = Clock::now();
      const hcResult_t rb = second(comm);
      const double took_b = since(t0);
      const std::string msg_b = hcGetLastError(comm);
      a.join();
      std::fprintf(stderr, "[%s rank 0, second thread] %s after %.3f s: %s\n", l.name, hcGetErrorString(rb), took_b,
                   msg_b.c_str());
      std::fprintf(stderr, "[%s rank 0, first thread] %s after %.2f s: %s\n", l.name, hcGetErrorString(ra), took_a,
                   msg_a.c_str());
      if (rb != hcInvalidUsage || took_b > 1.0) return 20;
      if (!has(msg_b, cause)) return 21;
      if (ra == hcSuccess) return first.wrong() ? 22 : 23;  // it waited for peers that were told to fail it
      if (took_a > 3.0 || !has(msg_a, cause)) return 24;
      sleepMs(500);  // the peers learn it from the failure notice, not from a destroy
      return 0;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << l.name << " rank " << r;
  }
}

// Two threads on every rank issue the same collective, 20 times, each time on a fresh split of
// the job's communicator. Rank 0's threads start together (their calls race for the
// communicator); the others' start 80 ms before rank 0's, so one of them surely waits in its
// call when the other enters. Every run ends in an error on every rank within the bound, and
// no call returns a wrong element.
TEST(Concurrent, TwoThreadsSameCollectiveNeverReturnWrongData) {
  for (const Layout& l : kLayouts) {
    Job job = jobFor(l);
    job.env["SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES"] = "1048576";
    job.env["SMDDP_AG_SORT_BUFFER_SIZE_BYTES"] = "2097152";
    auto st = run(job, [&](int rank, hcComm_t comm) {
      const auto start = Clock::now();
      int runs_with_error = 0;
      size_t wrong = 0;
      double slowest = 0;
      for (int run = 0; run < 20; ++run) {
        hcComm_t child = splitChild(comm, rank);
        if (!child) return 10;
        Gather warm(16, rank, job.nranks);
        if (warm(child) != hcSuccess || warm.wrong()) return 11;
        Gather g[2] = {Gather(1 << 16, rank, job.nranks), Gather(1 << 16, rank, job.nranks)};
        hcResult_t res[2] = {hcSuccess, hcSuccess};
        double took[2] = {0, 0};
        std::atomic<int> ready{0};
        auto body = [&](int t) {
          ready.fetch_add(1);
          while (ready.load() < 2) {
          }
          if (rank == 0) sleepMs(80);
          const auto t0 = Clock::now();
          res[t] = g[t](child);
          took[t] = since(t0);
        };
        std::thread t1(body, 1);
        body(0);
        t1.join();
        bool error = false;
        for (int t = 0; t < 2; ++t) {
          slowest = std::max(slowest, took[t]);
          if (res[t] == hcSuccess) wrong += g[t].wrong();
          else error = true;
        }
        runs_with_error += error;
        // Every rank is done with the child before any closes it (a failure notice to a closed
        // endpoint waits out its bound).
        if (hcBarrier(comm) != hcSuccess) return 12;
        hcCommDestroy(child);
      }
      std::fprintf(stderr, "[%s rank %d] 20 runs in %.2f s: %d with an error, %zu wrong elements, slowest %.2f s\n",
                   l.name, rank, since(start), runs_with_error, wrong, slowest);
      return wrong ? 20 : runs_with_error != 20 ? 21 : slowest > 3.0 ? 22 : 0;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << l.name << " rank " << r;
  }
}

// hcCommDestroy from another thread while a call is in progress waits for the call and then
// destroys (the call completes, with the right data); hcCommAbort makes the call return
// promptly with an error, then frees. Neither crashes, on one node or two.
TEST(Concurrent, DestroyOrAbortDuringACallOnAnotherThread) {
  for (const Layout& l : {kLayouts[0], kLayouts[1]}) {
    for (const bool abort : {false, true}) {
      Job job = jobFor(l);
      auto st = run(job, [&](int rank, hcComm_t comm) {
        hcComm_t child = splitChild(comm, rank);
        if (!child) return 10;
        Gather warm(16, rank, job.nranks);
        if (warm(child) != hcSuccess || warm.wrong()) return 11;
        Gather g(1 << 16, rank, job.nranks);
        if (rank != 0) {
          sleepMs(300);
          const hcResult_t r = g(child);
          std::fprintf(stderr, "[%s %s rank %d] AllGather: %s %s\n", l.name, abort ? "abort" : "destroy", rank,
                       hcGetErrorString(r), r == hcSuccess ? "" : hcGetLastError(child));
          const hcResult_t d = hcCommDestroy(child);
          if (abort) return r == hcRemoteError ? 0 : 12;
          return r != hcSuccess || g.wrong() ? 13 : d != hcSuccess ? 14 : 0;
        }
        hcResult_t r = hcSuccess;
        std::string msg;
        std::thread caller([&] {
          r = g(child);
          msg = hcGetLastError(child);
        });
        sleepMs(100);
        const auto t0 = Clock::now();
        const hcResult_t d = abort ? hcCommAbort(child) : hcCommDestroy(child);
        const double took = since(t0);
        caller.join();
        std::fprintf(stderr, "[%s %s rank 0] %s %s after %.2f s; the call: %s %s\n", l.name,
                     abort ? "abort" : "destroy", abort ? "hcCommAbort" : "hcCommDestroy", hcGetErrorString(d), took,
                     hcGetErrorString(r), msg.c_str());
        if (d != hcSuccess || took > 3.0) return 20;
        if (abort) return r == hcRemoteError && has(msg, "hcCommAbort") ? 0 : 21;
        return r != hcSuccess || g.wrong() ? 22 : 0;  // destroy waited for the call
      });
      for (int r = 0; r < job.nranks; ++r)
        EXPECT_EQ(st[r], 0) << l.name << (abort ? " abort" : " destroy") << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace hctest
