// End to end: examples/train_gpt run as a program (self-launched ranks over two simulated
// nodes), its JSON loss curves compared across world sizes, degrees, precisions and resumes.
// One ctest entry runs every test in one process, so each configuration is trained once.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#ifndef TRAIN_GPT
#error "TRAIN_GPT (the path of the train_gpt binary) must be defined"
#endif

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct TrainRun {
  int status = -1;
  std::map<long, double> loss;  // step -> loss
  json summary;
  std::string command;
};

const std::string kCommon = " --steps 30 --seed 7 --launch-timeout 300";

// Runs train_gpt with `args` once per distinct argument string.
const TrainRun& train(const std::string& args) {
  static std::map<std::string, TrainRun> cache;
  auto it = cache.find(args);
  if (it != cache.end()) return it->second;
  TrainRun r;
  r.command = std::string(TRAIN_GPT) + " " + args;
  std::fprintf(stderr, "[train_gpt_test] %s\n", r.command.c_str());
  FILE* p = popen(r.command.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "popen failed for " << r.command;
    return cache[args] = r;
  }
  char line[1 << 16];
  while (std::fgets(line, sizeof line, p)) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    if (j.contains("step")) r.loss[j["step"].get<long>()] = j["loss"].get<double>();
    if (j.contains("summary")) r.summary = j["summary"];
  }
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return cache[args] = r;
}

// Largest relative difference over the steps both runs have; fails when a step is missing.
double maxRelDiff(const TrainRun& a, const TrainRun& b, long first, long last) {
  double worst = 0;
  for (long s = first; s <= last; ++s) {
    if (!a.loss.count(s) || !b.loss.count(s)) {
      ADD_FAILURE() << "step " << s << " missing in " << (a.loss.count(s) ? b.command : a.command);
      return INFINITY;
    }
    worst = std::max(worst, std::fabs(a.loss.at(s) - b.loss.at(s)) / std::fabs(b.loss.at(s)));
  }
  return worst;
}

const TrainRun& single() {
  return train("--np 1 --sdp-degree 1 --precision fp32" + kCommon);
}
const TrainRun& sharded(int degree, const std::string& precision = "fp32") {
  return train("--np 4 --nodes 2 --sdp-degree " + std::to_string(degree) + " --precision " + precision + kCommon);
}

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("train_gpt_test_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

TEST(TrainGpt, SingleProcessMatchesPlainLibtorch) {
  const TrainRun& ref = train("--reference" + kCommon);
  const TrainRun& one = single();
  ASSERT_EQ(ref.status, 0);
  ASSERT_EQ(one.status, 0);
  ASSERT_EQ(one.loss.size(), 30u);
  EXPECT_LE(maxRelDiff(one, ref, 1, 30), 1e-5);
}

TEST(TrainGpt, World4AtEveryDegreeMatchesTheSingleProcess) {
  const TrainRun& one = single();
  ASSERT_EQ(one.status, 0);
  EXPECT_LE(one.loss.at(30), 0.9 * one.loss.at(1)) << "the loss must fall by 10%";
  for (int degree : {1, 2, 4}) {
    const TrainRun& r = sharded(degree);
    ASSERT_EQ(r.status, 0) << r.command;
    ASSERT_EQ(r.loss.size(), 30u) << r.command;
    const double d = maxRelDiff(r, one, 1, 30);
    std::fprintf(stderr, "[train_gpt_test] degree %d: max relative loss difference %.3g\n", degree, d);
    EXPECT_LE(d, 1e-5) << "degree " << degree;
  }
}

TEST(TrainGpt, Bf16AndFp16StayCloseToFp32) {
  const TrainRun& one = single();
  for (const char* precision : {"bf16", "fp16"}) {
    const TrainRun& r = sharded(2, precision);
    ASSERT_EQ(r.status, 0) << r.command;
    ASSERT_EQ(r.loss.size(), 30u);
    const double d = maxRelDiff(r, one, 1, 30);
    std::fprintf(stderr, "[train_gpt_test] %s: max relative loss difference %.3g\n", precision, d);
    EXPECT_LE(d, 1e-2) << precision;  // measured: ~1e-3
    EXPECT_LE(r.loss.at(30), 0.9 * r.loss.at(1)) << precision;
  }
}

// Parameter gathers, and then also the gradient ReduceScatters, as int8 with a scale per 256
// (the master shards stay fp32): the curve stays within a percent of the exact one, and it
// still trains.
TEST(TrainGpt, QuantizedCollectivesStayCloseToExact) {
  const TrainRun& exact = sharded(4);
  ASSERT_EQ(exact.status, 0) << exact.command;
  for (const char* flags : {" --sdp-quantized-allgather", " --sdp-quantized-allgather --sdp-quantized-reducescatter"}) {
    const TrainRun& q = train(std::string("--np 4 --nodes 2 --sdp-degree 4 --precision fp32") + flags + kCommon);
    ASSERT_EQ(q.status, 0) << q.command;
    ASSERT_EQ(q.loss.size(), 30u);
    const double d = maxRelDiff(q, exact, 1, 30);
    std::fprintf(stderr, "[train_gpt_test]%s: max relative loss difference %.3g, final %.5f vs %.5f\n", flags, d,
                 q.loss.at(30), exact.loss.at(30));
    EXPECT_LE(std::fabs(q.loss.at(30) - exact.loss.at(30)) / exact.loss.at(30), 1e-2) << flags;
    EXPECT_LE(q.loss.at(30), 0.9 * q.loss.at(1)) << flags;
    EXPECT_GT(d, 0.0) << flags << ": it did quantize, the curves are not bitwise the same";
  }
}

// A port P with P + 1 free too (a per-node launch listens on both), below the kernel's
// ephemeral range: the connections this job's ranks (or a test running beside it) open take
// their local ports from that range, so none can take P + 1 before the launcher listens on it.
int freePortPair() {
  auto bindable = [](int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (fd >= 0) close(fd);
    return ok;
  };
  int lo = 32768, hi = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    std::fclose(f);
  }
  const int first = std::max(1024, lo - 12000), span = std::max(2, lo - 2 - first);
  std::mt19937 rng(std::random_device{}());
  for (int tries = 0; tries < 500; ++tries) {
    const int p = first + static_cast<int>(rng() % static_cast<unsigned>(span));
    if (bindable(p) && bindable(p + 1)) return p;
  }
  return 0;
}

// One launcher per node, as perf/netns_emulate.sh runs it (one per namespace; here both on
// loopback, the nodes told apart by their labels): the same curve as the self-launched job.
TEST(TrainGpt, OneLauncherPerNodeMatchesTheSelfLaunchedRun) {
  const TrainRun& self = sharded(4);
  ASSERT_EQ(self.status, 0) << self.command;
  const int port = freePortPair();
  ASSERT_GT(port, 0);
  const std::string args = "--np 4 --nodes 2 --sdp-degree 4 --precision fp32" + kCommon +
                           " --master-addr 127.0.0.1 --master-port " + std::to_string(port);
  // The launchers must share one secret (each would make its own otherwise).
  setenv("HICOLL_COMM_SECRET", "train-gpt-test-per-node-0123456789abcdef", 1);
  const TrainRun& nodes = train("--node-rank 1 " + args + " >/dev/null 2>&1 & " + TRAIN_GPT + " --node-rank 0 " + args +
                                "; s=$?; wait $!; t=$?; exit $((s | t))");
  unsetenv("HICOLL_COMM_SECRET");
  ASSERT_EQ(nodes.status, 0) << nodes.command;
  ASSERT_EQ(nodes.loss.size(), 30u);
  EXPECT_LE(maxRelDiff(nodes, self, 1, 30), 1e-6);
}

TEST(TrainGpt, ResumeReproducesTheUninterruptedCurveExactly) {
  const fs::path ckpt = scratch() / "d2";
  const TrainRun& part = train(
      "--np 4 --nodes 2 --sdp-degree 2 --steps 15 --seed 7 --launch-timeout 300"
      " --checkpoint-dir " +
      ckpt.string());
  ASSERT_EQ(part.status, 0);
  ASSERT_TRUE(fs::exists(ckpt / "meta.json"));
  const TrainRun& resumed = train("--np 4 --nodes 2 --sdp-degree 2" + kCommon + " --resume " + ckpt.string());
  ASSERT_EQ(resumed.status, 0);
  const TrainRun& full = sharded(2);
  ASSERT_EQ(resumed.loss.size(), 15u);
  for (long s = 1; s <= 15; ++s) EXPECT_EQ(part.loss.at(s), full.loss.at(s)) << "step " << s;
  for (long s = 16; s <= 30; ++s) EXPECT_EQ(resumed.loss.at(s), full.loss.at(s)) << "step " << s;
}

TEST(TrainGpt, CheckpointAtDegree2ContinuesAtDegree4) {
  const fs::path ckpt = scratch() / "d2";
  train(
      "--np 4 --nodes 2 --sdp-degree 2 --steps 15 --seed 7 --launch-timeout 300"
      " --checkpoint-dir " +
      ckpt.string());
  const TrainRun& r = train("--np 4 --nodes 2 --sdp-degree 4" + kCommon + " --resume " + ckpt.string());
  ASSERT_EQ(r.status, 0);
  ASSERT_EQ(r.loss.size(), 15u);
  EXPECT_LE(maxRelDiff(r, sharded(2), 16, 30), 1e-5);
}

TEST(TrainGpt, StateMemoryPerRankIsAboutOneOverDegree) {
  const json& s1 = sharded(1).summary;
  ASSERT_TRUE(s1.contains("ranks"));
  const double base = s1["ranks"][0]["state_bytes_peak"].get<double>();
  for (int degree : {2, 4}) {
    const json& s = sharded(degree).summary;
    ASSERT_TRUE(s.contains("ranks"));
    for (const json& r : s["ranks"]) {
      const double ratio = r["state_bytes_peak"].get<double>() / base;
      std::fprintf(stderr, "[train_gpt_test] degree %d rank %d: state %.0f bytes = %.3f of degree 1\n", degree,
                   r["rank"].get<int>(), r["state_bytes_peak"].get<double>(), ratio);
      EXPECT_LE(ratio, 1.0 / degree + 0.05) << "degree " << degree;
      EXPECT_GE(ratio, 1.0 / degree - 0.01) << "degree " << degree;
    }
  }
}

}  // namespace
