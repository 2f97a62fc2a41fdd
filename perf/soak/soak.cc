// soak: many random collectives (collective, datatype, op, size 0..--max-bytes, in place or not,
// root), every result checked element by element against the independent reference of
// tests/common/reference.h; prints the collectives run, the wrong elements and this process's
// RSS, open fds and threads at the start, every --report calls and at the end. Bounded by
// --count and --seconds. Every rank draws the same sequence from --seed.
//
//   soak --np 4 --nodes 2 --count 10000            (self-launched, simulated nodes)
#include <dirent.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../../tests/common/reference.h"
#include "hicoll/hicoll.h"
#include "launch/launch.h"

namespace {

using hctest::expectedReduce;
using hctest::inputValue;
using hctest::load;
using hctest::store;

struct Args {
  int np = 4, nodes = 2;
  std::string layout = "contiguous";
  long count = 10000;
  double seconds = 600;
  size_t max_bytes = 8 << 20;
  uint64_t seed = 1;
  long report = 1000;
};

struct Proc {
  long rss_kib = 0, fds = 0, threads = 0;
};

Proc procStats() {
  Proc p;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) p.rss_kib = std::stol(line.substr(6));
    if (line.rfind("Threads:", 0) == 0) p.threads = std::stol(line.substr(8));
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) p.fds += e->d_name[0] != '.';
    closedir(d);
  }
  return p;
}

// One random call: what every rank draws alike.
struct Call {
  hcColl_t coll;
  hcDataType_t t;
  int op;  // builtin hcRedOp_t, or hcNumOps for a pre-multiplied sum
  size_t count;
  bool in_place;
  int root;
};

Call draw(std::mt19937_64& g, int W, size_t max_bytes) {
  Call c;
  const hcColl_t colls[] = {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce, hcCollBroadcast};
  c.coll = colls[g() % 4];
  c.t = hctest::kAllTypes[g() % 10];
  c.op = static_cast<int>(g() % (hcNumOps + 1));
  if (hctest::isBitwise(c.op) && hctest::isFloat(c.t)) c.op = hcSum;  // integer types only
  // Sizes log-uniform in [0, max_bytes] of the whole buffer, zero now and then.
  const size_t e = hcTypeSize(c.t);
  const double lg = std::uniform_real_distribution<double>(0, std::log2(static_cast<double>(max_bytes / e)))(g);
  size_t total = g() % 50 == 0 ? 0 : static_cast<size_t>(std::exp2(lg));
  const bool per_rank = c.coll == hcCollAllGather || c.coll == hcCollReduceScatter;
  c.count = per_rank ? total / static_cast<size_t>(W) : total;
  c.in_place = g() % 2;
  c.root = static_cast<int>(g() % static_cast<uint64_t>(W));
  return c;
}

// Runs one call and returns the wrong elements (a failed call counts all of them).
size_t runOne(hcComm_t comm, int rank, int W, const Call& c, int salt) {
  const size_t e = hcTypeSize(c.t), n = c.count, Wn = n * static_cast<size_t>(W);
  const bool reduces = c.coll == hcCollReduceScatter || c.coll == hcCollAllReduce;
  hcRedOp_t op = static_cast<hcRedOp_t>(c.op == hcNumOps ? hcSum : c.op);
  int kind = c.op;
  double scalar = 1;
  if (reduces && c.op == hcNumOps) {
    scalar = hctest::premulScalar(c.t);
    std::vector<char> s(8);
    store(s.data(), c.t, 0, scalar);
    if (hcRedOpCreatePreMulSum(&op, s.data(), c.t, comm) != hcSuccess) return Wn + 1;
    kind = -1;
  }
  const hcRedOp_t input_kind = kind == hcProd || hctest::isBitwise(kind) ? static_cast<hcRedOp_t>(kind) : hcSum;
  const size_t in_elems = c.coll == hcCollReduceScatter ? Wn : c.coll == hcCollAllGather ? n : n;
  const size_t out_elems = c.coll == hcCollAllGather ? Wn : n;
  std::vector<char> in(in_elems * e + 1), out(out_elems * e + 1, 0x5a);
  hctest::Checker ck{"soak", rank};
  hcResult_t r = hcSuccess;
  switch (c.coll) {
    case hcCollAllGather: {
      void* send = c.in_place ? out.data() + static_cast<size_t>(rank) * n * e : in.data();
      for (size_t i = 0; i < n; ++i) store(send, c.t, i, inputValue(c.t, hcSum, rank, i, salt));
      r = hcAllGather(send, out.data(), n, c.t, comm, nullptr);
      if (r == hcSuccess)
        for (int p = 0; p < W; ++p)
          for (size_t i = 0; i < n; ++i)
            ck.check(c.t, p * n + i, load(out.data(), c.t, p * n + i), inputValue(c.t, hcSum, p, i, salt));
      break;
    }
    case hcCollReduceScatter: {
      for (size_t i = 0; i < Wn; ++i) store(in.data(), c.t, i, inputValue(c.t, input_kind, rank, i, salt));
      void* recv = c.in_place ? in.data() + static_cast<size_t>(rank) * n * e : out.data();
      r = hcReduceScatter(in.data(), recv, n, c.t, op, comm, nullptr);
      std::vector<double> vals(static_cast<size_t>(W));
      if (r == hcSuccess)
        for (size_t i = 0; i < n; ++i) {
          for (int p = 0; p < W; ++p) vals[p] = inputValue(c.t, input_kind, p, rank * n + i, salt);
          ck.check(c.t, i, load(recv, c.t, i), expectedReduce(c.t, kind, vals, scalar));
        }
      break;
    }
    case hcCollAllReduce: {
      for (size_t i = 0; i < n; ++i) store(in.data(), c.t, i, inputValue(c.t, input_kind, rank, i, salt));
      void* recv = c.in_place ? in.data() : out.data();
      r = hcAllReduce(in.data(), recv, n, c.t, op, comm, nullptr);
      std::vector<double> vals(static_cast<size_t>(W));
      if (r == hcSuccess)
        for (size_t i = 0; i < n; ++i) {
          for (int p = 0; p < W; ++p) vals[p] = inputValue(c.t, input_kind, p, i, salt);
          ck.check(c.t, i, load(recv, c.t, i), expectedReduce(c.t, kind, vals, scalar));
        }
      break;
    }
    default: {
      for (size_t i = 0; i < n; ++i) store(in.data(), c.t, i, inputValue(c.t, hcSum, c.root, i, salt));
      void* recv = c.in_place && rank == c.root ? in.data() : out.data();
      r = hcBroadcast(in.data(), recv, n, c.t, c.root, comm, nullptr);
      if (r == hcSuccess)
        for (size_t i = 0; i < n; ++i) ck.check(c.t, i, load(recv, c.t, i), inputValue(c.t, hcSum, c.root, i, salt));
    }
  }
  if (reduces && c.op == hcNumOps) hcRedOpDestroy(op, comm);
  if (r != hcSuccess) {
    std::fprintf(stderr, "soak: rank %d: %s\n", rank, hcGetLastError(comm));
    return out_elems + 1;
  }
  // Nothing written past what was asked for.
  if (!(c.coll == hcCollReduceScatter && c.in_place) && !(c.coll == hcCollBroadcast && c.in_place && rank == c.root) &&
      static_cast<unsigned char>(out.back()) != 0x5a)
    ck.check(c.t, out_elems, 1, 0);
  return ck.wrong;
}

int rankMain(const Args& a) {
  hcComm_t comm = nullptr;
  if (hcCommInitFromEnv(&comm) != hcSuccess) {
    std::fprintf(stderr, "soak: hcCommInitFromEnv: %s\n", hcGetLastError(nullptr));
    return 2;
  }
  int rank = 0, W = 0;
  hcCommUserRank(comm, &rank);
  hcCommCount(comm, &W);
  std::mt19937_64 g(a.seed);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto line = [&](const char* when, long done, uint64_t wrong_all, const Proc& p) {
    if (rank == 0)
      std::printf(
          "soak %-5s collectives %6ld  wrong elements %llu  rank 0: RSS %ld KiB  fds %ld  threads %ld  (%.1f s)\n",
          when, done, static_cast<unsigned long long>(wrong_all), p.rss_kib, p.fds, p.threads, elapsed());
    std::fflush(stdout);
  };
  // The first call maps the segments and connects: the baseline is taken after it.
  uint64_t zero = 0, wrong = 0;
  hcAllReduce(&zero, &zero, 1, hcUint64, hcSum, comm, nullptr);
  const Proc start = procStats();
  line("start", 0, 0, start);
  long done = 0;
  int stop = 0;
  Proc last = start;
  while (!stop) {
    wrong += runOne(comm, rank, W, draw(g, W, a.max_bytes), static_cast<int>(done % 1000));
    ++done;
    // Every rank stops at the same call: rank 0's clock decides, broadcast with the report.
    if (done % a.report == 0 || done == a.count) {
      int32_t over = rank == 0 && (elapsed() > a.seconds || done >= a.count) ? 1 : 0;
      uint64_t all = wrong;
      if (hcBroadcast(&over, &over, 1, hcInt32, 0, comm, nullptr) != hcSuccess ||
          hcAllReduce(&all, &all, 1, hcUint64, hcSum, comm, nullptr) != hcSuccess) {
        std::fprintf(stderr, "soak: rank %d: %s\n", rank, hcGetLastError(comm));
        return 3;
      }
      last = procStats();
      stop = over;
      line(stop ? "end" : "", done, all, last);
      if (stop && rank == 0)
        std::printf("soak: RSS %+ld KiB, fds %+ld, threads %+ld from start to end on rank 0\n",
                    last.rss_kib - start.rss_kib, last.fds - start.fds, last.threads - start.threads);
      if (stop) wrong = all;
    }
  }
  hcCommDestroy(comm);
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"soak: random collectives checked against a reference, bounded in count and time"};
  app.add_option("--np", a.np, "ranks to self-launch")->check(CLI::PositiveNumber);
  app.add_option("--nodes", a.nodes, "simulated nodes")->check(CLI::PositiveNumber);
  app.add_option("--layout", a.layout, "contiguous or interleaved")
      ->check(CLI::IsMember({"contiguous", "interleaved"}));
  app.add_option("--count", a.count, "collectives to run")->check(CLI::PositiveNumber);
  app.add_option("--seconds", a.seconds, "stop after this long (checked every --report calls)");
  std::string max_bytes = "8M";
  app.add_option("--max-bytes", max_bytes, "largest whole buffer (K/M suffixes)");
  app.add_option("--seed", a.seed, "the sequence every rank draws");
  app.add_option("--report", a.report, "print a line every this many calls")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  char* end = nullptr;
  a.max_bytes = std::strtoull(max_bytes.c_str(), &end, 10);
  if (*end == 'K' || *end == 'k') a.max_bytes <<= 10;
  if (*end == 'M' || *end == 'm') a.max_bytes <<= 20;
  if (a.max_bytes < 64) {
    std::fprintf(stderr, "soak: --max-bytes %s is too small (at least 64)\n", max_bytes.c_str());
    return 2;
  }
  if (hicoll::launch::underLauncher()) return rankMain(a);
  hicoll::launch::Options lo;
  lo.np = a.np;
  lo.nodes = a.nodes;
  lo.layout = a.layout == "interleaved" ? hicoll::launch::Layout::Interleaved : hicoll::launch::Layout::Contiguous;
  lo.timeout_s = static_cast<int>(a.seconds) + 120;
  return hicoll::launch::selfLaunch(lo, [&] { return rankMain(a); });
}
