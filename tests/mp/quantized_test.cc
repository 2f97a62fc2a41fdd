// Tier 3: hcAllGatherQuantized on one node, across nodes, on the ring. Every element arrives
// within the format's bound of what its rank sent, every rank holds the same bits (its own
// block included: it is dequantized too), the send buffer is untouched, NaN and Inf arrive as
// NaN, and the statistics count the calls and the quantized bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../common/mp.h"
#include "../common/reference.h"

namespace hctest {
namespace {

// Rank r's element i: mixed magnitudes per block, a spike now and then, a non-finite value at
// a few fixed places (nan_at: every that many elements; 0 = none).
double inputOf(int rank, size_t i, size_t nan_at) {
  if (nan_at && i % nan_at == 3) return (i / nan_at) % 3 == 0 ? NAN : (i / nan_at) % 3 == 1 ? INFINITY : -INFINITY;
  const uint64_t h = (rank * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
  const double u = static_cast<double>((h >> 11) % 2001) / 1000.0 - 1.0;  // [-1, 1]
  const double scale = std::ldexp(1.0, static_cast<int>((i / 300) % 9) - 4);
  return (i % 97 == 5 ? 40.0 : 1.0) * u * scale;
}

uint64_t fnv(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t k = 0; k < n; ++k) h = (h ^ static_cast<const unsigned char*>(p)[k]) * 1099511628211ull;
  return h;
}

// Half an ulp of t, relative: the output's own rounding on top of the format's bound.
double halfUlp(hcDataType_t t) {
  return t == hcBfloat16 ? 0x1p-8 : t == hcFloat16 ? 0x1p-11 : 0x1p-24;
}

// One quantized AllGather checked on this rank; returns the failures.
int checkQuantized(hcComm_t comm, hcDataType_t t, size_t count, size_t block, bool in_place, size_t nan_at) {
  int W = 0, R = 0;
  hcCommCount(comm, &W);
  hcCommUserRank(comm, &R);
  const size_t e = hcTypeSize(t);
  std::vector<char> send(count * e + 1), recv(W * count * e + 1, 0x5a);
  // Each rank's input, as the type holds it (the bound is about what was sent).
  std::vector<std::vector<double>> sent(W, std::vector<double>(count));
  for (int q = 0; q < W; ++q) {
    std::vector<char> tmp(count * e + 1);
    for (size_t i = 0; i < count; ++i) store(tmp.data(), t, i, inputOf(q, i, nan_at));
    for (size_t i = 0; i < count; ++i) sent[q][i] = load(tmp.data(), t, i);
    if (q == R) std::memcpy(in_place ? recv.data() + R * count * e : send.data(), tmp.data(), count * e);
  }
  const std::vector<char> send_before = send;
  hcQuant qz = HC_QUANT_INITIALIZER;
  qz.block = block;
  const void* src = in_place ? recv.data() + R * count * e : send.data();
  hcResult_t r = hcAllGatherQuantized(src, recv.data(), count, t, &qz, comm, nullptr);
  const std::string what = std::string("quantized ") + typeName(t) + " count " + std::to_string(count) + " block " +
                           std::to_string(block) + (in_place ? " in place" : "");
  if (r != hcSuccess) {
    std::fprintf(stderr, "[rank %d] %s: %s (%s)\n", R, what.c_str(), hcGetErrorString(r), hcGetLastError(comm));
    return 1;
  }
  int fails = 0;
  if (!in_place && send != send_before) {
    std::fprintf(stderr, "[rank %d] %s: the send buffer changed\n", R, what.c_str());
    ++fails;
  }
  size_t wrong = 0;
  for (int q = 0; q < W; ++q)
    for (size_t lo = 0; lo < count; lo += block) {
      const size_t n = std::min(block, count - lo);
      double absmax = 0;
      for (size_t k = 0; k < n; ++k)
        if (std::isfinite(sent[q][lo + k])) absmax = std::max(absmax, std::abs(sent[q][lo + k]));
      for (size_t k = 0; k < n; ++k) {
        const double x = sent[q][lo + k], got = load(recv.data() + q * count * e, t, lo + k);
        const bool ok = std::isfinite(x) ? std::abs(got - x) <= absmax / 254 * (1 + 1e-6) + std::abs(got) * halfUlp(t)
                                         : std::isnan(got);
        if (!ok && wrong++ < 5)
          std::fprintf(stderr, "[rank %d] %s: rank %d element %zu: sent %.9g got %.9g (block absmax %.9g)\n", R,
                       what.c_str(), q, lo + k, x, got, absmax);
      }
    }
  if (wrong) ++fails;
  // Every rank holds the same bits: compare a hash of the output with every other rank's.
  uint64_t mine = fnv(recv.data(), W * count * e);
  std::vector<uint64_t> all(W);
  if (hcAllGather(&mine, all.data(), 1, hcUint64, comm, nullptr) != hcSuccess) return fails + 1;
  for (int q = 0; q < W; ++q)
    if (all[q] != mine) {
      std::fprintf(stderr, "[rank %d] %s: rank %d holds other bits\n", R, what.c_str(), q);
      ++fails;
    }
  if (recv.back() != 0x5a) {
    std::fprintf(stderr, "[rank %d] %s: wrote past the end\n", R, what.c_str());
    ++fails;
  }
  return fails;
}

int quantizedMatrix(int rank, hcComm_t comm) {
  int f = 0;
  for (hcDataType_t t : {hcFloat32, hcBfloat16, hcFloat16})
    for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{70000}})
      for (bool ip : {false, true}) f += checkQuantized(comm, t, count, 256, ip, count > 100 ? 501 : 0);
  f += checkQuantized(comm, hcFloat32, 600000, 2048, false, 0);
  f += checkQuantized(comm, hcBfloat16, 5000, 1, true, 0);
  f += checkQuantized(comm, hcFloat32, 3000, 3000, false, 7);
  // Images of more than 1 MiB per rank travel in pieces (whole blocks each).
  f += checkQuantized(comm, hcFloat32, 2500003, 256, true, 100003);
  f += checkQuantized(comm, hcBfloat16, 3000000, 2048, false, 0);
  // A zero count moves nothing and succeeds.
  hcQuant q = HC_QUANT_INITIALIZER;
  if (hcAllGatherQuantized(nullptr, nullptr, 0, hcFloat32, &q, comm, nullptr) != hcSuccess) ++f;
  hcStats s = HC_STATS_INITIALIZER;
  hcCommGetStats(comm, &s);
  // 24 + 5 quantized calls (the zero count does not communicate).
  if (s.quantized_calls[hcCollAllGather] != 29) {
    std::fprintf(stderr, "[rank %d] quantized_calls %llu, want 29\n", rank,
                 (unsigned long long)s.quantized_calls[hcCollAllGather]);
    ++f;
  }
  return f;
}

void expectAllPass(Job job) {
  auto st = run(job, quantizedMatrix);
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

TEST(Quantized, AllGatherOnOneNode) {
  Job job;
  job.nranks = 3;
  job.env["HICOLL_QUANT_MIN_NODES"] = "1";  // by default one node runs it exact (below)
  expectAllPass(job);
}

// Within a node quantizing costs more than it saves: by default the call is exact there (and
// still agreed as the quantized call it is).
TEST(Quantized, OneNodeIsExactByDefault) {
  Job job;
  job.nranks = 2;
  auto st = run(job, [](int rank, hcComm_t comm) {
    const size_t n = 5000;
    std::vector<float> in(n), out(2 * n);
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(inputOf(rank, i, 0));
    hcQuant q = HC_QUANT_INITIALIZER;
    if (hcAllGatherQuantized(in.data(), out.data(), n, hcFloat32, &q, comm, nullptr) != hcSuccess) return 1;
    for (int r = 0; r < 2; ++r)
      for (size_t i = 0; i < n; ++i)
        if (out[r * n + i] != static_cast<float>(inputOf(r, i, 0))) return 2;
    hcStats s = HC_STATS_INITIALIZER;
    hcCommGetStats(comm, &s);
    if (s.quantized_calls[hcCollAllGather] != 0 || s.coll[hcCollAllGather].calls[hcPathHierarchical] != 1) return 3;
    // A peer that calls the exact AllGather instead is still a disagreement.
    hcResult_t r = rank == 0 ? hcAllGatherQuantized(in.data(), out.data(), n, hcFloat32, &q, comm, nullptr)
                             : hcAllGather(in.data(), out.data(), n, hcFloat32, comm, nullptr);
    return r == hcInvalidUsage || r == hcRemoteError ? 0 : 4;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

TEST(Quantized, AllGatherAcrossNodes) {
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  expectAllPass(job);
}

TEST(Quantized, AllGatherOnTheRing) {
  Job job;
  job.nranks = 3;
  job.node = contiguous(3, 1);
  job.env["HICOLL_ALGO"] = "ring";
  expectAllPass(job);
}

// The bytes that cross nodes are the packed images: about a quarter of fp32's.
TEST(Quantized, SendsFewerBytes) {
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  auto st = run(job, [](int rank, hcComm_t comm) {
    const size_t n = 1 << 18;
    std::vector<float> in(n, 1.0f + rank), out(4 * n);
    auto inter = [&] {
      hcStats s = HC_STATS_INITIALIZER;
      hcCommGetStats(comm, &s);
      return s.coll[hcCollAllGather].bytes_inter;
    };
    const uint64_t b0 = inter();
    if (hcAllGather(in.data(), out.data(), n, hcFloat32, comm, nullptr) != hcSuccess) return 1;
    const uint64_t exact = inter() - b0;
    hcQuant q = HC_QUANT_INITIALIZER;
    if (hcAllGatherQuantized(in.data(), out.data(), n, hcFloat32, &q, comm, nullptr) != hcSuccess) return 2;
    const uint64_t quant = inter() - b0 - exact;
    std::fprintf(stderr, "[rank %d] bytes to the other node: exact %llu, quantized %llu\n", rank,
                 (unsigned long long)exact, (unsigned long long)quant);
    // int8 codes + one fp32 per 256: 1.0156 bytes per element against 4.
    return exact > 0 && quant * 100 < exact * 26 && quant * 100 > exact * 25 ? 0 : 3;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

// One hcReduceScatterQuantized checked on this rank against the exact sum in double: off by at
// most the other nodes' partials' absmax / 254 (taken over the whole block: an upper bound of
// every quantization block's) plus the rounding of the type, of the partials and of the sum.
// L: ranks per node (contiguous). Returns the failures.
int checkQuantizedRS(hcComm_t comm, hcDataType_t t, hcRedOp_t op, size_t count, int L, bool in_place) {
  int W = 0, R = 0;
  hcCommCount(comm, &W);
  hcCommUserRank(comm, &R);
  const size_t e = hcTypeSize(t), N = static_cast<size_t>(W / L);
  std::vector<char> send(W * count * e), recv(count * e + 1, 0x5a);
  auto value = [&](int q, size_t i) {  // as the type holds it
    char tmp[8];
    store(tmp, t, 0, inputOf(q, i, 0) * 8);
    return load(tmp, t, 0);
  };
  for (size_t i = 0; i < W * count; ++i) store(send.data(), t, i, value(R, i));
  hcQuant qz = HC_QUANT_INITIALIZER;
  char* out = in_place ? send.data() + R * count * e : recv.data();
  hcResult_t r = hcReduceScatterQuantized(send.data(), out, count, t, op, &qz, comm, nullptr);
  const std::string what = std::string("quantized ReduceScatter ") + typeName(t) + " " + opName(op) + " count " +
                           std::to_string(count) + (in_place ? " in place" : "");
  if (r != hcSuccess) {
    std::fprintf(stderr, "[rank %d] %s: %s (%s)\n", R, what.c_str(), hcGetErrorString(r), hcGetLastError(comm));
    return 1;
  }
  const size_t my_node = static_cast<size_t>(R / L);
  std::vector<double> absmax(N, 0);
  auto partial = [&](size_t m, size_t i) {
    double p = 0;
    for (int l = 0; l < L; ++l) p += value(static_cast<int>(m) * L + l, R * count + i);
    return p;
  };
  for (size_t m = 0; m < N; ++m)
    for (size_t i = 0; i < count; ++i) absmax[m] = std::max(absmax[m], std::abs(partial(m, i)));
  const double div = op == hcAvg ? W : 1;
  size_t wrong = 0, inexact = 0;
  for (size_t i = 0; i < count; ++i) {
    double want = 0, tol = 0;
    for (size_t m = 0; m < N; ++m) {
      const double p = partial(m, i);
      want += p;
      tol += std::abs(p) * halfUlp(t) + (m == my_node ? 0 : absmax[m] / 254);
    }
    want /= div;
    tol = tol / div + std::abs(want) * 2 * halfUlp(t) + 1e-30;
    const double got = load(out, t, i);
    if (got != want) ++inexact;
    if (!(std::abs(got - want) <= tol) && wrong++ < 5)
      std::fprintf(stderr, "[rank %d] %s: element %zu: got %.9g want %.9g (tolerance %.3g)\n", R, what.c_str(), i, got,
                   want, tol);
  }
  if (!in_place && recv.back() != 0x5a) ++wrong;
  return wrong ? 1 : 0;
}

int quantizedReduceScatters(int rank, hcComm_t comm, int L) {
  int f = 0;
  for (hcDataType_t t : {hcFloat32, hcBfloat16})
    for (hcRedOp_t op : {hcSum, hcAvg})
      for (size_t count : {size_t{1000}, size_t{600000}}) f += checkQuantizedRS(comm, t, op, count, L, count > 1000);
  hcStats s = HC_STATS_INITIALIZER;
  hcCommGetStats(comm, &s);
  const uint64_t want = s.nnodes > 1 ? 8 : 0;  // one node: nothing crosses a link, nothing quantized
  if (s.quantized_calls[hcCollReduceScatter] != want) {
    std::fprintf(stderr, "[rank %d] quantized ReduceScatters %llu, want %llu\n", rank,
                 (unsigned long long)s.quantized_calls[hcCollReduceScatter], (unsigned long long)want);
    ++f;
  }
  // A tiny block (its image would not be smaller) crosses exactly; so does a max, refused.
  f += checkQuantizedRS(comm, hcBfloat16, hcSum, 3, L, false);
  hcQuant q = HC_QUANT_INITIALIZER;
  std::vector<float> in(s.nranks * 10, 1.0f), out(10);
  if (hcReduceScatterQuantized(in.data(), out.data(), 10, hcFloat32, hcMax, &q, comm, nullptr) != hcInvalidArgument ||
      std::string(hcGetLastError(comm)).find("no quantized form") == std::string::npos)
    ++f;
  return f;
}

TEST(Quantized, ReduceScatterAcrossNodes) {
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  auto st = run(job, [](int rank, hcComm_t comm) { return quantizedReduceScatters(rank, comm, 2); });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

TEST(Quantized, ReduceScatterOnOneNodeIsExact) {
  Job job;
  job.nranks = 2;
  auto st = run(job, [](int rank, hcComm_t comm) { return quantizedReduceScatters(rank, comm, 2); });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

// The partials crossing nodes are images: about a quarter of fp32's bytes.
TEST(Quantized, ReduceScatterSendsFewerBytes) {
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  auto st = run(job, [](int rank, hcComm_t comm) {
    const size_t n = 1 << 18;
    std::vector<float> in(4 * n, 1.0f + rank), out(n);
    auto inter = [&] {
      hcStats s = HC_STATS_INITIALIZER;
      hcCommGetStats(comm, &s);
      return s.coll[hcCollReduceScatter].bytes_inter;
    };
    hcQuant q = HC_QUANT_INITIALIZER;
    const uint64_t b0 = inter();
    if (hcReduceScatter(in.data(), out.data(), n, hcFloat32, hcSum, comm, nullptr) != hcSuccess) return 1;
    const uint64_t exact = inter() - b0;
    if (hcReduceScatterQuantized(in.data(), out.data(), n, hcFloat32, hcSum, &q, comm, nullptr) != hcSuccess) return 2;
    const uint64_t quant = inter() - b0 - exact;
    std::fprintf(stderr, "[rank %d] ReduceScatter bytes to the other node: exact %llu, quantized %llu\n", rank,
                 (unsigned long long)exact, (unsigned long long)quant);
    return exact > 0 && quant * 100 < exact * 27 && quant * 100 > exact * 25 ? 0 : 3;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

// Arguments this rank can see are wrong: a clear error on every rank.
TEST(Quantized, BadArgumentsFailOnEveryRank) {
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  job.env["HICOLL_TIMEOUT_MS"] = "20000";
  auto st = run(job, [](int rank, hcComm_t comm) {
    std::vector<float> in(100, 1.0f), out(400);
    int f = 0;
    auto expect = [&](hcResult_t r, hcResult_t want, const char* mention) {
      const std::string msg = hcGetLastError(comm);
      if (r != want || msg.find(mention) == std::string::npos) {
        std::fprintf(stderr, "[rank %d] got %s (%s), want %s naming '%s'\n", rank, hcGetErrorString(r), msg.c_str(),
                     hcGetErrorString(want), mention);
        ++f;
      }
    };
    hcQuant q = HC_QUANT_INITIALIZER;
    // Every rank passes an integer type: each refuses it, nothing is lost.
    expect(hcAllGatherQuantized(in.data(), out.data(), 100, hcInt32, &q, comm, nullptr), hcInvalidArgument,
           "cannot be quantized");
    q.block = (size_t{1} << 24) + 1;
    expect(hcAllGatherQuantized(in.data(), out.data(), 100, hcFloat32, &q, comm, nullptr), hcInvalidArgument, "block");
    q.block = 256;
    // The communicator still works after errors every rank saw alike.
    if (hcAllGatherQuantized(in.data(), out.data(), 100, hcFloat32, &q, comm, nullptr) != hcSuccess) ++f;
    // One rank forgets the descriptor: its peers fail that same call (not the next one).
    hcResult_t r = hcAllGatherQuantized(in.data(), out.data(), 100, hcFloat32, rank == 3 ? nullptr : &q, comm, nullptr);
    if (rank == 3) expect(r, hcInvalidArgument, "quant is NULL");
    else if (r == hcSuccess) ++f;
    return f;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace hctest
