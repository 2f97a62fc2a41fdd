// hicoll_model: the cost model of src/plan/cost_model.h from the command line.
//   calibrate  runs `agbench calibrate` (beside this program, else on PATH) with the same arguments
//   predict  one call's time on every path, term by term, for given figures and shape
//   scale    the table of predictions at scale (perf/results/2026-12-01.md; FSDP-sized AllGather and
//            ReduceScatter on 8-192 nodes x 8 GPUs), hierarchical vs flat ring vs log-step
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/machine_figures.h"
#include "plan/cost_model.h"

using namespace hicoll;

namespace {

size_t bytesOf(const std::string& s) {
  size_t pos = 0;
  const double v = std::stod(s, &pos);
  const std::string u = s.substr(pos);
  const double m = u.empty() || u == "B" ? 1
                   : u[0] == 'K'         ? 1024.0
                   : u[0] == 'M'         ? 1048576.0
                   : u[0] == 'G'         ? 1073741824.0
                                         : -1;
  if (m < 0 || v < 0) throw CLI::ValidationError("--bytes", "not a size: " + s);
  return static_cast<size_t>(v * m);
}

hcColl_t collOf(const std::string& c) {
  return c == "allgather"       ? hcCollAllGather
         : c == "reducescatter" ? hcCollReduceScatter
         : c == "alltoall"      ? hcCollAllToAll
                                : hcCollAllReduce;
}

// NCCL's bus bandwidth: AllGather and ReduceScatter move (W-1)/W of the size per rank.
double busbw(hcColl_t c, size_t bytes, int W, double s) {
  const double f = c == hcCollAllReduce ? 2.0 * (W - 1) / W : static_cast<double>(W - 1) / W;
  return static_cast<double>(bytes) / s * f / 1e9;
}

// A log-step AllGather across nodes (recursive doubling, NCCL's PAT is of this family): the
// rail's blocks in ceil(log2 N) exchanges of doubling size, the same bytes per link as the
// one-hop exchange, one message latency per step; the node's parts as in the hierarchical path.
Prediction logStep(const MachineFigures& m, const Shape& s, hcColl_t coll, size_t bytes) {
  Prediction p = predict(m, s, coll, Algo::Hier, bytes, false);
  if (s.nodes > 1) {
    const double steps = std::ceil(std::log2(static_cast<double>(s.nodes)));
    p.latency += (steps - 1) * m.net_alpha_s;
    // log2 N messages per rank instead of N-1: the per-message CPU work shrinks.
    const size_t W = static_cast<size_t>(s.nodes) * static_cast<size_t>(s.local);
    const size_t b = bytes / W, K = (b + s.chunk - 1) / s.chunk;
    p.cpu -= 2 * (s.nodes - 1 - steps) * static_cast<double>(K) * m.net_msg_s;
  }
  return p;
}

int predictCmd(const MachineFigures& m, Shape s, const std::string& coll, const std::string& bytes_s, bool in_place,
               size_t quant, size_t elem, size_t chunk_cap) {
  const size_t bytes = bytesOf(bytes_s);
  const hcColl_t c = collOf(coll);
  std::printf("# %s of %zu bytes on %d x %d (host ranks %d, cores %d), chunk %zu, window %zu; figures: %s\n",
              coll.c_str(), bytes, s.nodes, s.local, s.host_ranks, s.cores, s.chunk, s.window, m.source.c_str());
  if (c == hcCollAllToAll) {  // one path
    const Prediction p = predict(m, s, c, Algo::Ring, bytes, in_place);
    std::printf("pairwise %s (%s-bound)\n", p.terms().c_str(), p.bound());
    return 0;
  }
  for (Algo a : {Algo::Hier, Algo::Ring})
    for (bool small : {false, true}) {
      if (small && c != hcCollAllReduce) continue;
      const Prediction p = predict(m, s, c, a, bytes, in_place, small);
      std::printf("%-5s%s %s (%s-bound)\n", algoName(a), c == hcCollAllReduce ? (small ? " gather" : " rs+ag ") : "",
                  p.terms().c_str(), p.bound());
      if (quant && c != hcCollAllReduce) {
        const Prediction q = predictQuantized(m, s, c, a, bytes, in_place, elem, quant);
        std::printf("%-5s int8 %s (%s-bound)\n", algoName(a), q.terms().c_str(), q.bound());
      }
    }
  // What HICOLL_ALGO=auto runs under the defaults: each path's chunk from --chunk up to the cap.
  if (s.nodes > 1)
    for (Algo a : {Algo::Hier, Algo::Ring}) {
      const Chunking k =
          modelChunking(m, s, chunk_cap, true, [&](const Shape& at) { return predict(m, at, c, a, bytes, in_place); });
      std::printf("%-5s auto chunking: %zu x %zu in flight, %.1f us (chunk up to %zu)\n", algoName(a), k.chunk,
                  k.window, k.predicted.total() * 1e6, chunk_cap);
    }
  return 0;
}

// The scale table: assumptions in perf/results/2026-12-01.md.
int scaleCmd(double nic_gbps) {
  MachineFigures m;
  m.source = "scale assumptions";
  m.call_s = 10e-6;       // a kernel launch and its proxy handshake
  m.shm_alpha_s = 5e-6;   // a CUDA IPC event round within the node
  m.copy_Bps = 360e9;     // NVLink: NCCL's measured AllGather busbw on 8 x H100
  m.reduce_Bps = 2e12;    // HBM-bound sums
  m.net_alpha_s = 15e-6;  // EFA one-way message latency
  m.net_Bps = nic_gbps / 8 * 1e9;
  m.net_cpu_s_per_B = 0;  // RDMA: no copies on the host
  m.net_msg_s = 2e-6;     // a proxy's work per message
  std::printf("# per node %.0f Gbit/s, 8 GPUs per node, bf16, chunk 4 MiB, window 8\n", nic_gbps);
  std::printf("%-14s %6s %10s | %12s %8s | %12s %8s | %12s %8s | %s\n", "collective", "nodes", "size(MB)", "hier(ms)",
              "busbw", "ring(ms)", "busbw", "logstep(ms)", "busbw", "hier bound");
  for (hcColl_t c : {hcCollAllGather, hcCollReduceScatter})
    for (double mb : {50.0, 250.0, 1000.0})
      for (int n : {8, 16, 32, 64, 128, 192}) {
        Shape s;
        s.nodes = n;
        s.local = 8;
        s.host_ranks = 8;
        s.cores = 64;
        s.chunk = 4u << 20;
        s.window = 8;
        s.scratch = 1u << 30;
        const size_t bytes = static_cast<size_t>(mb * 1e6) / (8 * n) * (8 * n);
        const int W = 8 * n;
        const Prediction h = predict(m, s, c, Algo::Hier, bytes, false);
        const Prediction r = predict(m, s, c, Algo::Ring, bytes, false);
        char logstep[32] = "           -        -";
        if (c == hcCollAllGather) {
          const Prediction l = logStep(m, s, c, bytes);
          std::snprintf(logstep, sizeof logstep, "%12.3f %8.1f", l.total() * 1e3, busbw(c, bytes, W, l.total()));
        }
        std::printf("%-14s %6d %10.0f | %12.3f %8.1f | %12.3f %8.1f | %s | %s\n",
                    c == hcCollAllGather ? "allgather" : "reducescatter", n, mb, h.total() * 1e3,
                    busbw(c, bytes, W, h.total()), r.total() * 1e3, busbw(c, bytes, W, r.total()), logstep, h.bound());
      }
  return 0;
}

// The measurement runs ranks, which agbench launches: hand the arguments to it.
int calibrateCmd(int argc, char** argv) {
  std::vector<std::string> args = {"agbench", "calibrate"};
  for (int i = 2; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> av;
  for (std::string& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir.resize(dir.rfind('/') + 1);
    const std::string beside = dir + "agbench";
    if (::access(beside.c_str(), X_OK) == 0) ::execv(beside.c_str(), av.data());
  }
  ::execvp("agbench", av.data());
  std::fprintf(stderr, "hicoll_model calibrate: cannot run agbench (beside %s or on PATH): %s\n",
               n > 0 ? std::string(self, static_cast<size_t>(n)).c_str() : "this program", std::strerror(errno));
  return 127;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "calibrate") == 0) return calibrateCmd(argc, argv);
  CLI::App app{"hicoll_model: the cost model's predictions (src/plan/cost_model.h)", "hicoll_model"};
  app.require_subcommand(1);
  app.add_subcommand("calibrate",
                     "measure the machine figures: runs `agbench calibrate` with the arguments that follow "
                     "(e.g. --np 4 --nodes 2 -J model.json; agbench calibrate --help)");
  auto* pred = app.add_subcommand("predict", "one call on every path, term by term");
  std::string model_file, provider = "tcp;ofi_rxm", coll = "allgather", bytes = "64M";
  Shape s;
  pred->add_option("--model", model_file, "figures (HICOLL_MODEL_FILE JSON); default: the provider's");
  pred->add_option("--provider", provider, "provider whose default figures to use")->capture_default_str();
  pred->add_option("--coll", coll, "collective")
      ->check(CLI::IsMember({"allgather", "reducescatter", "allreduce", "alltoall"}))
      ->capture_default_str();
  pred->add_option("--bytes", bytes, "size as nccl-tests counts it (K/M/G)")->capture_default_str();
  pred->add_option("-N,--nodes", s.nodes, "nodes")->capture_default_str()->check(CLI::PositiveNumber);
  pred->add_option("-L,--local", s.local, "ranks per node")->capture_default_str()->check(CLI::PositiveNumber);
  pred->add_option("--host-ranks", s.host_ranks, "ranks sharing one host's cores (default: N x L, emulated)");
  pred->add_option("--cores", s.cores, "cores of that host")->capture_default_str();
  size_t chunk = 256u << 10;
  pred->add_option("--chunk", chunk, "pipeline chunk bytes")->capture_default_str();
  pred->add_option("--window", s.window, "chunks in flight per peer")->capture_default_str();
  size_t chunk_cap = 1u << 20;
  pred->add_option("--chunk-cap", chunk_cap, "largest chunk auto may choose (HICOLL_CHUNK_SIZE)")
      ->capture_default_str();
  bool in_place = false;
  pred->add_flag("--in-place", in_place, "the call in place");
  size_t quant = 0, elem = 4;
  pred->add_option("--quant", quant, "also the quantized call, this many elements per scale (256)");
  pred->add_option("--elem", elem, "bytes per element of the quantized call's type (4: fp32, 2: bf16)")
      ->capture_default_str()
      ->check(CLI::IsMember({2, 4}));
  auto* scale = app.add_subcommand("scale", "predictions at 8-192 nodes x 8 GPUs (perf/results/2026-12-01.md)");
  double gbps = 400;
  scale->add_option("--gbps", gbps, "per-node network, Gbit/s")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (*scale) return scaleCmd(gbps);
    const MachineFigures m = model_file.empty() ? defaultFigures(provider) : loadFigures(model_file);
    if (s.host_ranks <= 1) s.host_ranks = s.nodes * s.local;
    s.chunk = chunk;
    return predictCmd(m, s, coll, bytes, in_place, quant, elem, chunk_cap);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hicoll_model: %s\n", e.what());
    return 2;
  }
}
