// agbench calibrate: the cost model's machine figures, measured through the public API on the
// ranks as launched (emulated nodes included), written as the JSON HICOLL_MODEL_FILE reads.
// Each figure comes from the call the model says isolates it, timed by one rank (or one rail)
// while the others sleep (whileOthersSleep):
//   call_s       an 8-byte AllGather on a communicator of one rank
//   shm_alpha_s  an 8-byte AllGather on the node's ranks: call + 2 synchronisations
//   copy_Bps     memcpy of 32 MiB; reduce_Bps: a two-input float sum of 2 x 16 MiB
//   net_alpha_s  an 8-byte AllGather on one rail (a rank per node): call + one message
//   net_Bps      every rail's AllGather at once (the node's link shared as in a collective,
//                each rep started by a barrier of all ranks) of 16 MiB per rank, median of 5:
//                bytes per node over the time less its latency (not a slope between two sizes:
//                the difference of two noisy times overshot the line rate;
//                perf/results/2026-12-03.md)
//   net_cpu_s_per_B  a loopback TCP stream's time per byte (tcp providers; 0 otherwise)
//   net_msg_s    two ranks of node 0 made nodes of their own (their messages cross the host's
//                own network stack, no link limit): an AllGather of 2 MiB per rank in 16 KiB
//                and in 256 KiB messages, 64 in flight; the time difference per extra message
//                sent and received (needs two ranks per node)
//   quant_Bps    a quantized fp32 AllGather of 16 MiB on a communicator of one rank made to
//                quantize: the block quantized and dequantized once each
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>
#include <vector>

#include "bench.h"

namespace agbench {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over reps of the time per call of n AllGathers of `bytes` per rank on c, each rep
// started by a barrier on `align` (default: c).
double allGatherTime(hcComm_t c, size_t bytes, int n, int reps, hcComm_t align = nullptr) {
  std::vector<char> in(std::max<size_t>(bytes, 1)), out;
  int size = 1;
  hcCheck(hcCommCount(c, &size), c, "hcCommCount");
  out.resize(in.size() * static_cast<size_t>(size));
  for (int i = 0; i < 2; ++i) hcCheck(hcAllGather(in.data(), out.data(), bytes, hcUint8, c, nullptr), c, "hcAllGather");
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    hcCheck(hcBarrier(align ? align : c), c, "hcBarrier");
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i)
      hcCheck(hcAllGather(in.data(), out.data(), bytes, hcUint8, c, nullptr), c, "hcAllGather");
    t.push_back(secondsSince(t0) / n);
  }
  return median(t);
}

double memcpyBps() {
  const size_t n = 32u << 20;
  std::vector<char> a(n, 1), b(n, 2);
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    asm volatile("" : : "r"(b.data()) : "memory");
    t.push_back(secondsSince(t0));
  }
  return static_cast<double>(n) / median(t);
}

double reduceBps() {
  const size_t n = (16u << 20) / sizeof(float);
  std::vector<float> a(n, 1.f), b(n, 2.f), o(n);
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    auto t0 = Clock::now();
    for (size_t i = 0; i < n; ++i) o[i] = a[i] + b[i];
    asm volatile("" : : "r"(o.data()) : "memory");
    t.push_back(secondsSince(t0));
  }
  return 2.0 * static_cast<double>(n * sizeof(float)) / median(t);
}

// A 64 MiB stream over a loopback TCP connection, a thread per side: each side's CPU time per
// byte is about the stream's time per byte (both are busy throughout).
double tcpSecondsPerByte() {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (ls < 0 || ::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(ls, 1) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("calibrate: cannot listen on loopback");
  const size_t total = 64u << 20, chunk = 256u << 10;
  std::thread sender([&] {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      std::vector<char> buf(chunk, 7);
      for (size_t sent = 0; sent < total;) {
        ssize_t k = ::send(s, buf.data(), std::min(chunk, total - sent), 0);
        if (k <= 0) break;
        sent += static_cast<size_t>(k);
      }
    }
    ::close(s);
  });
  int r = ::accept(ls, nullptr, nullptr);
  std::vector<char> buf(chunk);
  size_t got = 0;
  auto t0 = Clock::now();
  while (r >= 0 && got < total) {
    ssize_t k = ::recv(r, buf.data(), buf.size(), 0);
    if (k <= 0) break;
    got += static_cast<size_t>(k);
  }
  const double t = secondsSince(t0);
  sender.join();
  ::close(r);
  ::close(ls);
  if (got < total) throw std::runtime_error("calibrate: the loopback TCP stream broke");
  return t / static_cast<double>(total);
}

// Full-precision bytes quantized or dequantized per second by one core.
double quantBps(hcComm_t self, double call_s) {
  const size_t n = (16u << 20) / sizeof(float);
  std::vector<float> in(n), out(n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i % 1000) - 500.f;
  hcQuant q = HC_QUANT_INITIALIZER;
  auto once = [&] {
    hcCheck(hcAllGatherQuantized(in.data(), out.data(), n, hcFloat32, &q, self, nullptr), self, "hcAllGatherQuantized");
  };
  once();
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    auto t0 = Clock::now();
    once();
    t.push_back(secondsSince(t0));
  }
  hcStats st{};
  st.size = sizeof st;
  hcCheck(hcCommGetStats(self, &st), self, "hcCommGetStats");
  if (st.quantized_calls[hcCollAllGather] == 0)
    throw std::runtime_error("calibrate: the quantized call did not quantize");
  return 2.0 * static_cast<double>(n * sizeof(float)) / std::max(1e-9, median(t) - call_s);
}

// Per-message CPU time: each of the pair's two ranks sends and receives K = b / chunk
// messages per call at once, on a core each, so the time grows by 2 net_msg_s per message.
double messageSeconds(hcComm_t fine, hcComm_t coarse, size_t b, size_t fine_chunk, size_t coarse_chunk) {
  std::vector<double> d;
  for (int r = 0; r < 3; ++r) d.push_back(allGatherTime(fine, b, 5, 3) - allGatherTime(coarse, b, 5, 3));
  const double extra = static_cast<double>(b / fine_chunk - b / coarse_chunk);
  return std::max(0.0, median(d) / (2 * extra));
}

// Runs `timed` where active while the other ranks sleep through it in the kernel: a rank
// waiting in a barrier polls, and where ranks outnumber cores (emulated nodes) the polling
// is timed too (a 2 x 2 launch on 2 cores once gave net_alpha_s 21-70 us, a 2 x 1 one 12-14).
// A first run, with the others in the barrier, sizes their sleep.
template <class F>
void whileOthersSleep(Sync& sync, bool active, F&& timed) {
  double took = 0;
  if (active) {
    const auto t0 = Clock::now();
    timed();
    took = secondsSince(t0);
  }
  sync.allreduce(&took, 1, Sync::Red::Max);
  if (active) timed();
  else std::this_thread::sleep_for(std::chrono::duration<double>(2 * took + 0.005));
  sync.barrier();
}

// The communicators the figures are measured on: the hierarchical path whatever the model
// would choose; `node` relabels a rank's node, chunk and window (when set) fix the pipeline.
struct SplitAs {
  const char* name = "calibrate";
  const char* node = nullptr;
  long long chunk = 0;
  int window = 0;
  bool quantize = false;  // one rank quantizes too
};

hcComm_t split(hcComm_t c, int color, int key, const SplitAs& as = {}) {
  hcConfig_t cfg = HC_CONFIG_INITIALIZER;
  cfg.algo = "hier";
  cfg.name = as.name;
  if (as.node) cfg.topoNode = as.node;
  if (as.chunk) cfg.netChunkBytes = as.chunk;
  if (as.window) cfg.netWindow = as.window;
  if (as.quantize) cfg.quantMinNodes = 1;
  hcComm_t out = nullptr;
  hcCheck(hcCommSplitConfig(c, color, key, &out, &cfg), c, "hcCommSplitConfig (calibrate)");
  return out;
}

// Node 0's first two ranks as two nodes (HC_SPLIT_NOCOLOR elsewhere), in chunks of `chunk`.
hcComm_t splitPair(hcComm_t c, bool member, int local_rank, size_t chunk) {
  SplitAs as;
  as.name = "calibrate-pair";
  as.node = local_rank == 0 ? "calibrate-a" : "calibrate-b";
  as.chunk = static_cast<long long>(chunk);
  as.window = 64;
  return split(c, member ? 1 : HC_SPLIT_NOCOLOR, local_rank, as);
}

}  // namespace

int runCalibrate(const Args& a, World& w, hcComm_t comm) {
  Sync& sync = *w.sync;
  hcStats st{};
  st.size = sizeof st;
  hcCheck(hcCommGetStats(comm, &st), comm, "hcCommGetStats");
  const int N = st.nnodes, L = st.local_ranks;
  if (L == 0) throw std::runtime_error("calibrate: nodes with different numbers of ranks");
  const char* fi = std::getenv("FI_PROVIDER");
  const char* hc = std::getenv("HICOLL_OFI_PROVIDER");
  const std::string provider = fi && *fi ? fi : hc && *hc ? hc : "tcp;ofi_rxm";  // the library's order

  SplitAs quantizing;
  quantizing.quantize = true;
  hcComm_t self = split(comm, w.rank, 0, quantizing), node = split(comm, st.node, st.local_rank),
           rail = split(comm, st.local_rank, st.node);
  double f[8] = {};  // call, shm_alpha, copy, reduce, net_alpha, (net_Bps), net_cpu, quant
  sync.barrier();
  whileOthersSleep(sync, w.rank == 0, [&] {
    f[0] = allGatherTime(self, 8, 2000, 5);
    f[7] = quantBps(self, f[0]);
    f[2] = memcpyBps();
    f[3] = reduceBps();
    f[6] = provider.find("tcp") != std::string::npos || provider.find("sockets") != std::string::npos
               ? tcpSecondsPerByte()
               : 0;
  });
  // One node's ranks (node 0), then one rail (every node's first rank).
  whileOthersSleep(sync, L > 1 && st.node == 0, [&] { f[1] = allGatherTime(node, 8, 1000, 5); });
  whileOthersSleep(sync, N > 1 && st.local_rank == 0, [&] { f[4] = allGatherTime(rail, 8, 300, 5); });
  const size_t bulk = 16u << 20;
  // Every rail at once, each rep started together: with each rail's own barrier nothing made
  // the rails share the link in the timed window.
  const double t_bulk = N > 1 ? allGatherTime(rail, bulk, 2, 5, comm) : 0;
  const bool pair = L > 1 && st.node == 0 && st.local_rank < 2;
  const size_t fine_chunk = 16u << 10, coarse_chunk = 256u << 10;
  hcComm_t fine = splitPair(comm, pair, st.local_rank, fine_chunk),
           coarse = splitPair(comm, pair, st.local_rank, coarse_chunk);
  double msg = 0;
  whileOthersSleep(sync, pair, [&] { msg = messageSeconds(fine, coarse, 2u << 20, fine_chunk, coarse_chunk); });
  if (fine) hcCommDestroy(fine);
  if (coarse) hcCommDestroy(coarse);
  double mine[9] = {f[0], f[1], f[2], f[3], f[4], t_bulk, f[6], f[7], msg};
  sync.allreduce(mine, 9, Sync::Red::Max);
  hcCommDestroy(rail);
  hcCommDestroy(node);
  hcCommDestroy(self);

  if (w.rank != 0) return 0;
  const double call = mine[0];
  nlohmann::ordered_json j;
  j["version"] = 1;
  j["note"] = "agbench calibrate on " + std::to_string(N) + " node(s) x " + std::to_string(L) + " rank(s), provider " +
              provider + (L > 1 ? "" : "; shm_alpha_s: default (one rank per node)") +
              (N > 1 ? "" : "; net_*: defaults (one node)") + (L > 1 ? "" : "; net_msg_s: default (one rank per node)");
  j["call_s"] = call;
  j["shm_alpha_s"] = L > 1 ? std::max(0.0, (mine[1] - call) / 2) : 3e-6;
  j["copy_Bps"] = mine[2];
  j["reduce_Bps"] = mine[3];
  j["net_alpha_s"] = N > 1 ? std::max(1e-7, mine[4] - call) : 50e-6;
  // Per node: L rails x (N-1) blocks each way per call.
  const double per_node = static_cast<double>(L) * (N - 1) * static_cast<double>(bulk);
  const double net_alpha = j["net_alpha_s"].get<double>();
  j["net_Bps"] = N > 1 && mine[5] > net_alpha ? per_node / (mine[5] - net_alpha) : 1.25e9;
  j["net_cpu_s_per_B"] = mine[6];
  j["net_msg_s"] = L > 1 ? mine[8] : 5e-6;
  j["quant_Bps"] = mine[7];
  const std::string text = j.dump(2) + "\n";
  std::printf("# agbench calibrate: %d node(s) x %d rank(s)\n%s", N, L, text.c_str());
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    out << text;
    if (!out) throw std::runtime_error("calibrate: cannot write " + a.json);
    std::printf("# wrote %s\n", a.json.c_str());
  }
  return 0;
}

}  // namespace agbench
