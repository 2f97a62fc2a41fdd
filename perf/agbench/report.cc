#include "report.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>

extern char** environ;

namespace agbench {
namespace {

// Widths of one baseline group (busbw, ratio, busbw, ratio) and of the memcpy group.
constexpr int kGroupWidth = 2 + 7 + 2 + 6 + 2 + 7 + 2 + 6;
constexpr int kMemcpyWidth = 2 + 7 + 2 + 6;

std::string center(const std::string& s, int width) {
  if (static_cast<int>(s.size()) >= width) return s.substr(0, width);
  int left = (width - static_cast<int>(s.size())) / 2;
  return std::string(left, ' ') + s + std::string(width - left - s.size(), ' ');
}

std::string timeStr(double us) {  // nccl-tests' three precisions
  char b[32];
  if (us >= 10000.0) std::snprintf(b, sizeof b, "%7.0f", us);
  else if (us >= 100.0) std::snprintf(b, sizeof b, "%7.1f", us);
  else std::snprintf(b, sizeof b, "%7.2f", us);
  return b;
}

std::string wrongStr(long long w) {
  return w < 0 ? "  N/A" : std::to_string(w);
}

std::string mainName(const Args& a) {
  return "hicoll" + (a.algo.empty() ? std::string() : "/" + a.algo);
}

std::string fmt(const char* f, double v) {
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

void printPreamble(const Args& a, const World& w, const std::vector<RankInfo>& ranks) {
  int version = 0;
  hcGetVersion(&version);
  int nodes = 0;
  for (const RankInfo& r : ranks) nodes = std::max(nodes, r.node + 1);
  std::printf("# agbench (hicoll %d.%d.%d): %s, %d ranks on %d node(s), host buffers (%s), %s, algo %s\n",
              version / 10000, version / 100 % 100, version % 100, collName(a.coll), w.nranks, nodes,
              a.node_memory ? "node memory, hcMemAlloc" : "heap", w.mode.c_str(),
              a.algo.empty() ? "default (HICOLL_ALGO)" : a.algo.c_str());
  std::printf(
      "# nThread 1 nGpus 0 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: 0\n",
      a.min_bytes, a.max_bytes, a.step_factor > 1 ? static_cast<size_t>(a.step_factor) : a.step_bytes,
      a.step_factor > 1 ? "factor" : "bytes", a.warmup, a.iters, a.agg_iters, a.check);
  if (a.ngpus > 0)
    std::printf("# -g %d: agbench times host buffers (nGpus 0); the device path's benchmark is tests/gpu/gpu_bench\n",
                a.ngpus);
  if (a.blocking == 1) std::printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
  if (a.blocking == 3) std::printf("# Blocking: barrier after each iteration of %d call(s), not timed\n", a.agg_iters);
  if (a.unalign) std::printf("# Unaligned: the buffers start %d element(s) past a page boundary\n", a.unalign);
  if (a.run_cycles > 1) std::printf("# Run cycles: %d\n", a.run_cycles);
  if (a.reps > 1) std::printf("# Repetitions: %d per size, variants interleaved; the median is reported\n", a.reps);
  for (size_t k = 1; k < w.variants.size(); ++k) {
    const std::string n = w.variants[k]->name();
    if (n == "mpi")
      std::printf("# Baseline mpi: Open MPI on the same ranks and buffers%s%s\n", w.mpi_note.empty() ? "" : "; ",
                  w.mpi_note.c_str());
    else if (n == "ring" || n == "hier")
      std::printf("# Baseline %s: a second hicoll communicator with HICOLL_ALGO=%s\n", n.c_str(), n.c_str());
  }
  if (a.has(Baseline::Memcpy))
    std::printf(
        "# Baseline memcpy: single-core memcpy of the full buffer (the size column) by rank 0, "
        "timed in turn with the collectives while the other ranks sleep in a barrier\n");
  std::printf("#\n# Using devices\n");
  for (const RankInfo& r : ranks)
    std::printf("#  Rank %2d Group  0 Pid %6d on %10s device host node %s (%d) local %d\n", r.rank, r.pid, r.host,
                r.label, r.node, r.local_rank);
  if (a.coll == Coll::SendRecv) {
    std::printf(
        "#\n# sendrecv: blocking ping-pong of each size between ranks i and i + %d (the lower sends first); time "
        "is half a round trip, algbw = busbw = size / time\n",
        w.nranks / 2);
    for (int i = 0; i < w.nranks / 2; ++i) {
      const RankInfo &x = ranks[static_cast<size_t>(i)], &y = ranks[static_cast<size_t>(sendRecvPeer(i, w.nranks))];
      std::printf("#  pair %d <-> %d: %s\n", x.rank, y.rank,
                  x.node == y.node ? "same node (hicoll: shared memory)" : "across nodes (hicoll: the network)");
    }
  }
  std::printf("#\n");
}

std::string nowStamp() {
  char b[64];
  std::time_t now = std::time(nullptr);
  std::strftime(b, sizeof b, kTimestampFormat, std::localtime(&now));
  return b;
}

void printHeader(const Args& a, const World& w) {
  std::string l1, l2, l3;
  char b[512];
  const char* time = a.report_cputime ? "cputime" : "time";
  if (a.per_iter) {  // nccl-tests' -I layout: four per-iteration figures after each placement
    std::snprintf(b, sizeof b,
                  "# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                  "
                  "              in-place (+ per-iteration)              ",
                  "", "", "", "", "");
    l1 = b;
    std::snprintf(
        b, sizeof b,
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s %6s  %7s  %7s  %7s  "
        "%7s",
        "size", "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%",
        time, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%");
    l2 = b;
    std::snprintf(
        b, sizeof b,
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %5s  %7s  %7s  %7s  "
        "%7s",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", "(us)",
        "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)");
    l3 = b;
  } else {
    std::snprintf(b, sizeof b,
                  "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          ", "", "",
                  "", "", "");
    l1 = b;
    std::snprintf(b, sizeof b, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s", "size", "count",
                  "type", "redop", "root", time, "algbw", "busbw", "#wrong", time, "algbw", "busbw", "#wrong");
    l2 = b;
    std::snprintf(b, sizeof b, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s", "(B)",
                  "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    l3 = b;
  }
  if (a.report_timestamps) {  // nccl-tests' column, before the baselines' own
    l1 += std::string(21, ' ');
    std::snprintf(b, sizeof b, "  %19s", "timestamp");
    l2 += b;
    std::snprintf(b, sizeof b, "  %19s", kTimestampFormat);
    l3 += b;
  }
  // sendrecv has no in-place case: its group shows the baseline's time (half a round trip).
  const bool sr = a.coll == Coll::SendRecv;
  for (size_t k = 1; k < w.variants.size(); ++k) {
    std::string n = w.variants[k]->name();
    l1 += center(n + ": busbw, " + mainName(a) + "/" + n + (sr ? ", time" : ""), kGroupWidth);
    std::snprintf(b, sizeof b, "  %7s  %6s  %7s  %6s", "oop", "ratio", sr ? "time" : "in-pl", sr ? "" : "ratio");
    l2 += b;
    std::snprintf(b, sizeof b, "  %7s  %6s  %7s  %6s", "(GB/s)", "", sr ? "(us)" : "(GB/s)", "");
    l3 += b;
  }
  if (a.has(Baseline::Memcpy)) {
    l1 += center("memcpy", kMemcpyWidth);
    std::snprintf(b, sizeof b, "  %7s  %6s", "1 core", "ip/cpy");
    l2 += b;
    std::snprintf(b, sizeof b, "  %7s  %6s", "(GB/s)", "");
    l3 += b;
  }
  std::printf("%s\n%s\n%s\n", l1.c_str(), l2.c_str(), l3.c_str());
}

void printRow(const Args& a, const World& w, const Row& row) {
  std::string line;
  char b[256];
  std::snprintf(b, sizeof b, "%12zu  %12zu  %8s  %6s  %6d", row.size, row.count, row.type.c_str(), row.redop.c_str(),
                row.root);
  line = b;
  const VariantResult& m = row.v[0];
  for (const Measure* x : {&m.oop, &m.ip}) {
    std::snprintf(b, sizeof b, "  %7s  %6.2f  %6.2f  %5s", timeStr(x->time_us).c_str(), x->algbw, x->busbw,
                  wrongStr(x->wrong).c_str());
    line += b;
    if (a.per_iter) {
      const Measure::IterStats& s = x->iter;
      line += x->iter_us.empty()
                  ? std::string("      n/a      n/a      n/a      n/a")
                  : "  " + timeStr(s.min) + "  " + timeStr(s.max) + "  " + timeStr(s.p99) + "  " + timeStr(s.cv_pct);
    }
  }
  if (a.report_timestamps) line += "  " + row.timestamp;
  for (size_t k = 1; k < row.v.size(); ++k) {
    const VariantResult& v = row.v[k];
    auto part = [&](const Measure& base, const Measure& ours) {
      if (!base.ran) return std::string("      n/a     n/a");
      std::string ratio = base.busbw > 0 ? fmt("%6.2f", ours.busbw / base.busbw) : "     -";
      return "  " + fmt("%7.2f", base.busbw) + "  " + ratio;
    };
    if (a.coll == Coll::SendRecv)
      line += part(v.oop, m.oop) + "  " + (v.oop.ran ? timeStr(v.oop.time_us) : std::string("    n/a")) + "        ";
    else line += part(v.oop, m.oop) + part(v.ip, m.ip);
  }
  if (a.has(Baseline::Memcpy)) {
    std::string ratio = row.memcpy_gbps > 0 ? fmt("%6.2f", m.ip.busbw / row.memcpy_gbps) : "     -";
    line += "  " + fmt("%7.2f", std::max(0.0, row.memcpy_gbps)) + "  " + ratio;
  }
  std::printf("%s\n", line.c_str());
  for (size_t k = 1; k < row.v.size(); ++k)
    for (const Measure* x : {&row.v[k].oop, &row.v[k].ip})
      if (x->wrong > 0)
        std::printf("# WRONG: baseline %s returned %lld wrong elements (%s)\n", row.v[k].name.c_str(), x->wrong,
                    x == &row.v[k].oop ? "out-of-place" : "in-place");
  (void)w;
}

void printRowStats(const Row& row) {
  for (const VariantResult& v : row.v) {
    const RowStats& s = v.stats;
    if (!s.valid) continue;
    unsigned long long calls = s.calls[0] + s.calls[1] + s.calls[2];
    double worst = 0;
    std::string per_node;
    for (double x : s.inter_per_node) {
      worst = std::max(worst, x);
      per_node += " " + fmt("%.0f", x);
    }
    std::printf(
        "#   stats %s: calls hier %llu ring %llu fallback %llu | inter-node bytes/call by node:%s "
        "(max %.3f x size) | intra-node bytes/call per rank max %.0f%s%s\n",
        v.name.c_str(), s.calls[hcPathHierarchical], s.calls[hcPathRing], s.calls[hcPathFallback], per_node.c_str(),
        row.size ? worst / row.size : 0.0, s.intra_per_rank,
        s.fallback_reason.empty() ? "" : " | fallback: ", s.fallback_reason.c_str());
    (void)calls;
    // The cost model beside the measurement (predicted / measured: 1 is a perfect model).
    std::string model;
    for (const Measure* x : {&v.oop, &v.ip})
      if (x->ran && x->predicted_us > 0)
        model += std::string(x == &v.oop ? " oop " : " ip ") + fmt("%.1f us", x->predicted_us) +
                 fmt(" (%.2f x measured", x->time_us > 0 ? x->predicted_us / x->time_us : 0.0) +
                 (x->chunk_bytes ? fmt("; chunk %.0f KiB", static_cast<double>(x->chunk_bytes) / 1024) +
                                       fmt(" x %.0f", static_cast<double>(x->net_window))
                                 : std::string()) +
                 ")";
    if (!model.empty()) std::printf("#   model %s: predicted%s\n", v.name.c_str(), model.c_str());
  }
}

double printFooter(const Args& a, const World& w, const std::vector<Row>& rows, long long wrong_total,
                   long long baseline_wrong) {
  // nccl-tests averages the bus bandwidth over every timed case, out-of-place and in-place.
  auto avg = [&rows](size_t k) {
    double sum = 0;
    int n = 0;
    for (const Row& r : rows) {
      if (k >= r.v.size()) continue;
      for (const Measure* x : {&r.v[k].oop, &r.v[k].ip})
        if (x->ran) sum += x->busbw, ++n;
    }
    return n ? sum / n : 0.0;
  };
  double ours = avg(0);
  for (size_t k = 1; k < w.variants.size(); ++k) {
    double theirs = avg(k);
    std::printf("# Avg bus bandwidth %-6s: %g (%s/%s %.2f)\n", w.variants[k]->name().c_str(), theirs,
                mainName(a).c_str(), w.variants[k]->name().c_str(), theirs > 0 ? ours / theirs : 0.0);
  }
  if (w.variants.size() > 1)
    std::printf("# Baseline wrong elements : %lld %s\n", baseline_wrong, baseline_wrong ? "FAILED" : "OK");
  std::printf("# Out of bounds values : %lld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
  const int verdict = minBandwidthVerdict(ours);
  std::printf("# Avg bus bandwidth    : %g %s\n", ours, verdict < 0 ? "" : verdict ? "FAILED" : "OK");
  std::printf("#\n");
  return ours;
}

int minBandwidthVerdict(double avg_busbw) {
  const char* v = std::getenv("NCCL_TESTS_MIN_BW");
  if (!v || !*v) return -1;
  return avg_busbw < std::atof(v) * 0.9 ? 1 : 0;
}

void printMemory(const Args& a, const std::vector<double>& peak_rss, size_t buffer_bytes) {
  double lo = 0, hi = 0;
  for (size_t k = 0; k < peak_rss.size(); ++k) {
    lo = k ? std::min(lo, peak_rss[k]) : peak_rss[k];
    hi = std::max(hi, peak_rss[k]);
  }
  const double mib = 1024.0 * 1024;
  std::printf("# %-20s : User-Allocated %.1f MiB per rank | peak resident (VmHWM) %.1f - %.1f MiB per rank%s\n",
              "Host memory usage", buffer_bytes / mib, lo / mib, hi / mib,
              a.has(Baseline::Memcpy) ? " (rank 0 also holds the memcpy baseline's buffers)" : "");
}

void printConcluded(const Args& a) {
  // As nccl-tests names its program; agbench adds the collective.
  const bool named = a.program.find("_perf") != std::string::npos;
  std::printf("# Collective test concluded: %s%s%s\n", a.program.c_str(), named ? "" : " ",
              named ? "" : collName(a.coll));
}

void printFinalStats(const std::vector<hcStats>& all) {
  static const char* colls[] = {"allgather", "reducescatter", "allreduce", "broadcast", "barrier", "alltoall"};
  static_assert(sizeof colls / sizeof colls[0] == hcNumColls, "a name per collective");
  std::printf("# hcCommGetStats of the measured communicator, cumulative (warm-up, timing, check):\n");
  std::printf("# %4s %4s %5s  %-13s %10s %10s %10s %14s %14s %14s  %s\n", "rank", "node", "local", "coll", "hier",
              "ring", "fallback", "bytes_intra", "of node_mem", "bytes_inter", "last fallback reason");
  for (const hcStats& s : all)
    for (int c = 0; c < hcNumColls; ++c) {
      const hcCollStats& x = s.coll[c];
      if (!x.calls[0] && !x.calls[1] && !x.calls[2]) continue;
      std::printf("# %4d %4d %5d  %-13s %10llu %10llu %10llu %14llu %14llu %14llu  %s\n", s.rank, s.node, s.local_rank,
                  colls[c], (unsigned long long)x.calls[0], (unsigned long long)x.calls[1],
                  (unsigned long long)x.calls[2], (unsigned long long)x.bytes_intra,
                  (unsigned long long)s.bytes_node_memory[c], (unsigned long long)x.bytes_inter,
                  x.last_fallback_reason[0] ? x.last_fallback_reason : "-");
    }
  for (const hcStats& s : all)
    if (s.p2p_sends || s.p2p_recvs)
      std::printf("# %4d %4d %5d  %-13s sends %llu (%llu bytes), receives %llu (%llu bytes), copied aside %llu\n",
                  s.rank, s.node, s.local_rank, "p2p", (unsigned long long)s.p2p_sends,
                  (unsigned long long)s.p2p_bytes_sent, (unsigned long long)s.p2p_recvs,
                  (unsigned long long)s.p2p_bytes_received, (unsigned long long)s.p2p_copied_aside);
  // The model's figures, as rank 0 has them (every rank decides with the same).
  if (!all.empty() && all[0].model_net_Bps > 0)
    std::printf("# cost model: link %.0f MB/s each way per node; figures: %s\n", all[0].model_net_Bps / 1e6,
                all[0].model_source);
}

void writeJson(const Args& a, const World& w, const std::vector<RankInfo>& ranks, const std::vector<Row>& rows,
               long long wrong_total, long long baseline_wrong, const std::vector<hcStats>& final_stats) {
  using nlohmann::json;
  json j;
  j["tool"] = "agbench";
  int version = 0;
  hcGetVersion(&version);
  j["hicoll_version"] = version;
  j["collective"] = collName(a.coll);
  // As given, less the machine's paths (committed results carry none): the program's name,
  // and arguments under the working directory relative to it.
  std::vector<std::string> argv = a.argv;
  const std::string cwd = std::filesystem::current_path().string() + "/";
  for (size_t k = 0; k < argv.size(); ++k) {
    if (k == 0) argv[k] = std::filesystem::path(argv[k]).filename().string();
    else if (argv[k].rfind(cwd, 0) == 0) argv[k] = argv[k].substr(cwd.size());
  }
  j["argv"] = argv;
  j["mode"] = w.mode;
  j["nranks"] = w.nranks;
  j["algo"] = a.algo.empty() ? "default" : a.algo;
  j["main"] = mainName(a);
  j["mpi_note"] = w.mpi_note;
  j["args"] = {{"minbytes", a.min_bytes},
               {"maxbytes", a.max_bytes},
               {"stepbytes", a.step_bytes},
               {"stepfactor", a.step_factor},
               {"iters", a.iters},
               {"warmup", a.warmup},
               {"check", a.check},
               {"reps", a.reps},
               {"average", a.average},
               {"blocking", a.blocking},
               {"agg_iters", a.agg_iters},
               {"run_cycles", a.run_cycles},
               {"unalign", a.unalign},
               {"per_iter_timing", a.per_iter},
               {"per_iter_skip", a.per_iter_skip},
               {"root", a.root}};
  json env = json::object();
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    std::string k = kv.substr(0, eq);
    if (k == "HICOLL_COMM_SECRET") continue;  // a result file is no place for it
    if (k.rfind("HICOLL_", 0) == 0 || k.rfind("SMDDP_", 0) == 0 || k.rfind("FI_", 0) == 0) env[k] = kv.substr(eq + 1);
  }
  j["env"] = env;
  int nodes = 0;
  for (const RankInfo& r : ranks) {
    nodes = std::max(nodes, r.node + 1);
    j["ranks"].push_back({{"rank", r.rank},
                          {"pid", r.pid},
                          {"host", r.host},
                          {"label", r.label},
                          {"node", r.node},
                          {"local_rank", r.local_rank}});
  }
  j["nodes"] = nodes;
  auto measure = [](const Measure& m) {
    json x;
    x["ran"] = m.ran;
    if (!m.ran) return x;
    x["time_us"] = m.time_us;
    x["times_us"] = m.times_us;
    x["algbw"] = m.algbw;
    x["busbw"] = m.busbw;
    x["wrong"] = m.wrong;
    if (m.predicted_us > 0) x["predicted_us"] = m.predicted_us;
    if (m.chunk_bytes > 0) {
      x["chunk_bytes"] = m.chunk_bytes;
      x["net_window"] = m.net_window;
    }
    if (!m.iter_us.empty())
      x["per_iter"] = {{"min_us", m.iter.min},     {"max_us", m.iter.max},    {"avg_us", m.iter.avg},
                       {"p50_us", m.iter.p50},     {"p95_us", m.iter.p95},    {"p99_us", m.iter.p99},
                       {"stdev_us", m.iter.stdev}, {"cv_pct", m.iter.cv_pct}, {"times_us", m.iter_us}};
    return x;
  };
  for (const Row& r : rows) {
    json row = {{"size", r.size}, {"count", r.count}, {"type", r.type}, {"redop", r.redop}, {"root", r.root}};
    if (a.run_cycles > 1) row["cycle"] = r.cycle;
    if (!r.timestamp.empty()) row["timestamp"] = r.timestamp;
    if (r.memcpy_gbps >= 0) {
      row["memcpy_gbps"] = r.memcpy_gbps;
      row["memcpy_times_us"] = r.memcpy_times_us;
    }
    for (const VariantResult& v : r.v) {
      json x = {{"oop", measure(v.oop)}, {"ip", measure(v.ip)}};
      if (v.stats.valid) {
        x["stats"] = {{"calls_hier", v.stats.calls[hcPathHierarchical]},
                      {"calls_ring", v.stats.calls[hcPathRing]},
                      {"calls_fallback", v.stats.calls[hcPathFallback]},
                      {"inter_bytes_per_call_by_node", v.stats.inter_per_node},
                      {"intra_bytes_per_call_max_rank", v.stats.intra_per_rank},
                      {"fallback_reason", v.stats.fallback_reason}};
      }
      row["variants"][v.name == "hicoll" ? mainName(a) : v.name] = x;
    }
    j["rows"].push_back(row);
  }
  for (const hcStats& s : final_stats) {
    json r = {{"rank", s.rank}, {"node", s.node}, {"local_rank", s.local_rank}};
    for (int c = 0; c < hcNumColls; ++c)
      r["coll"].push_back({{"calls", {s.coll[c].calls[0], s.coll[c].calls[1], s.coll[c].calls[2]}},
                           {"bytes_intra", s.coll[c].bytes_intra},
                           {"bytes_node_memory", s.bytes_node_memory[c]},
                           {"bytes_inter", s.coll[c].bytes_inter},
                           {"quantized_calls", s.quantized_calls[c]},
                           {"last_fallback_reason", s.coll[c].last_fallback_reason}});
    r["p2p"] = {{"sends", s.p2p_sends},
                {"recvs", s.p2p_recvs},
                {"bytes_sent", s.p2p_bytes_sent},
                {"bytes_received", s.p2p_bytes_received},
                {"copied_aside", s.p2p_copied_aside}};
    r["model"] = {{"net_Bps", s.model_net_Bps}, {"source", std::string(s.model_source)}};
    j["final_stats"].push_back(r);
  }
  j["wrong"] = wrong_total;
  j["baseline_wrong"] = baseline_wrong;
  std::ofstream out(a.json);
  out << j.dump(1) << "\n";
  if (!out) std::fprintf(stderr, "agbench: cannot write %s\n", a.json.c_str());
}

}  // namespace agbench
