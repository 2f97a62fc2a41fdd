// Bandwidth of the device path on device buffers, nccl-tests style, with the GPU's
// device-to-device copy rate measured in the same run as the ceiling (the intra-node path
// moves data with copy engines, so the copy rate bounds it).
//
//   gpu_bench [-np 4] [-nodes 1] [-b 1M] [-e 64M] [-f 4] [-n 20] [-w 5] [-c ag,rs,ar] [-d float]
//
// Sizes are nccl-tests' (AllGather: the output; ReduceScatter: the input; AllReduce: the
// buffer). busbw = algbw * (n-1)/n for AllGather/ReduceScatter, * 2(n-1)/n for AllReduce.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../device/values.h"
#include "base/coll.h"
#include "gpu_launch.h"
#include "hicoll/hicoll.h"

namespace {

int g_rank = -1;
hcComm_t g_comm = nullptr;

#define CK(call)                                                                                                   \
  do {                                                                                                             \
    cudaError_t e_ = (call);                                                                                       \
    if (e_ != cudaSuccess) {                                                                                       \
      std::fprintf(stderr, "[rank %d] %s:%d %s: %s\n", g_rank, __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      return 1;                                                                                                    \
    }                                                                                                              \
  } while (0)
#define HK(call)                                                                                                    \
  do {                                                                                                              \
    hcResult_t r_ = (call);                                                                                         \
    if (r_ != hcSuccess) {                                                                                          \
      std::fprintf(stderr, "[rank %d] %s:%d %s: %s: %s\n", g_rank, __FILE__, __LINE__, #call, hcGetErrorString(r_), \
                   hcGetLastError(g_comm));                                                                         \
      return 1;                                                                                                     \
    }                                                                                                               \
  } while (0)

struct Opts {
  int np = 4, nodes = 1;
  size_t minb = 1 << 20, maxb = 64 << 20;
  int factor = 4, iters = 20, warmup = 5;
  std::vector<hcColl_t> colls = {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce};
  hcDataType_t dt = hcFloat32;
};

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (end && *end ? *end : ' ') {
    case 'K':
    case 'k': v *= 1024; break;
    case 'M':
    case 'm': v *= 1024 * 1024; break;
    case 'G':
    case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

double maxAcross(double v) {
  double out = v;
  if (hcAllReduce(&v, &out, 1, hcFloat64, hcMax, g_comm, nullptr) != hcSuccess) return -1;
  return out;
}

struct Pointers {
  const void* send;
  void* recv;
  size_t count;      // per-call count argument
  size_t in_bytes;   // this rank's input
  size_t out_bytes;  // this rank's output
};

Pointers place(hcColl_t coll, size_t size, size_t e, int rank, int W, char* ds, char* dr, bool in_place) {
  Pointers p{ds, dr, 0, 0, 0};
  switch (coll) {
    case hcCollAllGather:
      p.count = size / (W * e);
      p.in_bytes = p.count * e;
      p.out_bytes = W * p.in_bytes;
      if (in_place) p.send = dr + rank * p.in_bytes;
      break;
    case hcCollReduceScatter:
      p.count = size / (W * e);
      p.in_bytes = W * p.count * e;
      p.out_bytes = p.count * e;
      if (in_place) {
        p.send = dr;
        p.recv = dr + rank * p.out_bytes;
      }
      break;
    default:
      p.count = size / e;
      p.in_bytes = p.out_bytes = p.count * e;
      if (in_place) p.send = dr;
      break;
  }
  return p;
}

hcResult_t call(hcColl_t coll, const Pointers& p, hcDataType_t dt, cudaStream_t s) {
  switch (coll) {
    case hcCollAllGather: return hcAllGather(p.send, p.recv, p.count, dt, g_comm, s);
    case hcCollReduceScatter: return hcReduceScatter(p.send, p.recv, p.count, dt, hcSum, g_comm, s);
    default: return hcAllReduce(p.send, p.recv, p.count, dt, hcSum, g_comm, s);
  }
}

// in -> dst on s, complete when this returns (the collectives that follow are on s too).
cudaError_t upload(const void* dst, const std::vector<char>& in, cudaStream_t s) {
  cudaError_t e = cudaMemcpyAsync(const_cast<void*>(dst), in.data(), in.size(), cudaMemcpyHostToDevice, s);
  return e != cudaSuccess ? e : cudaStreamSynchronize(s);
}

// Copy rate of cudaMemcpyAsync device-to-device on this GPU, bytes copied per second.
int copyRate(size_t bytes, int iters, char* a, char* b, cudaStream_t s, double* gbps) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
  CK(cudaEventRecord(e0, s));
  for (int i = 0; i < iters; ++i) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  *gbps = static_cast<double>(bytes) * iters / (ms * 1e6);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return 0;
}

// Output elements that differ from the reference, checking about a million of them (the
// inputs are small integers: every sum is exact, so compare exactly).
long countWrong(hcColl_t coll, hcDataType_t dt, const Pointers& p, const char* out, int rank, int W) {
  const size_t n = p.out_bytes / hcTypeSize(dt);
  const size_t stride = std::max<size_t>(1, n >> 20) | 1;
  long bad = 0;
  for (size_t i = 0; i < n; i += stride) {
    double want = 0;
    if (coll == hcCollAllGather) {
      want = hctest::testValue(dt, hicoll::OpKind::Sum, static_cast<int>(i / p.count), i % p.count);
    } else {
      const size_t idx = coll == hcCollReduceScatter ? rank * p.count + i : i;
      for (int k = 0; k < W; ++k) want += hctest::testValue(dt, hicoll::OpKind::Sum, k, idx);
    }
    bad += hctest::getElem(dt, out, i) != want;
  }
  return bad;
}

int benchRank(const Opts& o, int rank, int W) {
  g_rank = rank;
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  const int dev = rank % ndev;
  CK(cudaSetDevice(dev));
  HK(hcCommInitFromEnv(&g_comm));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  char *ds = nullptr, *dr = nullptr;
  CK(cudaMalloc(&ds, o.maxb));
  CK(cudaMalloc(&dr, o.maxb));
  CK(cudaMemset(ds, 0, o.maxb));
  const size_t e = hcTypeSize(o.dt);
  const int L = W / o.nodes;

  // The ceiling, now: one process copying alone, then every rank's process at once.
  double alone = 0, together = 0;
  HK(hcBarrier(g_comm));
  if (rank == 0 && copyRate(o.maxb / 2, o.iters, ds, ds + o.maxb / 2, s, &alone)) return 1;
  HK(hcBarrier(g_comm));
  if (copyRate(o.maxb / 2, o.iters, ds, ds + o.maxb / 2, s, &together)) return 1;
  // Aggregate rate: every process copied the same bytes; the slowest bounds the run.
  const double slowest = 1.0 / maxAcross(1.0 / together);
  const double aggregate = slowest * L;  // ranks sharing a GPU share its copy engines
  if (rank == 0) {
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, dev));
    std::printf("# hicoll gpu_bench: %d rank(s) = %d node(s) x %d, device buffers, %d GPU(s) (%s), datatype %s\n", W,
                o.nodes, L, ndev, prop.name, hctest::dtypeLabel(o.dt).c_str());
    std::printf(
        "# D2D copy ceiling, measured now (cudaMemcpyAsync, %zu MiB): 1 process %.1f GB/s; %d processes at "
        "once %.1f GB/s aggregate\n",
        o.maxb / 2 >> 20, alone, L, aggregate);
  }

  for (hcColl_t coll : o.colls) {
    if (rank == 0) {
      std::printf("#\n# %s\n", hicoll::collName(coll));
      std::printf("#%12s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
                  "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
      std::printf("#%12s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
                  "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    double last_time = 0;
    size_t last_size = 0;
    for (size_t size = o.minb; size <= o.maxb; size *= o.factor) {
      double t_us[2] = {0, 0};
      long wrong[2] = {0, 0};
      Pointers p{};
      for (int ip = 0; ip < 2; ++ip) {
        p = place(coll, size, e, rank, W, ds, dr, ip == 1);
        if (p.count == 0) break;
        std::vector<char> in = hctest::testInput(coll, o.dt, hicoll::OpKind::Sum, p.count, rank, W);
        // Uploads go on s, in stream order with the collectives. A plain cudaMemcpy from pageable
        // memory runs on the legacy stream, which a non-blocking s does not wait for, and may
        // return before its DMA has landed: the next collective then raced with the upload. In
        // place that read what the timed calls had left there (gpu_bench's 35424 wrong elements
        // of the in-place 1 MiB ReduceScatter on 2 nodes: the tail of rank 1's block).
        CK(upload(p.send, in, s));
        for (int i = 0; i < o.warmup; ++i) HK(call(coll, p, o.dt, s));
        CK(cudaStreamSynchronize(s));
        HK(hcBarrier(g_comm));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < o.iters; ++i) HK(call(coll, p, o.dt, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        t_us[ip] = maxAcross(ms * 1000.0 / o.iters);
        // #wrong: one more call on fresh input, checked against the host reference.
        CK(upload(p.send, in, s));
        HK(call(coll, p, o.dt, s));
        std::vector<char> out(p.out_bytes);
        CK(cudaMemcpyAsync(out.data(), p.recv, out.size(), cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        wrong[ip] = static_cast<long>(maxAcross(static_cast<double>(countWrong(coll, o.dt, p, out.data(), rank, W))));
      }
      if (p.count == 0) continue;
      const double bus = coll == hcCollAllReduce ? 2.0 * (W - 1) / W : static_cast<double>(W - 1) / W;
      if (rank == 0) {
        std::printf(" %12zu %12zu %8s %6s %6d", size, p.count, hctest::dtypeLabel(o.dt).c_str(),
                    coll == hcCollAllGather ? "none" : "sum", -1);
        for (int ip = 0; ip < 2; ++ip) {
          const double alg = size / (t_us[ip] * 1e3);
          std::printf(" %9.1f %7.2f %7.2f %6ld", t_us[ip], alg, alg * bus, wrong[ip]);
        }
        std::printf("\n");
      }
      last_time = t_us[0];
      last_size = size;
    }
    if (rank == 0 && last_size && o.nodes == 1) {
      // Bytes the design copies on this node per call: AllGather stages each input into its
      // slot and every rank copies every slot out (W+1 blocks per rank); ReduceScatter pushes
      // each input into the owners' slots (W blocks per rank), then reduces with a kernel.
      const double blocks = coll == hcCollAllGather       ? (L + 1.0) / L
                            : coll == hcCollReduceScatter ? 1.0
                                                          : 1.0 + (L + 1.0) / L;
      const double copied = blocks * last_size * L;
      const double rate = copied / (last_time * 1e3);
      std::printf(
          "# %s at %zu B: %.0f MiB copied by the node's copy engines in %.1f us = %.1f GB/s, %.0f%% of the "
          "measured aggregate D2D rate%s\n",
          hicoll::collName(coll), last_size, copied / (1 << 20), last_time, rate, 100.0 * rate / aggregate,
          coll == hcCollAllGather ? "" : " (plus the reduction kernels' reads)");
    }
  }
  hcStats st = HC_STATS_INITIALIZER;
  HK(hcCommGetStats(g_comm, &st));
  if (rank == 0) {
    unsigned long long hier = 0, fb = 0;
    for (hcColl_t c : o.colls) {
      hier += st.coll[c].calls[hcPathHierarchical];
      fb += st.coll[c].calls[hcPathFallback];
    }
    std::printf("# paths: %llu hierarchical, %llu fallback calls%s%s\n", hier, fb, fb ? "; last reason: " : "",
                fb ? st.coll[o.colls[0]].last_fallback_reason : "");
  }
  CK(cudaFree(ds));
  CK(cudaFree(dr));
  CK(cudaStreamDestroy(s));
  HK(hcCommDestroy(g_comm));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "-np") o.np = std::atoi(v);
    else if (k == "-nodes") o.nodes = std::atoi(v);
    else if (k == "-b") o.minb = parseSize(v);
    else if (k == "-e") o.maxb = parseSize(v);
    else if (k == "-f") o.factor = std::atoi(v);
    else if (k == "-n") o.iters = std::atoi(v);
    else if (k == "-w") o.warmup = std::atoi(v);
    else if (k == "-d") {
      const std::string d = v;
      o.dt = d == "half" || d == "float16" ? hcFloat16
             : d == "bfloat16"             ? hcBfloat16
             : d == "double"               ? hcFloat64
                                           : hcFloat32;
    } else if (k == "-c") {
      o.colls.clear();
      const std::string c = v;
      if (c.find("ag") != std::string::npos) o.colls.push_back(hcCollAllGather);
      if (c.find("rs") != std::string::npos) o.colls.push_back(hcCollReduceScatter);
      if (c.find("ar") != std::string::npos) o.colls.push_back(hcCollAllReduce);
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (o.np < 1 || o.nodes < 1 || o.np % o.nodes || o.factor < 2 || o.minb == 0 || o.colls.empty()) {
    std::fprintf(stderr, "bad options: -np must be a multiple of -nodes, -f >= 2\n");
    return 2;
  }
  const int ndev = hcgpu::deviceCount();
  if (ndev <= 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  hcgpu::Job job;
  for (int r = 0; r < o.np; ++r) job.nodes.push_back("node" + std::to_string(r / (o.np / o.nodes)));
  // Scratch/sort knobs large enough that every size stays on the hierarchical path (the
  // engine sizes its own staging by the chunk, not by these).
  job.env = {{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "1073741824"},
             {"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", "4294967296"},
             {"HICOLL_TIMEOUT_MS", "60000"}};
  job.timeout_s = 300;
  return hcgpu::run(job, [&](int rank, int W) { return benchRank(o, rank, W); });
}
