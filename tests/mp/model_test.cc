// The cost model's file (HICOLL_MODEL_FILE) at communicator creation, and its predictions in
// the statistics, with ranks as processes on simulated nodes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "../common/mp.h"

namespace {

using hctest::contiguous;
using hctest::Job;
using hctest::runRaw;

std::string figures(double net_Bps, double quant_Bps = 0) {
  return "{\"version\": 1, \"call_s\": 1e-6, \"shm_alpha_s\": 2e-6, \"copy_Bps\": 5e9, \"reduce_Bps\": 4e9, "
         "\"net_alpha_s\": 4e-5, \"net_Bps\": " +
         std::to_string(net_Bps) + ", \"net_cpu_s_per_B\": 4e-10, \"net_msg_s\": 5e-6" +
         (quant_Bps > 0 ? ", \"quant_Bps\": " + std::to_string(quant_Bps) : std::string()) + "}\n";
}

std::string writeFile(const std::string& tag, const std::string& text) {
  const std::string path = "/tmp/hicoll_model_test_" + std::to_string(::getpid()) + "_" + tag + ".json";
  std::ofstream(path) << text;
  return path;
}

// Creation on every rank; 0 when the error is `want` and names every word in `names`.
int createFails(hcResult_t want, const std::vector<std::string>& names) {
  hcComm_t comm = nullptr;
  const hcResult_t r = hcCommInitFromEnv(&comm);
  const std::string msg = hcGetLastError(nullptr);
  if (r == hcSuccess) {
    hcCommDestroy(comm);
    return 11;
  }
  std::fprintf(stderr, "%s: %s\n", hcGetErrorString(r), msg.c_str());
  if (r != want) return 12;
  for (const std::string& n : names)
    if (msg.find(n) == std::string::npos) return 13;
  return 0;
}

TEST(ModelFile, ContentsThatDifferFailCreationOnEveryRank) {
  const std::string a = writeFile("a", figures(1.25e8)), b = writeFile("b", figures(2.5e8)),
                    a2 = writeFile("a2", figures(1.25e8));
  Job job;
  job.nranks = 2;
  job.node = contiguous(2, 1);
  job.env["HICOLL_TIMEOUT_MS"] = "20000";
  job.rank_env[0]["HICOLL_MODEL_FILE"] = a;
  job.rank_env[1]["HICOLL_MODEL_FILE"] = b;
  auto st = runRaw(job, [&](int) { return createFails(hcInvalidUsage, {"HICOLL_MODEL_FILE", "contents"}); });
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
  // The same contents under another path are the same figures.
  job.rank_env[1]["HICOLL_MODEL_FILE"] = a2;
  st = runRaw(job, [&](int) {
    hcComm_t comm = nullptr;
    if (hcCommInitFromEnv(&comm) != hcSuccess) return 21;
    return hcCommDestroy(comm) == hcSuccess ? 0 : 22;
  });
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
  // A file one rank cannot read: every rank fails at once, naming the variable.
  job.rank_env[1]["HICOLL_MODEL_FILE"] = "/nonexistent/model.json";
  st = runRaw(job, [&](int) { return createFails(hcInvalidUsage, {"HICOLL_MODEL_FILE"}); });
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
  for (const std::string& p : {a, b, a2}) std::remove(p.c_str());
}

TEST(ModelFile, UnusableFilesNameTheFileAndTheField) {
  const std::string bad = writeFile("bad", "{\"version\": 1, \"call_s\": 1e-6}");
  for (const auto& [path, word] : {std::pair<std::string, std::string>{"/nonexistent/model.json", "cannot be read"},
                                   {bad, "no field 'shm_alpha_s'"}}) {
    Job job;
    job.nranks = 2;
    job.env["HICOLL_MODEL_FILE"] = path;
    auto st = runRaw(job, [&](int) { return createFails(hcInvalidArgument, {"HICOLL_MODEL_FILE=" + path, word}); });
    EXPECT_EQ(st[0], 0) << path;
    EXPECT_EQ(st[1], 0) << path;
  }
  std::remove(bad.c_str());
}

// What is not a model file fails creation at once on every rank, naming the variable, the path
// and what is wrong, within the timeout: a FIFO (whose open used to block past it), a device
// (/dev/zero used to be read until memory ran out), a directory, a file above the 1 MiB cap,
// and fields of the wrong type (a string version used to be an internal error from the JSON
// library's text).
TEST(ModelFile, OnlyRegularFilesOfBoundedSizeAreRead) {
  const std::string dir = "/tmp/hicoll_model_test_" + std::to_string(::getpid()) + "_dir";
  const std::string fifo = "/tmp/hicoll_model_test_" + std::to_string(::getpid()) + "_fifo";
  ::mkdir(dir.c_str(), 0700);
  ::mkfifo(fifo.c_str(), 0600);
  const std::string big = writeFile("big", figures(1.25e8) + std::string(size_t{2} << 20, ' '));
  const std::string text_version = writeFile("strver", "{\"version\": \"1\", \"call_s\": 1e-6}");
  const std::string float_version = writeFile("fltver", "{\"version\": 1.5}");
  const std::string bad_field = writeFile("strfield", "{\"version\": 1, \"call_s\": [1]}");
  const std::string bad_note = writeFile("note", "{\"version\": 1, \"note\": 7}");
  struct Case {
    std::string path, word;
  };
  for (const Case& k : {Case{fifo, "a FIFO"}, Case{"/dev/zero", "a character device"}, Case{dir, "a directory"},
                        Case{big, "bytes, more than"}, Case{text_version, "field 'version' is \"1\", not an integer"},
                        Case{float_version, "field 'version' is 1.5, not an integer"},
                        Case{bad_field, "field 'call_s' is not a number"}, Case{bad_note, "field 'note'"}}) {
    Job job;
    job.nranks = 2;
    job.env["HICOLL_MODEL_FILE"] = k.path;
    job.env["HICOLL_TIMEOUT_MS"] = "3000";
    job.timeout_s = 20;
    auto st = runRaw(job, [&](int) {
      const auto t0 = std::chrono::steady_clock::now();
      const int rc = createFails(hcInvalidArgument, {"HICOLL_MODEL_FILE=" + k.path, k.word});
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return rc ? rc : took < 2.5 ? 0 : 14;
    });
    EXPECT_EQ(st[0], 0) << k.path;
    EXPECT_EQ(st[1], 0) << k.path;
  }
  for (const std::string& p : {big, text_version, float_version, bad_field, bad_note, fifo}) std::remove(p.c_str());
  ::rmdir(dir.c_str());
}

// Every modelled call leaves its prediction in hcStats, under auto and under the fixed rules,
// and a faster link predicts a shorter call.
TEST(Model, PredictionsAreInTheStatistics) {
  const std::string slow = writeFile("slow", figures(1.25e8)), fast = writeFile("fast", figures(1.25e10));
  double predicted[2][2] = {};  // [file][algo]
  double* shared = static_cast<double*>(hctest::sharedBytes(sizeof(double) * 4));
  for (int f = 0; f < 2; ++f)
    for (int algo = 0; algo < 2; ++algo) {
      Job job;
      job.nranks = 4;
      job.node = contiguous(2, 2);
      job.env["HICOLL_MODEL_FILE"] = f ? fast : slow;
      job.env["HICOLL_ALGO"] = algo ? "hier" : "auto";
      auto st = hctest::run(job, [&](int rank, hcComm_t comm) {
        std::vector<float> in(1 << 18, 1.f), all(4u << 18);
        if (hcAllGather(in.data(), all.data(), in.size(), hcFloat32, comm, nullptr) != hcSuccess) return 1;
        hcStats s = HC_STATS_INITIALIZER;
        if (hcCommGetStats(comm, &s) != hcSuccess) return 2;
        if (rank == 0) shared[f * 2 + algo] = s.predicted_us[hcCollAllGather];
        return s.predicted_us[hcCollAllGather] > 0 && s.predicted_us[hcCollBroadcast] == 0 ? 0 : 3;
      });
      for (int r = 0; r < 4; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
      predicted[f][algo] = shared[f * 2 + algo];
    }
  // 1 MiB per rank, 2 MiB per node link at 1 Gbit/s: about 17 ms; at 100 Gbit/s the copies and
  // the network stack's work bound it instead, a few ms.
  EXPECT_GT(predicted[0][0], 15000);
  EXPECT_LT(predicted[0][0], 25000);
  EXPECT_LT(predicted[1][0], predicted[0][0] / 3);
  EXPECT_EQ(predicted[0][0], predicted[0][1]) << "the same path, the same prediction";
  std::remove(slow.c_str());
  std::remove(fast.c_str());
}

// Without a model file, under auto, the link is measured at the first call across nodes: every
// rank ends with the same figure to the last bit (the ranks exchange their times; a decision
// made on it must be the same everywhere), and hcStats says where it came from. With
// HICOLL_NET_PROBE_BYTES=0 the figure stays the built-in guess.
TEST(Model, TheLinkMeasuredAtTheFirstCallIsTheSameOnEveryRank) {
  double* shared = static_cast<double*>(hctest::sharedBytes(sizeof(double) * 12));
  for (int probe = 0; probe < 2; ++probe) {
    Job job;
    job.nranks = 4;
    job.node = contiguous(2, 2);
    job.env["HICOLL_ALGO"] = "auto";
    if (!probe) job.env["HICOLL_NET_PROBE_BYTES"] = "0";
    auto st = hctest::run(job, [&](int rank, hcComm_t comm) {
      hcStats s = HC_STATS_INITIALIZER;
      if (hcCommGetStats(comm, &s) != hcSuccess) return 1;
      const double before = s.model_net_Bps;
      std::vector<float> in(1 << 16, 1.f), all(4u << 16);
      if (hcAllGather(in.data(), all.data(), in.size(), hcFloat32, comm, nullptr) != hcSuccess) return 2;
      if (hcCommGetStats(comm, &s) != hcSuccess) return 3;
      shared[probe * 4 + rank] = s.model_net_Bps;
      const bool measured = std::strstr(s.model_source, "measured at the first call") != nullptr;
      std::fprintf(stderr, "[rank %d] link %.0f -> %.0f B/s: %s\n", rank, before, s.model_net_Bps, s.model_source);
      if (before <= 0 || std::strstr(s.model_source, "built-in defaults") == nullptr) return 4;
      if (measured != (probe == 1)) return 5;
      if (!probe && s.model_net_Bps != before) return 6;
      if (probe) {  // the message latency too, as the source says it
        const char* at = std::strstr(s.model_source, " each way and ");
        if (!at || std::sscanf(at, " each way and %lf us a message", &shared[8 + rank]) != 1) return 8;
      }
      return s.model_net_Bps > 0 ? 0 : 7;
    });
    for (int r = 0; r < 4; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << (probe ? " (measured)" : " (built-in)");
    for (int r = 1; r < 4; ++r) EXPECT_EQ(shared[probe * 4 + r], shared[probe * 4]) << "rank " << r;
  }
  for (int r = 1; r < 4; ++r) EXPECT_EQ(shared[8 + r], shared[8]) << "rank " << r << "'s message latency";
  EXPECT_GT(shared[8], 0);
  EXPECT_NE(shared[0], shared[4]) << "the measured link is the built-in guess";
}

// A communicator over the same nodes as one this process measured takes the measured link
// instead of probing it again (its first call neither waits for the rounds nor touches their
// buffers): a child of the same layout has its parent's figure to the last bit and says where it
// came from; children of another layout (one rank per node) measure their own.
TEST(Model, ACommunicatorOverTheSameNodesTakesTheLinkMeasuredBefore) {
  double* shared = static_cast<double*>(hctest::sharedBytes(sizeof(double) * 12));
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  job.env["HICOLL_ALGO"] = "auto";
  auto st = hctest::run(job, [&](int rank, hcComm_t comm) {
    std::vector<float> in(1 << 12, 1.f), all(4u << 12);
    auto firstCall = [&](hcComm_t c, hcStats* s) {
      return hcAllGather(in.data(), all.data(), in.size(), hcFloat32, c, nullptr) == hcSuccess &&
             hcCommGetStats(c, s) == hcSuccess;
    };
    hcStats parent = HC_STATS_INITIALIZER, same = HC_STATS_INITIALIZER, rail = HC_STATS_INITIALIZER;
    if (!firstCall(comm, &parent)) return 1;
    hcComm_t child = nullptr, per_rail = nullptr;
    if (hcCommSplit(comm, 0, rank, &child) != hcSuccess || !child) return 2;
    if (hcCommSplit(comm, rank % 2, rank, &per_rail) != hcSuccess || !per_rail) return 3;
    const bool ok = firstCall(child, &same) && firstCall(per_rail, &rail);
    hcCommDestroy(per_rail);
    hcCommDestroy(child);
    if (!ok) return 4;
    std::fprintf(stderr, "[rank %d] parent: %s\n[rank %d] same nodes: %s\n[rank %d] one rank per node: %s\n", rank,
                 parent.model_source, rank, same.model_source, rank, rail.model_source);
    shared[rank] = same.model_net_Bps;
    shared[4 + rank] = rail.model_net_Bps;
    if (!std::strstr(parent.model_source, "measured at the first call") ||
        std::strstr(parent.model_source, "earlier communicator"))
      return 5;
    if (!std::strstr(same.model_source, "measured at the first call of an earlier communicator over these nodes"))
      return 6;
    if (same.model_net_Bps != parent.model_net_Bps) return 7;
    if (!std::strstr(rail.model_source, "measured at the first call") ||
        std::strstr(rail.model_source, "earlier communicator"))
      return 8;
    return rail.model_net_Bps > 0 ? 0 : 9;
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
  for (int r = 1; r < 4; ++r) EXPECT_EQ(shared[r], shared[0]) << "rank " << r;
  EXPECT_EQ(shared[5 + 1], shared[4]) << "ranks 0 and 2 share a one-rank-per-node child";
  EXPECT_EQ(shared[7], shared[5]) << "ranks 1 and 3 share the other";
}

// Without a model file, the figures are refined from the timed calls at fixed counts
// (HICOLL_MODEL_REFINE_CALLS, plan/refine.h): every rank ends with the same figures to the last
// bit (the same prediction of the same call, the same source text), and says how many calls
// refined them. With the knob at 0 nothing is refined.
TEST(Model, TheFiguresRefinedFromTimedCallsAreTheSameOnEveryRank) {
  constexpr size_t kText = 192;
  char* text = static_cast<char*>(hctest::sharedBytes(kText * 8));
  double* predicted = static_cast<double*>(hctest::sharedBytes(sizeof(double) * 8));
  for (int refine = 0; refine < 2; ++refine) {
    Job job;
    job.nranks = 4;
    job.node = contiguous(2, 2);
    job.env["HICOLL_ALGO"] = "auto";
    job.env["HICOLL_MODEL_REFINE_CALLS"] = refine ? "4" : "0";
    auto st = hctest::run(job, [&](int rank, hcComm_t comm) {
      std::vector<float> in(1 << 12, 1.f), all(4u << 12);
      for (int i = 0; i < 20; ++i) {  // refined after calls 4 and 16
        const size_t n = i % 2 ? in.size() : in.size() / 16;
        if (hcAllGather(in.data(), all.data(), n, hcFloat32, comm, nullptr) != hcSuccess) return 1;
      }
      hcStats s = HC_STATS_INITIALIZER;
      if (hcCommGetStats(comm, &s) != hcSuccess) return 2;
      std::snprintf(text + (refine * 4 + rank) * kText, kText, "%s", s.model_source);
      predicted[refine * 4 + rank] = s.predicted_us[hcCollAllGather];
      std::fprintf(stderr, "[rank %d] %s; predicted %.1f us\n", rank, s.model_source, predicted[refine * 4 + rank]);
      const bool refined = std::strstr(s.model_source, "refined from 16 calls") != nullptr;
      return refined == (refine == 1) ? 0 : 3;
    });
    for (int r = 0; r < 4; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << (refine ? " (refined)" : " (off)");
    for (int r = 1; r < 4; ++r) {
      EXPECT_STREQ(text + (refine * 4 + r) * kText, text + refine * 4 * kText) << "rank " << r;
      EXPECT_EQ(predicted[refine * 4 + r], predicted[refine * 4]) << "rank " << r;
    }
  }
}

// A ring the model chooses is no fallback: counted as the ring, and the fallback reason stays
// empty (the choice and its reason are in the INFO log). A ReduceScatter of 1 MiB on 4 x 1: the
// ring is predicted about 10 % faster (its pipeline fills sooner), with few cores or many.
TEST(Model, AChosenRingIsNoFallback) {
  Job job;
  job.nranks = 4;
  job.node = contiguous(4, 1);
  job.env["HICOLL_ALGO"] = "auto";
  auto st = hctest::run(job, [&](int rank, hcComm_t comm) {
    const size_t n = 1 << 16;
    std::vector<float> in(4 * n, 1.f + rank), out(n);
    if (hcReduceScatter(in.data(), out.data(), n, hcFloat32, hcSum, comm, nullptr) != hcSuccess) return 1;
    for (float v : out)
      if (v != 10.f) return 2;
    hcStats s = HC_STATS_INITIALIZER;
    if (hcCommGetStats(comm, &s) != hcSuccess) return 3;
    const hcCollStats& rs = s.coll[hcCollReduceScatter];
    if (rs.calls[hcPathRing] != 1) return 4;
    if (rs.last_fallback_reason[0] != '\0') {
      std::fprintf(stderr, "[rank %d] fallback reason of a chosen ring: %s\n", rank, rs.last_fallback_reason);
      return 5;
    }
    return 0;
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

// HICOLL_QUANT_MIN_NODES=0: a quantized call quantizes where the model predicts it faster than
// the exact call. 1 Gbit/s links and fast kernels: 2 x 2 quantizes (a quarter of the bytes),
// and its predicted time is below the exact call's; one node runs it exact (memory bounds it);
// 1 Tbit/s links and slow kernels: 2 x 2 runs it exact too. On 2 x 1 the exact ReduceScatter's
// ring is predicted about as fast as its hierarchical path; quantized, the hierarchical path
// (the one that quantizes) is the faster by far.
TEST(Model, QuantizedCallsQuantizeWhereThePredictionIsFaster) {
  const std::string slow = writeFile("qslow", figures(1.25e8, 4e9)), fast = writeFile("qfast", figures(1.25e11, 5e8));
  struct Case {
    int nodes, local;
    std::string file;
    bool quantizes;
  };
  for (const Case& k :
       {Case{2, 2, slow, true}, Case{2, 1, slow, true}, Case{1, 2, slow, false}, Case{2, 2, fast, false}}) {
    Job job;
    job.nranks = k.nodes * k.local;
    job.node = contiguous(k.nodes, k.local);
    job.env["HICOLL_MODEL_FILE"] = k.file;
    job.env["HICOLL_QUANT_MIN_NODES"] = "0";
    auto st = hctest::run(job, [&](int rank, hcComm_t comm) {
      const size_t n = 1 << 20, W = static_cast<size_t>(job.nranks);
      std::vector<float> in(W * n), out(W * n);
      for (size_t i = 0; i < in.size(); ++i) in[i] = 0.001f * static_cast<float>((i * 7 + rank) % 1999) - 1.f;
      hcQuant q = HC_QUANT_INITIALIZER;
      if (hcAllGatherQuantized(in.data(), out.data(), n, hcFloat32, &q, comm, nullptr) != hcSuccess) return 1;
      hcStats s = HC_STATS_INITIALIZER;
      if (hcCommGetStats(comm, &s) != hcSuccess) return 2;
      const double quantized_us = s.predicted_us[hcCollAllGather];
      const bool quantized = s.quantized_calls[hcCollAllGather] == 1;
      // Exact: every element is what its rank sent (0.001 * k - 1 is no multiple of a scale).
      bool exact = true;
      for (size_t j = 0; j < W && exact; ++j)
        for (size_t i = 0; i < n; ++i)
          if (out[j * n + i] != 0.001f * static_cast<float>((i * 7 + j) % 1999) - 1.f) {
            exact = false;
            break;
          }
      if (quantized != k.quantizes || exact == k.quantizes) {
        std::fprintf(stderr, "[rank %d] quantized %d exact %d, want quantized %d\n", rank, quantized, exact,
                     k.quantizes);
        return 3;
      }
      if (hcReduceScatterQuantized(in.data(), out.data(), n, hcFloat32, hcSum, &q, comm, nullptr) != hcSuccess)
        return 4;
      if (hcCommGetStats(comm, &s) != hcSuccess) return 5;
      if ((s.quantized_calls[hcCollReduceScatter] == 1) != k.quantizes) return 6;
      // The exact AllGather of the same size is predicted slower where the call quantized.
      if (hcAllGather(in.data(), out.data(), n, hcFloat32, comm, nullptr) != hcSuccess) return 7;
      if (hcCommGetStats(comm, &s) != hcSuccess) return 8;
      if (quantized_us <= 0 || (k.quantizes && quantized_us >= s.predicted_us[hcCollAllGather])) {
        std::fprintf(stderr, "[rank %d] predicted quantized %.1f us, exact %.1f us\n", rank, quantized_us,
                     s.predicted_us[hcCollAllGather]);
        return 9;
      }
      return 0;
    });
    for (int r = 0; r < job.nranks; ++r)
      EXPECT_EQ(st[r], 0) << k.nodes << "x" << k.local << " " << k.file << " rank " << r;
  }
  std::remove(slow.c_str());
  std::remove(fast.c_str());
}

// Where the model raises the chunk (each rank's per-message work bounds a loopback call), the
// raised chunk goes eager and the call is exact; so it is under an eager limit the environment
// holds at the default on every rank. An eager limit that differs between ranks (rxm would never
// connect them) fails creation on every rank, naming the variable.
TEST(Model, TheModelsChunkAndTheEagerLimitAgree) {
  const std::string fast =
      writeFile("msgbound",
                "{\"version\": 1, \"call_s\": 1e-6, \"shm_alpha_s\": 2e-6, \"copy_Bps\": 5e9, \"reduce_Bps\": 4e9, "
                "\"net_alpha_s\": 4e-5, \"net_Bps\": 1.25e10, \"net_cpu_s_per_B\": 0, \"net_msg_s\": 1e-4}\n");
  size_t want_chunk = 0;  // what the statistics must show the call ran with
  auto gather = [&want_chunk](int rank, hcComm_t comm) {
    const size_t n = 1u << 20;  // 4 MiB per rank: 16 messages of 256 KiB, 4 of 1 MiB
    std::vector<float> in(n), all(2 * n, -1.f);
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(rank * 7 + static_cast<int>(i % 1000));
    for (int rep = 0; rep < 2; ++rep)
      if (hcAllGather(in.data(), all.data(), n, hcFloat32, comm, nullptr) != hcSuccess) return 1;
    for (int r = 0; r < 2; ++r)
      for (size_t i = 0; i < n; ++i)
        if (all[r * n + i] != static_cast<float>(r * 7 + static_cast<int>(i % 1000))) return 2;
    hcStats s = HC_STATS_INITIALIZER;
    if (hcCommGetStats(comm, &s) != hcSuccess) return 3;
    if (s.chunk_bytes[hcCollAllGather] != want_chunk || s.net_window[hcCollAllGather] < 4) return 4;
    return 0;
  };
  Job job;
  job.nranks = 2;
  job.node = contiguous(2, 1);
  job.env["HICOLL_MODEL_FILE"] = fast;
  job.env["HICOLL_TIMEOUT_MS"] = "20000";
  want_chunk = 1u << 20;  // the cap, HICOLL_CHUNK_SIZE
  auto st = hctest::run(job, gather);
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
  job.env["FI_OFI_RXM_EAGER_LIMIT"] = "262144";
  want_chunk = 256u << 10;
  st = hctest::run(job, gather);
  EXPECT_EQ(st[0], 0) << "both at 256 KiB";
  EXPECT_EQ(st[1], 0) << "both at 256 KiB";
  job.env.erase("FI_OFI_RXM_EAGER_LIMIT");
  job.rank_env[0]["FI_OFI_RXM_EAGER_LIMIT"] = "262144";
  st = runRaw(job, [&](int) {
    return createFails(hcInvalidUsage, {"FI_OFI_RXM_EAGER_LIMIT", "rank 0 has 262144", "rank 1 has 1048576"});
  });
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0);
  std::remove(fast.c_str());
}

// HICOLL_REPRODUCIBLE lets timings choose the chunk and window of a reduction, as they sum alike
// whatever the chunking: on each path the same bits on every rank for every chunk and window,
// the quantized ReduceScatter's too (its blocks do not restart at chunks on the host). The two
// paths sum in different orders, which this data sees (else the test could not fail).
TEST(Model, AReductionSumsAlikeWhateverItsChunking) {
  struct Chunking {
    const char *chunk, *net_chunk, *window;
  };
  const Chunking chunkings[] = {{nullptr, nullptr, nullptr}, {"65536", "65536", "1"}, {"4096", "4096", "2"}};
  constexpr int kRuns = 2 * 3;
  uint64_t* hashes = static_cast<uint64_t*>(hctest::sharedBytes(sizeof(uint64_t) * kRuns * 4 * 3));
  for (int algo = 0; algo < 2; ++algo)
    for (int k = 0; k < 3; ++k) {
      Job job;
      job.nranks = 4;
      job.node = contiguous(2, 2);
      job.env["HICOLL_ALGO"] = algo ? "ring" : "hier";
      job.env["HICOLL_NET_PROBE_BYTES"] = "0";
      job.env["HICOLL_MODEL_REFINE_CALLS"] = "0";
      if (chunkings[k].chunk) {
        job.env["HICOLL_CHUNK_SIZE"] = chunkings[k].chunk;
        job.env["HICOLL_NET_CHUNK_SIZE"] = chunkings[k].net_chunk;
        job.env["HICOLL_NET_WINDOW"] = chunkings[k].window;
      }
      const int run = algo * 3 + k;
      auto st = hctest::run(job, [&](int rank, hcComm_t comm) {
        const size_t block = size_t{1} << 16;
        std::vector<float> in(4 * block), out(block), all(4 * block);
        // Magnitudes from 1e-3 to 1e3: each order of the four sums rounds its own way.
        for (size_t i = 0; i < in.size(); ++i)
          in[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank) *
                                     std::pow(10.0, static_cast<double>((i + 3 * static_cast<size_t>(rank)) % 7) - 3));
        auto fnv = [](const std::vector<float>& v) {
          uint64_t h = 1469598103934665603ull;
          const unsigned char* b = reinterpret_cast<const unsigned char*>(v.data());
          for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
          return h;
        };
        if (hcReduceScatter(in.data(), out.data(), block, hcFloat32, hcSum, comm, nullptr) != hcSuccess) return 1;
        if (hcAllReduce(in.data(), all.data(), in.size(), hcFloat32, hcSum, comm, nullptr) != hcSuccess) return 2;
        hashes[(run * 4 + rank) * 3] = fnv(out);
        hashes[(run * 4 + rank) * 3 + 1] = fnv(all);
        hcQuant q = HC_QUANT_INITIALIZER;
        if (hcReduceScatterQuantized(in.data(), out.data(), block, hcFloat32, hcSum, &q, comm, nullptr) != hcSuccess)
          return 3;
        hashes[(run * 4 + rank) * 3 + 2] = fnv(out);
        return 0;
      });
      for (int r = 0; r < 4; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << ", run " << run;
    }
  auto hash = [&](int run, int rank, int coll) { return hashes[(run * 4 + rank) * 3 + coll]; };
  for (int coll = 0; coll < 3; ++coll) {
    const char* name = coll == 2 ? "ReduceScatterQuantized" : coll ? "AllReduce" : "ReduceScatter";
    for (int rank = 0; rank < 4; ++rank) {
      for (int algo = 0; algo < 2; ++algo)
        for (int k = 1; k < 3; ++k)
          EXPECT_EQ(hash(algo * 3 + k, rank, coll), hash(algo * 3, rank, coll))
              << name << " on rank " << rank << (algo ? " (ring)" : " (hierarchical)") << " with chunk "
              << chunkings[k].chunk << ", net chunk " << chunkings[k].net_chunk << ", window " << chunkings[k].window;
      EXPECT_NE(hash(0, rank, coll), hash(3, rank, coll)) << name << " on rank " << rank << ": the paths sum alike";
    }
  }
}

}  // namespace
