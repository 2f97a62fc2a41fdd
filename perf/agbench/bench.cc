#include "bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "data.h"
#include "report.h"

namespace agbench {
namespace {

using Clock = std::chrono::steady_clock;

// Per-rank statistics delta, fixed size so it can be gathered as bytes.
struct StatWire {
  uint64_t calls[hcNumPaths];
  uint64_t intra, inter;
  int32_t node, pad;
  char reason[128];
};

hcStats readStats(hcComm_t comm) {
  hcStats s{};
  s.size = sizeof s;
  hcCheck(hcCommGetStats(comm, &s), comm, "hcCommGetStats");
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A "Key: N kB" line of a /proc file, in KiB (0 when absent).
double procKiB(const char* path, const char* key) {
  double kib = 0;
  if (FILE* f = std::fopen(path, "r")) {
    char line[256];
    const size_t n = std::strlen(key);
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, key, n) == 0) kib = std::atof(line + n);
    std::fclose(f);
  }
  return kib;
}

class Runner {
 public:
  Runner(const Args& a, World& w) : a_(a), w_(w), W_(w.nranks), me_(w.rank) {}

  int run() {
    std::vector<RankInfo> ranks = gatherRankInfo();
    size_t cap = bufferBytes();
    const size_t slack = static_cast<size_t>(a_.unalign) * 8;  // -u at the widest type
    checkMemory(ranks, 2 * (cap + slack));
    send_ = std::make_unique<GuardedBuffer>(cap, a_.node_memory, slack);
    recv_ = std::make_unique<GuardedBuffer>(cap, a_.node_memory, slack);
    if (me_ == 0) {
      printPreamble(a_, w_, ranks);
      printHeader(a_, w_);
    }
    long long wrong = 0, base_wrong = 0;
    int row_index = 0;
    for (int cycle = 0; cycle < a_.run_cycles; ++cycle) {
      if (me_ == 0 && a_.run_cycles > 1) std::printf("# cycle %d of %d\n", cycle + 1, a_.run_cycles);
      for (const TypeDesc& t : a_.types) {
        for (int op : a_.ops) {
          for (size_t size : a_.sizes()) {
            Row row = runRow(t, op, size, row_index++);
            row.cycle = cycle;
            for (size_t k = 0; k < row.v.size(); ++k) {
              long long n = std::max(0LL, row.v[k].oop.wrong) + std::max(0LL, row.v[k].ip.wrong);
              (k == 0 ? wrong : base_wrong) += n;
            }
            if (me_ == 0) {
              if (a_.report_timestamps) row.timestamp = nowStamp();
              printRow(a_, w_, row);
              if (a_.verbose) printRowStats(row);
              std::fflush(stdout);
            }
            rows_.push_back(std::move(row));
          }
        }
      }
    }
    std::vector<hcStats> final_stats = gatherFinalStats();
    std::vector<double> peak_rss = gatherPeakRss();
    int status = wrong + base_wrong > 0 ? 1 : 0;
    if (me_ == 0) {
      const double avg = printFooter(a_, w_, rows_, wrong, base_wrong);
      if (minBandwidthVerdict(avg) == 1) status = status ? status : 1;
      if (a_.memory_report) printMemory(a_, peak_rss, send_->bytes() + recv_->bytes());
      printConcluded(a_);
      if (a_.verbose) printFinalStats(final_stats);
      if (!a_.json.empty()) writeJson(a_, w_, ranks, rows_, wrong, base_wrong, final_stats);
      std::fflush(stdout);
    }
    // Every rank exits with rank 0's verdict (the bandwidth check is rank 0's).
    int64_t s = status;
    w_.sync->allreduce(&s, 1, Sync::Red::Max);
    return static_cast<int>(s);
  }

 private:
  std::vector<RankInfo> gatherRankInfo() {
    RankInfo mine;
    mine.rank = me_;
    mine.pid = static_cast<int>(::getpid());
    ::gethostname(mine.host, sizeof mine.host - 1);
    const char* label = nullptr;
    hcConfig_t cfg = HC_CONFIG_INITIALIZER;
    if (hcComm_t c = w_.variants[0]->comm()) {
      hcStats s = readStats(c);
      mine.node = s.node;
      mine.local_rank = s.local_rank;
      if (hcCommGetConfig(c, &cfg) == hcSuccess) label = cfg.topoNode;  // what the communicator runs with
    }
    std::snprintf(mine.label, sizeof mine.label, "%s", label && *label ? label : mine.host);
    std::vector<RankInfo> all(W_);
    w_.sync->allgather(&mine, all.data(), sizeof mine);
    return all;
  }

  size_t bufferBytes() const {
    size_t cap = 0;
    for (const TypeDesc& t : a_.types)
      for (size_t s : a_.sizes()) {
        Geometry g = geometry(a_.coll, s, t.size, W_);
        cap = std::max(cap, std::max(g.send_count, g.recv_count) * t.size);
      }
    return std::max<size_t>(cap, 64);
  }

  void call(Variant& v, const Geometry& g, const TypeDesc& t, int op, bool ip) {
    v.run(a_.coll, g, t, op, a_.root, ip, send_->data(), recv_->data());
  }

  // Lays out valid input for timing: send as out-of-place input, recv with the in-place one.
  // AllToAll, SendRecv: the pattern's root is the receiving rank (this one).
  int patternRoot() const { return a_.coll == Coll::AllToAll || a_.coll == Coll::SendRecv ? me_ : a_.root; }

  void fillForTiming(const Geometry& g, const TypeDesc& t, int op, uint64_t seed) {
    Pattern p(a_.coll, t, op, W_, patternRoot(), g.count, seed);
    const size_t ts = t.size;
    switch (a_.coll) {
      case Coll::AllGather:
        fillInput(p, me_, me_ * g.count, g.count, send_->data());
        fillInput(p, me_, me_ * g.count, g.count, recv_->data() + me_ * g.count * ts);
        break;
      case Coll::ReduceScatter:
        fillInput(p, me_, 0, g.send_count, send_->data());
        fillInput(p, me_, 0, g.send_count, recv_->data());
        break;
      case Coll::AllToAll:
      case Coll::SendRecv: fillInput(p, me_, 0, g.send_count, send_->data()); break;
      case Coll::AllReduce:
      case Coll::Broadcast:
        fillInput(p, me_, 0, g.count, send_->data());
        fillInput(p, me_, 0, g.count, recv_->data());
        break;
    }
  }

  // Seconds per call (per leg of a sendrecv call): n iterations of -m calls each. -z 1: a
  // barrier after every call, timed (nccl-tests' blocking mode); -z 3: after every iteration,
  // not timed.
  double timeOnce(Variant& v, const Geometry& g, const TypeDesc& t, int op, bool ip) {
    w_.sync->barrier();
    const int n = itersAt(g.size_bytes), m = a_.agg_iters;
    double untimed = 0;
    auto t0 = Clock::now();
    const double per_call = 1.0 / m / legsPerCall(a_.coll);
    iter_s_.clear();
    auto it0 = t0;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < m; ++j) {
        call(v, g, t, op, ip);
        if (a_.blocking == 1) w_.sync->barrier();
      }
      if (a_.per_iter) {
        const auto it1 = Clock::now();
        iter_s_.push_back(std::chrono::duration<double>(it1 - it0).count() * per_call);
        it0 = it1;
      }
      if (a_.blocking == 3) {
        auto b0 = Clock::now();
        w_.sync->barrier();
        untimed += std::chrono::duration<double>(Clock::now() - b0).count();
        it0 = Clock::now();
      }
    }
    const double total = std::chrono::duration<double>(Clock::now() - t0).count() - untimed;
    return total / n * per_call;
  }

  // The buffers of every rank on this host must fit in its available memory: touching more
  // would end in the kernel's OOM kill (a signal), not an error naming the size.
  void checkMemory(const std::vector<RankInfo>& ranks, size_t per_rank) const {
    size_t here = 0;
    for (const RankInfo& r : ranks) here += std::strcmp(r.host, ranks[static_cast<size_t>(me_)].host) == 0;
    const double avail_kb = procKiB("/proc/meminfo", "MemAvailable:");
    const double need = static_cast<double>(per_rank) * static_cast<double>(here);
    if (avail_kb > 0 && need > avail_kb * 1024)
      throw std::runtime_error("the buffers of the largest size (-e) need " + std::to_string(per_rank >> 20) +
                               " MiB per rank, " + std::to_string(static_cast<size_t>(need) >> 20) + " MiB for the " +
                               std::to_string(here) + " ranks on this host, and it has " +
                               std::to_string(static_cast<size_t>(avail_kb) >> 10) + " MiB available");
  }

  // Each rank's peak resident memory (VmHWM), bytes, for -M; empty without it.
  std::vector<double> gatherPeakRss() {
    if (!a_.memory_report) return {};
    double mine = procKiB("/proc/self/status", "VmHWM:") * 1024;
    std::vector<double> all(W_);
    w_.sync->allgather(&mine, all.data(), sizeof mine);
    return all;
  }

  // -n, or more where --iters-bytes asks for that many bytes per timing (a token-bucket
  // link's burst, or a cache, then counts for little).
  int itersAt(size_t size) const {
    if (a_.iters_bytes == 0 || size == 0) return a_.iters;
    return static_cast<int>(std::clamp<size_t>(a_.iters_bytes / size, static_cast<size_t>(a_.iters), 100000));
  }

  // One checked call on fresh data; the local count of wrong elements.
  long long checkOnce(Variant& v, const Geometry& g, const TypeDesc& t, int op, bool ip, uint64_t seed) {
    Pattern p(a_.coll, t, op, W_, patternRoot(), g.count, seed);
    const size_t ts = t.size;
    char* send = send_->data();
    char* recv = recv_->data();
    const size_t mine = static_cast<size_t>(me_) * g.count;  // first global index of my block
    long long wrong = 0;
    switch (a_.coll) {
      case Coll::AllGather: {
        recv_->poison(g.recv_count * ts);
        fillInput(p, me_, mine, g.count, ip ? recv + mine * ts : send);
        call(v, g, t, op, ip);
        wrong += v.quantBlock() ? countOutsideQuantBound(p, recv, g.count, W_, v.quantBlock())
                                : countWrongOutput(p, recv, 0, g.recv_count);
        wrong += recv_->damagedGuards(g.recv_count * ts, ts);
        if (!ip) wrong += countWrongInput(p, me_, send, mine, g.count);
        break;
      }
      case Coll::ReduceScatter: {
        size_t used = (ip ? g.send_count : g.recv_count) * ts;
        recv_->poison(used);
        fillInput(p, me_, 0, g.send_count, ip ? recv : send);
        call(v, g, t, op, ip);
        const char* res = ip && !v.rsInPlaceAtStart() ? recv + mine * ts : recv;
        wrong += v.quantBlock() ? countOutsideQuantBoundRS(p, res, mine, g.count, W_)
                                : countWrongOutput(p, res, mine, g.count);
        wrong += recv_->damagedGuards(used, ts);
        if (!ip) wrong += countWrongInput(p, me_, send, 0, g.send_count);
        break;
      }
      case Coll::AllToAll:    // out of place only
      case Coll::SendRecv: {  // what the partner sent
        recv_->poison(g.recv_count * ts);
        fillInput(p, me_, 0, g.send_count, send);
        call(v, g, t, op, ip);
        wrong += countWrongOutput(p, recv, 0, g.recv_count);
        wrong += recv_->damagedGuards(g.recv_count * ts, ts);
        wrong += countWrongInput(p, me_, send, 0, g.send_count);
        break;
      }
      case Coll::AllReduce:
      case Coll::Broadcast: {
        bool has_input = a_.coll == Coll::AllReduce || me_ == a_.root;
        recv_->poison(g.count * ts);
        if (has_input) fillInput(p, me_, 0, g.count, ip ? recv : send);
        call(v, g, t, op, ip);
        wrong += countWrongOutput(p, recv, 0, g.count);
        wrong += recv_->damagedGuards(g.count * ts, ts);
        if (!ip && has_input) wrong += countWrongInput(p, me_, send, 0, g.count);
        break;
      }
    }
    if (wrong > 0)
      std::fprintf(stderr, "agbench: rank %d: %s %s %s %s count %zu: %lld wrong elements\n", me_, v.name().c_str(),
                   collName(a_.coll), t.name, ip ? "in-place" : "out-of-place", g.count, wrong);
    return wrong;
  }

  // Single-core memcpy of the row's full buffer by rank 0, timed like a variant (same
  // iteration count) while the other ranks sleep in a barrier.
  double timeMemcpy(size_t bytes) {
    w_.sync->quietBarrier();
    double sec = 0;
    if (me_ == 0 && bytes > 0) {
      if (!cpy_src_) {
        cpy_src_ = std::make_unique<GuardedBuffer>(send_->bytes());
        cpy_dst_ = std::make_unique<GuardedBuffer>(send_->bytes());
      }
      auto t0 = Clock::now();
      for (int i = 0; i < a_.iters; ++i) {
        std::memcpy(cpy_dst_->data(), cpy_src_->data(), bytes);
        asm volatile("" : : "r"(cpy_dst_->data()) : "memory");  // keep every copy
      }
      sec = std::chrono::duration<double>(Clock::now() - t0).count() / a_.iters;
    }
    w_.sync->quietBarrier();
    return sec;
  }

  RowStats statsDelta(const hcStats& before, const hcStats& after, hcColl_t ci) {
    StatWire mine{};
    const hcCollStats& b = before.coll[ci];
    const hcCollStats& e = after.coll[ci];
    for (int p = 0; p < hcNumPaths; ++p) mine.calls[p] = e.calls[p] - b.calls[p];
    mine.intra = e.bytes_intra - b.bytes_intra;
    mine.inter = e.bytes_inter - b.bytes_inter;
    mine.node = after.node;
    std::snprintf(mine.reason, sizeof mine.reason, "%s", e.last_fallback_reason);
    std::vector<StatWire> all(W_);
    w_.sync->allgather(&mine, all.data(), sizeof mine);

    RowStats rs;
    rs.valid = true;
    unsigned long long calls = 0;
    for (int p = 0; p < hcNumPaths; ++p) {
      rs.calls[p] = all[0].calls[p];
      calls += all[0].calls[p];
    }
    rs.fallback_reason = all[0].calls[hcPathFallback] ? all[0].reason : "";
    int nodes = 0;
    for (const StatWire& s : all) nodes = std::max(nodes, s.node + 1);
    rs.inter_per_node.assign(nodes, 0.0);
    for (const StatWire& s : all) {
      if (calls == 0) break;
      if (s.node >= 0) rs.inter_per_node[s.node] += static_cast<double>(s.inter) / calls;
      rs.intra_per_rank = std::max(rs.intra_per_rank, static_cast<double>(s.intra) / calls);
    }
    return rs;
  }

  Row runRow(const TypeDesc& t, int op, size_t size, int row_index) {
    const Geometry g = geometry(a_.coll, size, t.size, W_);
    send_->shift(static_cast<size_t>(a_.unalign) * t.size);
    recv_->shift(static_cast<size_t>(a_.unalign) * t.size);
    Row row;
    row.size = g.size_bytes;
    row.count = g.count;
    row.type = t.name;
    row.redop = opName(op);
    row.root = a_.coll == Coll::Broadcast ? a_.root : -1;
    const size_t nv = w_.variants.size();
    row.v.resize(nv);
    for (size_t k = 0; k < nv; ++k) {
      row.v[k].name = w_.variants[k]->name();
      row.v[k].oop.ran = w_.variants[k]->supports(a_.coll, t, op, false);
      row.v[k].ip.ran = w_.variants[k]->supports(a_.coll, t, op, true);
    }

    const uint64_t base_seed = (static_cast<uint64_t>(row_index) << 24) ^ 0x5eed;
    fillForTiming(g, t, op, base_seed);

    std::vector<hcStats> before(nv);
    for (size_t k = 0; k < nv; ++k)
      if (hcComm_t c = w_.variants[k]->comm()) before[k] = readStats(c);

    for (size_t k = 0; k < nv; ++k)
      for (bool ip : {false, true})
        if ((ip ? row.v[k].ip : row.v[k].oop).ran)
          for (int i = 0; i < a_.warmup; ++i) call(*w_.variants[k], g, t, op, ip);

    // Every repetition times each (variant, placement) once, and memcpy when asked; the
    // starting case rotates so that none always runs first (right after the barrier, or with
    // warmer caches).
    struct Case {
      size_t k;
      bool ip, memcpy;
    };
    std::vector<Case> cases;
    for (size_t k = 0; k < nv; ++k)
      for (bool ip : {false, true})
        if ((ip ? row.v[k].ip : row.v[k].oop).ran) cases.push_back({k, ip, false});
    if (a_.has(Baseline::Memcpy)) {
      cases.push_back({0, false, true});
      timeMemcpy(g.size_bytes);  // fault the copy buffers in
    }
    std::vector<double> memcpy_s;
    for (int rep = 0; rep < a_.reps && !cases.empty(); ++rep) {
      std::vector<double> times;  // seconds per call of the collectives, in cases order
      double cpy = 0;
      std::vector<double> local(cases.size());
      std::vector<std::vector<double>> iters(cases.size());  // -I
      for (size_t i = 0; i < cases.size(); ++i) {
        size_t c = (i + 2 * static_cast<size_t>(rep)) % cases.size();
        const Case& x = cases[c];
        local[c] = x.memcpy ? timeMemcpy(g.size_bytes) : timeOnce(*w_.variants[x.k], g, t, op, x.ip);
        if (!x.memcpy && a_.per_iter) iters[c] = iter_s_;
        if (rep == 0 && !x.memcpy && statsIndex(a_.coll) < hcNumColls)
          if (hcComm_t hc = w_.variants[x.k]->comm()) {
            Measure& m = x.ip ? row.v[x.k].ip : row.v[x.k].oop;
            const hcStats st = readStats(hc);
            const int k = statsIndex(a_.coll);
            m.predicted_us = st.predicted_us[k];
            m.chunk_bytes = st.chunk_bytes[k];
            m.net_window = st.net_window[k];
          }
      }
      for (size_t c = 0; c < cases.size(); ++c)
        if (cases[c].memcpy) cpy = local[c];
        else times.push_back(local[c]);
      combineAcrossRanks(times);  // memcpy is rank 0's alone
      for (size_t c = 0; c < cases.size(); ++c) {
        if (iters[c].empty()) continue;
        // Each iteration as its slowest rank took it (nccl-tests' max over GPUs and processes).
        w_.sync->allreduce(iters[c].data(), static_cast<int>(iters[c].size()), Sync::Red::Max);
        Measure& m = cases[c].ip ? row.v[cases[c].k].ip : row.v[cases[c].k].oop;
        for (size_t i = static_cast<size_t>(a_.per_iter_skip); i < iters[c].size(); ++i)
          m.iter_us.push_back(iters[c][i] * 1e6);
      }
      size_t idx = 0;
      for (const Case& x : cases) {
        if (x.memcpy) continue;
        VariantResult& v = row.v[x.k];
        (x.ip ? v.ip : v.oop).times_us.push_back(times[idx++] * 1e6);
      }
      if (a_.has(Baseline::Memcpy)) memcpy_s.push_back(cpy);
    }
    if (!memcpy_s.empty() && me_ == 0) {
      for (double x : memcpy_s) row.memcpy_times_us.push_back(x * 1e6);
      double med = median(memcpy_s);
      row.memcpy_gbps = med > 0 ? static_cast<double>(g.size_bytes) / med / 1e9 : 0;
    }

    for (size_t k = 0; k < nv; ++k)
      if (hcComm_t c = w_.variants[k]->comm(); c && statsIndex(a_.coll) < hcNumColls)
        row.v[k].stats = statsDelta(before[k], readStats(c), statsIndex(a_.coll));

    // The check runs after timing, on fresh data (a new seed for every call).
    std::vector<long long> wrong;
    for (size_t k = 0; k < nv; ++k)
      for (bool ip : {false, true}) {
        Measure& m = ip ? row.v[k].ip : row.v[k].oop;
        long long n = 0;
        if (m.ran)
          for (int c = 0; c < a_.check; ++c) {
            uint64_t seed = base_seed ^ (static_cast<uint64_t>(k + 1) << 16) ^ (static_cast<uint64_t>(ip) << 15) ^
                            static_cast<uint64_t>(c + 1);
            n += checkOnce(*w_.variants[k], g, t, op, ip, seed);
          }
        wrong.push_back(n);
      }
    std::vector<int64_t> wsum(wrong.begin(), wrong.end());
    if (!wsum.empty()) w_.sync->allreduce(wsum.data(), static_cast<int>(wsum.size()), Sync::Red::Sum);

    size_t idx = 0;
    for (size_t k = 0; k < nv; ++k)
      for (bool ip : {false, true}) {
        Measure& m = ip ? row.v[k].ip : row.v[k].oop;
        long long n = wsum[idx++];
        if (!m.ran) continue;
        m.wrong = a_.check > 0 ? n : -1;
        m.time_us = median(m.times_us);
        if (!m.iter_us.empty()) m.iter = iterStats(m.iter_us);
        bandwidth(a_.coll, g, t.size, W_, m.time_us * 1e-6, &m.algbw, &m.busbw);
      }
    return row;
  }

  void combineAcrossRanks(std::vector<double>& v) {
    if (v.empty()) return;
    const int n = static_cast<int>(v.size());
    switch (a_.average) {
      case 0: w_.sync->broadcast(v.data(), v.size() * sizeof(double), 0); break;
      case 1:
        w_.sync->allreduce(v.data(), n, Sync::Red::Sum);
        for (double& x : v) x /= W_;
        break;
      case 2: w_.sync->allreduce(v.data(), n, Sync::Red::Min); break;
      default: w_.sync->allreduce(v.data(), n, Sync::Red::Max); break;
    }
  }

  std::vector<hcStats> gatherFinalStats() {
    std::vector<hcStats> all;
    hcComm_t c = w_.variants[0]->comm();
    if (!a_.verbose || !c) return all;
    hcStats mine = readStats(c);
    all.resize(W_);
    w_.sync->allgather(&mine, all.data(), sizeof mine);
    return all;
  }

  const Args& a_;
  World& w_;
  const int W_, me_;
  std::unique_ptr<GuardedBuffer> send_, recv_, cpy_src_, cpy_dst_;
  std::vector<double> iter_s_;  // -I: the last timing's iterations, seconds per call
  std::vector<Row> rows_;
};

}  // namespace

Measure::IterStats iterStats(std::vector<double> us) {
  Measure::IterStats s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  auto nearestRank = [n](size_t pct) { return std::min(n - 1, (n * pct + 99) / 100 - 1); };
  s.min = us.front();
  s.max = us.back();
  s.p50 = us[n / 2];
  s.p95 = us[nearestRank(95)];
  s.p99 = us[nearestRank(99)];
  double sum = 0, var = 0;
  for (double x : us) sum += x;
  s.avg = sum / static_cast<double>(n);
  for (double x : us) var += (x - s.avg) * (x - s.avg);
  s.stdev = std::sqrt(var / static_cast<double>(n));
  s.cv_pct = s.avg > 0 ? s.stdev / s.avg * 100 : 0;
  return s;
}

int runBench(const Args& a, World& w) {
  if (a.coll == Coll::Broadcast && (a.root < 0 || a.root >= w.nranks)) {
    if (w.rank == 0) std::fprintf(stderr, "agbench: root %d out of range\n", a.root);
    return 2;
  }
  if (a.coll == Coll::SendRecv && w.nranks % 2) {
    if (w.rank == 0) std::fprintf(stderr, "agbench: sendrecv pairs rank i with i + N/2: N must be even\n");
    return 2;
  }
  Runner r(a, w);
  return r.run();
}

}  // namespace agbench
