// GPU tests of the device path through the public C API (ctest label "gpu"): several ranks as
// processes sharing the machine's GPU(s) through CUDA IPC, on simulated nodes, device-buffer
// AllGather / ReduceScatter / AllReduce / Broadcast for every datatype and op against the host
// reference, stream ordering, back-to-back collectives, and the NCCL fallback on a one-rank
// communicator. Exits 77 ("skipped: no CUDA device") where there is no GPU.
//
//   gpu_collectives [scenario...]     (default: all; --list prints them)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../device/values.h"
#include "base/numeric.h"
#include "gpu_kernels.h"
#include "gpu_launch.h"
#include "hicoll/hicoll.h"

namespace {

using hicoll::OpKind;

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

struct Case {
  hcColl_t coll;
  hcDataType_t dt;
  OpKind op = OpKind::Sum;
  size_t count = 1;
  bool in_place = false;
  int root = 0;
  std::string str() const {
    return std::string(hicoll::collName(coll)) + " " + hctest::dtypeLabel(dt) + " " + hicoll::opName(op) + " x" +
           std::to_string(count) + (in_place ? " in-place" : "") +
           (coll == hcCollBroadcast ? " root " + std::to_string(root) : "");
  }
};

const std::vector<hcDataType_t> kAllTypes = {hcInt8,   hcUint8,   hcInt32,   hcUint32,  hcInt64,
                                             hcUint64, hcFloat16, hcFloat32, hcFloat64, hcBfloat16};
const std::vector<hcDataType_t> kSomeTypes = {hcFloat32, hcFloat16, hcBfloat16, hcInt8, hcUint64};

// bitwise: hcBand / hcBor / hcBxor on the integer types too (not where the calls run on NCCL,
// which has no bitwise ops: bitwiseOnNccl).
std::vector<Case> matrix(int W, const std::vector<hcDataType_t>& types, const std::vector<size_t>& counts,
                         bool bitwise) {
  std::vector<Case> cs;
  for (hcDataType_t dt : types)
    for (size_t count : counts)
      for (bool ip : {false, true}) {
        cs.push_back({hcCollAllGather, dt, OpKind::Sum, count, ip});
        for (OpKind op : {OpKind::Sum, OpKind::Prod, OpKind::Max, OpKind::Min, OpKind::Avg, OpKind::PreMulSum})
          cs.push_back({hcCollReduceScatter, dt, op, count, ip});
        for (OpKind op : {OpKind::Sum, OpKind::Max, OpKind::Avg, OpKind::PreMulSum})
          cs.push_back({hcCollAllReduce, dt, op, count, ip});
        if (bitwise && hicoll::isInteger(dt))
          for (OpKind op : {OpKind::Band, OpKind::Bor, OpKind::Bxor}) {
            cs.push_back({hcCollReduceScatter, dt, op, count, ip});
            cs.push_back({hcCollAllReduce, dt, op, count, ip});
          }
        cs.push_back({hcCollBroadcast, dt, OpKind::Sum, count, ip, W - 1});
      }
  return cs;
}

size_t sendElems(const Case& c, int W) {
  return c.coll == hcCollReduceScatter ? W * c.count : c.count;
}
size_t recvElems(const Case& c, int W) {
  return c.coll == hcCollAllGather ? W * c.count : c.count;
}

// Device pointers of a case inside the preallocated buffers (in place: inside recv/send as
// the API's rules say).
void placeBuffers(const Case& c, int rank, char* dsend, char* drecv, const void** sp, void** rp) {
  const size_t e = hcTypeSize(c.dt);
  *sp = dsend;
  *rp = drecv;
  if (!c.in_place) return;
  switch (c.coll) {
    case hcCollAllGather: *sp = drecv + rank * c.count * e; break;
    case hcCollReduceScatter:
      *sp = drecv;
      *rp = drecv + rank * c.count * e;
      break;
    default: *sp = drecv; break;
  }
}

// Enqueues c on s (ops are created and returned in *premul for the caller to destroy).
hcResult_t enqueue(const Case& c, const void* sp, void* rp, hcComm_t comm, cudaStream_t s, hcRedOp_t* premul) {
  hcRedOp_t op = hcSum;
  switch (c.op) {
    case OpKind::Prod: op = hcProd; break;
    case OpKind::Max: op = hcMax; break;
    case OpKind::Min: op = hcMin; break;
    case OpKind::Avg: op = hcAvg; break;
    case OpKind::Band: op = hcBand; break;
    case OpKind::Bor: op = hcBor; break;
    case OpKind::Bxor: op = hcBxor; break;
    case OpKind::PreMulSum: {
      alignas(8) unsigned char scalar[8];
      hicoll::num::encodeScalar(hctest::testScalar(c.dt), c.dt, scalar);
      hcResult_t r = hcRedOpCreatePreMulSum(&op, scalar, c.dt, comm);
      if (r != hcSuccess) return r;
      *premul = op;
      break;
    }
    default: break;
  }
  switch (c.coll) {
    case hcCollAllGather: return hcAllGather(sp, rp, c.count, c.dt, comm, s);
    case hcCollReduceScatter: return hcReduceScatter(sp, rp, c.count, c.dt, op, comm, s);
    case hcCollAllReduce: return hcAllReduce(sp, rp, c.count, c.dt, op, comm, s);
    default: return hcBroadcast(sp, rp, c.count, c.dt, c.root, comm, s);
  }
}

struct Stage {  // one case in flight: device pointers and pinned host input/output
  Case c;
  const void* sp = nullptr;
  void* rp = nullptr;
  void* hin = nullptr;
  void* hout = nullptr;
  size_t out_bytes = 0;
  hcRedOp_t premul = hcMaxRedOp;
};

// Enqueues on s: clear the output, upload the input of c, run c, download the result. Nothing
// here waits for the stream (pinned host memory), so stages can be issued back to back.
int issue(Stage& st, int rank, int W, char* dsend, char* drecv, cudaStream_t s) {
  const Case& c = st.c;
  const size_t e = hcTypeSize(c.dt);
  placeBuffers(c, rank, dsend, drecv, &st.sp, &st.rp);
  std::vector<char> in = hctest::testInput(c.coll, c.dt, c.op, c.count, rank, W);
  st.out_bytes = recvElems(c, W) * e;
  CK(cudaMallocHost(&st.hin, in.size()));
  CK(cudaMallocHost(&st.hout, st.out_bytes));
  std::memcpy(st.hin, in.data(), in.size());
  CK(cudaMemsetAsync(drecv, 0xab, recvElems(c, W) * e * (c.coll == hcCollReduceScatter && c.in_place ? W : 1), s));
  CK(cudaMemcpyAsync(const_cast<void*>(st.sp), st.hin, in.size(), cudaMemcpyHostToDevice, s));
  HK(enqueue(c, st.sp, st.rp, g_comm, s, &st.premul));
  CK(cudaMemcpyAsync(st.hout, st.rp, st.out_bytes, cudaMemcpyDeviceToHost, s));
  return 0;
}

// After the stream has run the stage: compare with the reference, free.
int check(Stage& st, int rank, int W) {
  if (st.premul != hcMaxRedOp) HK(hcRedOpDestroy(st.premul, g_comm));
  const Case& c = st.c;
  std::string err =
      hctest::compareOutput(c.dt, st.hout, hctest::expectedOutput(c.coll, c.dt, c.op, c.count, c.root, rank, W));
  CK(cudaFreeHost(st.hin));
  CK(cudaFreeHost(st.hout));
  if (!err.empty()) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", rank, c.str().c_str(), err.c_str());
    return 1;
  }
  return 0;
}

struct Scenario {
  std::string name;
  std::vector<std::string> nodes;
  std::map<std::string, std::string> env;
  std::vector<hcDataType_t> types;
  std::vector<size_t> counts;
  hcPath_t expect = hcPathHierarchical;  // every collective in expect_colls takes this path
  std::string reason;                    // ... with this in its fallback reason
  bool ordering = false;                 // stream-order and back-to-back checks too
  std::vector<hcColl_t> expect_colls = {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce, hcCollBroadcast};
  bool repeat = false;  // gpu_bench's repeated calls on the same buffers too
  bool quant = false;   // hcAllGatherQuantized too (quantizes from 2 nodes on)
};

int checkStats(const Scenario& sc, int rank) {
  hcStats st = HC_STATS_INITIALIZER;
  HK(hcCommGetStats(g_comm, &st));
  for (hcColl_t c : sc.expect_colls) {
    const hcCollStats& cs = st.coll[c];
    const uint64_t total = cs.calls[0] + cs.calls[1] + cs.calls[2];
    if (total == 0 || cs.calls[sc.expect] != total) {
      std::fprintf(stderr, "[rank %d] %s: calls hier %llu ring %llu fallback %llu; expected all on path %d\n", rank,
                   hicoll::collName(c), (unsigned long long)cs.calls[0], (unsigned long long)cs.calls[1],
                   (unsigned long long)cs.calls[2], sc.expect);
      return 1;
    }
    if (!sc.reason.empty() && std::strstr(cs.last_fallback_reason, sc.reason.c_str()) == nullptr) {
      std::fprintf(stderr, "[rank %d] %s: fallback reason '%s' lacks '%s'\n", rank, hicoll::collName(c),
                   cs.last_fallback_reason, sc.reason.c_str());
      return 1;
    }
  }
  if (rank == 0) {
    const hcCollStats& ag = st.coll[hcCollAllGather];
    std::printf("  stats: AllGather calls hier %llu fallback %llu, bytes intra %llu inter %llu%s%s\n",
                (unsigned long long)ag.calls[0], (unsigned long long)ag.calls[2], (unsigned long long)ag.bytes_intra,
                (unsigned long long)ag.bytes_inter,
                sc.reason.empty() ? "" : "; reason: ", sc.reason.empty() ? "" : ag.last_fallback_reason);
  }
  return 0;
}

// The collective must wait for earlier work on the stream and later work must wait for it.
int orderingChecks(int rank, int W, char* dsend, char* drecv, cudaStream_t s) {
  const Case c{hcCollAllGather, hcFloat32, OpKind::Sum, 1 << 18};
  const size_t e = 4;
  std::vector<char> in = hctest::testInput(c.coll, c.dt, c.op, c.count, rank, W);
  void* host = nullptr;
  CK(cudaMallocHost(&host, in.size()));
  std::memcpy(host, in.data(), in.size());
  CK(cudaMemsetAsync(dsend, 0, c.count * e, s));
  CK(cudaMemsetAsync(drecv, 0xab, W * c.count * e, s));
  CK(hcgpu::launchSpin(s, 200));  // the input arrives only after 200 ms of "compute"
  CK(cudaMemcpyAsync(dsend, host, in.size(), cudaMemcpyHostToDevice, s));
  const auto t0 = std::chrono::steady_clock::now();
  HK(hcAllGather(dsend, drecv, c.count, c.dt, g_comm, s));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<char> out(W * c.count * e);
  CK(cudaMemcpyAsync(out.data(), drecv, out.size(), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaFreeHost(host));
  std::string err =
      hctest::compareOutput(c.dt, out.data(), hctest::expectedOutput(c.coll, c.dt, c.op, c.count, 0, rank, W));
  if (!err.empty()) {
    std::fprintf(stderr, "[rank %d] stream order: AllGather did not wait for the stream's earlier work: %s\n", rank,
                 err.c_str());
    return 1;
  }
  if (ms > 150) {
    std::fprintf(stderr, "[rank %d] stream order: hcAllGather blocked the host for %.0f ms (the stream was busy)\n",
                 rank, ms);
    return 1;
  }
  // Back to back: several collectives enqueued before one synchronisation, each with its own
  // buffers.
  const std::vector<Case> seq = {
      {hcCollAllGather, hcFloat32, OpKind::Sum, 100000},   {hcCollReduceScatter, hcFloat16, OpKind::Sum, 77777},
      {hcCollAllReduce, hcInt32, OpKind::Max, 40001},      {hcCollBroadcast, hcUint8, OpKind::Sum, 3000, false, W - 1},
      {hcCollAllGather, hcBfloat16, OpKind::Sum, 3, true}, {hcCollReduceScatter, hcFloat64, OpKind::Avg, 1290, true},
      {hcCollAllReduce, hcFloat32, OpKind::PreMulSum, 5},  {hcCollAllReduce, hcBfloat16, OpKind::Sum, 1 << 20},
  };
  std::vector<Stage> st(seq.size());
  std::vector<char*> bufs;
  for (size_t i = 0; i < seq.size(); ++i) {
    st[i].c = seq[i];
    const size_t e2 = hcTypeSize(seq[i].dt);
    char *ds = nullptr, *dr = nullptr;
    CK(cudaMalloc(&ds, sendElems(seq[i], W) * e2));
    CK(cudaMalloc(&dr, std::max(sendElems(seq[i], W), recvElems(seq[i], W)) * e2));
    bufs.push_back(ds);
    bufs.push_back(dr);
    if (issue(st[i], rank, W, ds, dr, s)) return 1;
  }
  CK(cudaStreamSynchronize(s));
  int bad = 0;
  for (Stage& x : st) bad += check(x, rank, W);
  for (char* b : bufs) CK(cudaFree(b));
  if (rank == 0 && !bad) std::printf("  stream order and %zu back-to-back collectives: ok\n", seq.size());
  return bad ? 1 : 0;
}

// gpu_bench's pattern, all in stream order: per size, several calls back to back on the same
// buffers (in place, each call's input is what the previous one left), then fresh input and
// one more call, checked. gpu_bench reported 35424 wrong elements for the in-place 1 MiB
// ReduceScatter on 2 nodes x 1 (one 512 KiB chunk per collective) when its upload was a
// cudaMemcpy on the legacy stream, unordered with the collectives on its non-blocking stream.
int repeatChecks(int rank, int W, cudaStream_t s) {
  constexpr int kCalls = 7;  // device_check.sh's 2-node bench: 2 warm-up + 5 timed
  int bad = 0;
  for (hcColl_t coll : {hcCollReduceScatter, hcCollAllGather})
    for (size_t total : {size_t{1} << 20, size_t{4} << 20})
      for (bool ip : {false, true}) {
        const Case c{coll, hcFloat32, OpKind::Sum, total / (static_cast<size_t>(W) * 4), ip};
        const size_t e = 4, out_bytes = recvElems(c, W) * e;
        std::vector<char> in = hctest::testInput(c.coll, c.dt, c.op, c.count, rank, W);
        char *ds = nullptr, *dr = nullptr;
        void *hin = nullptr, *hout = nullptr;
        CK(cudaMalloc(&ds, sendElems(c, W) * e));
        CK(cudaMalloc(&dr, std::max(sendElems(c, W), recvElems(c, W)) * e));
        CK(cudaMallocHost(&hin, in.size()));
        CK(cudaMallocHost(&hout, out_bytes));
        std::memcpy(hin, in.data(), in.size());
        const void* sp = nullptr;
        void* rp = nullptr;
        placeBuffers(c, rank, ds, dr, &sp, &rp);
        hcRedOp_t premul = hcMaxRedOp;
        CK(cudaMemcpyAsync(const_cast<void*>(sp), hin, in.size(), cudaMemcpyHostToDevice, s));
        for (int i = 0; i < kCalls; ++i) HK(enqueue(c, sp, rp, g_comm, s, &premul));
        CK(cudaMemcpyAsync(const_cast<void*>(sp), hin, in.size(), cudaMemcpyHostToDevice, s));
        HK(enqueue(c, sp, rp, g_comm, s, &premul));
        CK(cudaMemcpyAsync(hout, rp, out_bytes, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        std::string err =
            hctest::compareOutput(c.dt, hout, hctest::expectedOutput(c.coll, c.dt, c.op, c.count, 0, rank, W));
        if (!err.empty()) {
          std::fprintf(stderr, "[rank %d] %s, %d calls back to back then fresh input: %s\n", rank, c.str().c_str(),
                       kCalls, err.c_str());
          ++bad;
        }
        CK(cudaFree(ds));
        CK(cudaFree(dr));
        CK(cudaFreeHost(hin));
        CK(cudaFreeHost(hout));
      }
  if (rank == 0 && !bad) std::printf("  repeated calls on the same buffers (gpu_bench's pattern): ok\n");
  return bad ? 1 : 0;
}

// 0 when the statistics counted `want` quantized calls of coll since `before`, else 1 (said).
int checkQuantizedCount(const hcStats& before, hcColl_t coll, uint64_t want, const char* fn, int rank) {
  hcStats after = HC_STATS_INITIALIZER;
  HK(hcCommGetStats(g_comm, &after));
  const uint64_t counted = after.quantized_calls[coll] - before.quantized_calls[coll];
  if (counted == want) return 0;
  std::fprintf(stderr, "[rank %d] %s: %llu calls counted as quantized, want %llu\n", rank, fn,
               (unsigned long long)counted, (unsigned long long)want);
  return 1;
}

// hcAllGatherQuantized on device buffers: from 2 nodes on every rank must hold the host
// quantizer's bits for every rank's block (the kernels match it exactly), on one node the exact
// gather; the send buffer is not modified, and the statistics count the quantized calls.
int quantChecks(const Scenario& sc, int rank, int W, cudaStream_t s) {
  const std::set<std::string> nodes(sc.nodes.begin(), sc.nodes.end());
  const bool quantizes = nodes.size() >= 2 && !sc.env.count("HICOLL_FORCE_FALLBACK");
  hcStats before = HC_STATS_INITIALIZER;
  HK(hcCommGetStats(g_comm, &before));
  int bad = 0, calls = 0;
  for (hcDataType_t dt : {hcFloat32, hcBfloat16, hcFloat16})
    for (size_t count : {size_t{1}, size_t{1000}, size_t{300001}})
      for (size_t block : {size_t{256}, size_t{2048}})
        for (bool ip : {false, true}) {
          const size_t e = hcTypeSize(dt), b = count * e;
          const std::vector<char> in = hctest::quantInput(dt, count, block, rank);
          std::vector<char> want(static_cast<size_t>(W) * b), got(want.size()), back(b);
          if (quantizes) {
            want = hctest::quantExpected(dt, count, block, W);
          } else {
            for (int j = 0; j < W; ++j) {
              const auto inj = hctest::quantInput(dt, count, block, j);
              std::memcpy(want.data() + static_cast<size_t>(j) * b, inj.data(), b);
            }
          }
          char *ds = nullptr, *dr = nullptr;
          CK(cudaMalloc(&ds, b));
          CK(cudaMalloc(&dr, W * b));
          char* sp = ip ? dr + static_cast<size_t>(rank) * b : ds;
          CK(cudaMemcpyAsync(sp, in.data(), b, cudaMemcpyHostToDevice, s));
          hcQuant q = HC_QUANT_INITIALIZER;
          q.block = block;
          HK(hcAllGatherQuantized(sp, dr, count, dt, &q, g_comm, s));
          ++calls;
          CK(cudaMemcpyAsync(got.data(), dr, W * b, cudaMemcpyDeviceToHost, s));
          CK(cudaMemcpyAsync(back.data(), ds, b, cudaMemcpyDeviceToHost, s));
          CK(cudaStreamSynchronize(s));
          const char* what = quantizes ? "the host quantizer's bits" : "the exact gather";
          if (got != want) {
            size_t i = 0;
            while (got[i] == want[i]) ++i;
            std::fprintf(stderr, "[rank %d] hcAllGatherQuantized %zu x %s block %zu%s: byte %zu differs from %s\n",
                         rank, count, hicoll::dtypeName(dt), block, ip ? " in place" : "", i, what);
            ++bad;
          } else if (!ip && back != in) {
            std::fprintf(stderr, "[rank %d] hcAllGatherQuantized %zu x %s: the send buffer was modified\n", rank, count,
                         hicoll::dtypeName(dt));
            ++bad;
          }
          CK(cudaFree(ds));
          CK(cudaFree(dr));
          if (bad >= 3) return 1;
        }
  bad += checkQuantizedCount(before, hcCollAllGather, quantizes ? static_cast<uint64_t>(calls) : 0,
                             "hcAllGatherQuantized", rank);
  if (rank == 0 && !bad)
    std::printf("  hcAllGatherQuantized (fp32/bf16/fp16, blocks 256/2048, in place too): %s\n",
                quantizes ? "bit-identical to the host quantizer" : "exact on one node");
  return bad ? 1 : 0;
}

// hcReduceScatterQuantized on device buffers: from 2 nodes on each element is within the
// format's bound of the exact sum (the other nodes' partials, each off by at most its absmax /
// 254, plus the roundings of the node partials and of the output), on one node exact; the send
// buffer is not modified, and the calls whose images are smaller than their chunks count as
// quantized. (The host-stream tests check the schedule bit for bit.)
int quantRsChecks(const Scenario& sc, int rank, int W, cudaStream_t s) {
  std::map<std::string, std::vector<int>> by_node;
  for (int r = 0; r < W; ++r) by_node[sc.nodes[r]].push_back(r);
  const bool quantizes = by_node.size() >= 2 && !sc.env.count("HICOLL_FORCE_FALLBACK");
  hcStats before = HC_STATS_INITIALIZER;
  HK(hcCommGetStats(g_comm, &before));
  int bad = 0;
  uint64_t quantized_calls = 0;
  for (hcDataType_t dt : {hcFloat32, hcBfloat16, hcFloat16})
    for (size_t count : {size_t{1}, size_t{1000}, size_t{300001}})
      for (hcRedOp_t op : {hcSum, hcAvg}) {
        const size_t e = hcTypeSize(dt), b = count * e;
        // Even "ranks" of quantInput: finite values, a scale that changes per block.
        std::vector<std::vector<char>> in;
        for (int j = 0; j < W; ++j) in.push_back(hctest::quantInput(dt, W * count, 256, 2 * j));
        char *ds = nullptr, *dr = nullptr;
        CK(cudaMalloc(&ds, W * b));
        CK(cudaMalloc(&dr, b));
        CK(cudaMemcpyAsync(ds, in[rank].data(), W * b, cudaMemcpyHostToDevice, s));
        hcQuant q = HC_QUANT_INITIALIZER;
        HK(hcReduceScatterQuantized(ds, dr, count, dt, op, &q, g_comm, s));
        if (quantizes && count > 1) ++quantized_calls;
        std::vector<char> got(b), back(W * b);
        CK(cudaMemcpyAsync(got.data(), dr, b, cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(back.data(), ds, W * b, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        const double eps = dt == hcFloat32 ? 0x1p-23 : dt == hcBfloat16 ? 0x1p-7 : 0x1p-10;
        // Each node's exact partial of this rank's block, and its absmax (no smaller than any
        // quantization block's).
        std::vector<std::vector<double>> partial;
        double bound = 0, mag = 0;
        for (const auto& [node, ranks] : by_node) {
          std::vector<double> p(count, 0.0);
          double amax = 0;
          for (size_t i = 0; i < count; ++i) {
            for (int r : ranks) p[i] += hctest::getElem(dt, in[r].data(), rank * count + i);
            amax = std::max(amax, std::fabs(p[i]));
          }
          partial.push_back(std::move(p));
          mag += amax;
          if (quantizes && node != sc.nodes[rank]) bound += amax / 254;
        }
        const double div = op == hcAvg ? W : 1;
        const double tol = (bound + 4 * eps * mag) / div * 1.001 + 1e-30;
        size_t worst = count;
        for (size_t i = 0; i < count && worst == count; ++i) {
          double exact = 0;
          for (const auto& p : partial) exact += p[i];
          const double v = hctest::getElem(dt, got.data(), i);
          if (!(std::fabs(v - exact / div) <= tol)) worst = i;
        }
        if (worst < count) {
          std::fprintf(stderr,
                       "[rank %d] hcReduceScatterQuantized %zu x %s %s: element %zu is %g, beyond the "
                       "bound %g of the exact sum\n",
                       rank, count, hicoll::dtypeName(dt), op == hcAvg ? "avg" : "sum", worst,
                       hctest::getElem(dt, got.data(), worst), tol);
          ++bad;
        } else if (back != in[rank]) {
          std::fprintf(stderr, "[rank %d] hcReduceScatterQuantized %zu x %s: the send buffer was modified\n", rank,
                       count, hicoll::dtypeName(dt));
          ++bad;
        }
        CK(cudaFree(ds));
        CK(cudaFree(dr));
        if (bad >= 3) return 1;
      }
  bad += checkQuantizedCount(before, hcCollReduceScatter, quantized_calls, "hcReduceScatterQuantized", rank);
  if (rank == 0 && !bad)
    std::printf("  hcReduceScatterQuantized (fp32/bf16/fp16, sum/avg): %s\n",
                quantizes ? "within the format's bound of the exact sum" : "exact on one node");
  return bad ? 1 : 0;
}

// Where the calls run on NCCL: a bitwise op fails hcUnsupported naming it, and the communicator
// goes on.
int bitwiseOnNccl(int rank, char* dsend, char* drecv, cudaStream_t s) {
  for (auto [op, name] : {std::pair{hcBand, "band"}, std::pair{hcBor, "bor"}, std::pair{hcBxor, "bxor"}}) {
    const hcResult_t r = hcAllReduce(dsend, drecv, 5, hcInt32, op, g_comm, s);
    if (r != hcUnsupported || std::strstr(hcGetLastError(g_comm), name) == nullptr) {
      std::fprintf(stderr, "[rank %d] AllReduce %s on NCCL returned %s (want unsupported naming it): %s\n", rank, name,
                   hcGetErrorString(r), hcGetLastError(g_comm));
      return 1;
    }
  }
  return 0;
}

// Point-to-point on device buffers (ncclSend / ncclRecv through the fallback): a ring exchange
// in one group (with itself on one rank), every value checked, then the statistics.
int p2pOnNccl(int rank, int W, char* dsend, char* drecv, cudaStream_t s) {
  const size_t n = 1000;
  std::vector<int32_t> mine(n), got(n, -1);
  for (size_t i = 0; i < n; ++i) mine[i] = static_cast<int32_t>(rank * 100000 + static_cast<int>(i));
  CK(cudaMemcpy(dsend, mine.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
  CK(cudaMemset(drecv, 0xff, n * sizeof(int32_t)));
  hcStats before = HC_STATS_INITIALIZER;
  HK(hcCommGetStats(g_comm, &before));
  const int to = (rank + 1) % W, from = (rank + W - 1) % W;
  HK(hcGroupStart());
  HK(hcSend(dsend, n, hcInt32, to, g_comm, s));
  HK(hcRecv(drecv, n, hcInt32, from, g_comm, s));
  HK(hcGroupEnd());
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(got.data(), drecv, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != from * 100000 + static_cast<int>(i)) {
      std::fprintf(stderr, "[rank %d] device hcRecv from rank %d: element %zu is %d, want %d\n", rank, from, i, got[i],
                   from * 100000 + static_cast<int>(i));
      return 1;
    }
  }
  hcStats after = HC_STATS_INITIALIZER;
  HK(hcCommGetStats(g_comm, &after));
  if (after.p2p_sends != before.p2p_sends + 1 || after.p2p_recvs != before.p2p_recvs + 1) {
    std::fprintf(stderr, "[rank %d] device hcSend / hcRecv counted %llu sends, %llu receives (want 1 each)\n", rank,
                 static_cast<unsigned long long>(after.p2p_sends - before.p2p_sends),
                 static_cast<unsigned long long>(after.p2p_recvs - before.p2p_recvs));
    return 1;
  }
  if (rank == 0) std::printf("  hcSend / hcRecv on device buffers (NCCL, one group): the ring exchange matches\n");
  return 0;
}

int rankMain(const Scenario& sc, int rank, int W) {
  g_rank = rank;
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  CK(cudaSetDevice(rank % ndev));
  HK(hcCommInitFromEnv(&g_comm));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  size_t max_elems = 0;
  for (size_t n : sc.counts) max_elems = std::max(max_elems, n * W);
  max_elems = std::max<size_t>(max_elems, (1 << 18) * W);
  char *dsend = nullptr, *drecv = nullptr;
  CK(cudaMalloc(&dsend, max_elems * 8));
  CK(cudaMalloc(&drecv, max_elems * 8));
  int bad = 0;
  const bool on_nccl = sc.expect == hcPathFallback && sc.reason == "HICOLL_FORCE_FALLBACK";
  const auto cases = matrix(W, sc.types, sc.counts, !on_nccl);
  const auto t0 = std::chrono::steady_clock::now();
  for (const Case& c : cases) {
    Stage st;
    st.c = c;
    if (issue(st, rank, W, dsend, drecv, s)) return 1;
    CK(cudaStreamSynchronize(s));
    if (check(st, rank, W) && ++bad >= 5) break;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rank == 0)
    std::printf("  %zu collectives (%zu datatypes, counts up to %zu) in %.1f s, %s\n", cases.size(), sc.types.size(),
                sc.counts.back(), secs, bad ? "FAILURES" : "all match the reference");
  if (!bad && on_nccl) bad += bitwiseOnNccl(rank, dsend, drecv, s);
  if (!bad && on_nccl) bad += p2pOnNccl(rank, W, dsend, drecv, s);
  if (!bad && sc.ordering) bad += orderingChecks(rank, W, dsend, drecv, s);
  if (!bad && sc.repeat) bad += repeatChecks(rank, W, s);
  if (!bad && sc.quant) bad += quantChecks(sc, rank, W, s);
  if (!bad && sc.quant) bad += quantRsChecks(sc, rank, W, s);
  if (!bad) bad += checkStats(sc, rank);
  CK(cudaFree(dsend));
  CK(cudaFree(drecv));
  CK(cudaStreamDestroy(s));
  HK(hcCommDestroy(g_comm));
  return bad ? 1 : 0;
}

std::vector<Scenario> scenarios() {
  const std::map<std::string, std::string> base = {{"HICOLL_DEBUG", "INFO"}, {"HICOLL_TIMEOUT_MS", "30000"}};
  auto env = [&](std::map<std::string, std::string> extra) {
    extra.insert(base.begin(), base.end());
    return extra;
  };
  std::vector<Scenario> v;
  // First and small: does a multi-process device collective work at all on this machine?
  v.push_back({"smoke_one_node_x2",
               {"n0", "n0"},
               env({}),
               {hcFloat32},
               {1000},
               hcPathHierarchical,
               "",
               false,
               {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce, hcCollBroadcast},
               false,
               true});
  v.push_back({"one_node_x4", {"n0", "n0", "n0", "n0"}, env({}), kAllTypes, {1, 1000, 300001}});
  v.push_back({"nodes_2x2",
               {"n0", "n0", "n1", "n1"},
               env({{"HICOLL_CHUNK_SIZE", "65536"}}),
               kAllTypes,
               {1, 777, 300001},
               hcPathHierarchical,
               "",
               true,
               {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce, hcCollBroadcast},
               false,
               true});
  v.push_back({"nodes_2x2_interleaved", {"n0", "n1", "n0", "n1"}, env({}), kSomeTypes, {5, 300001}});
  // gpu_bench's 2-node layout and sizes: one ReduceScatter chunk per 1 MiB collective.
  v.push_back({"nodes_2x1",
               {"a", "b"},
               env({}),
               {hcFloat32, hcBfloat16},
               {5, 131072},
               hcPathHierarchical,
               "",
               false,
               {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce, hcCollBroadcast},
               true,
               true});
  v.push_back({"nodes_3x1", {"a", "b", "c"}, env({{"HICOLL_CHUNK_SIZE", "131072"}}), kSomeTypes, {3, 200003}});
  v.push_back({"one_rank_hier", {"n0"}, env({}), kAllTypes, {1, 4099}});
  // 4097 (float32) and 16386 (float64): counts whose last elements NCCL 2.19.1-2.29.2's one-rank
  // pre-multiplied sum kernel skips (avg and premulsum; the fallback issues them again).
  v.push_back({"one_rank_nccl_fallback",
               {"n0"},
               env({{"HICOLL_FORCE_FALLBACK", "all"}}),
               kAllTypes,
               {1, 1000, 4097, 16386, 300001},
               hcPathFallback,
               "HICOLL_FORCE_FALLBACK"});
  // The scratch rule (choosePath) covers AllGather and AllReduce; ReduceScatter and Broadcast
  // stay hierarchical (they are still checked against the reference).
  v.push_back({"one_rank_scratch_fallback",
               {"n0"},
               env({{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", "8192"}}),
               {hcFloat32, hcBfloat16},
               {4097, 300001},
               hcPathFallback,
               "SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES",
               false,
               {hcCollAllGather, hcCollAllReduce}});
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> want(argv + 1, argv + argc);
  const auto all = scenarios();
  if (!want.empty() && want[0] == "--list") {
    for (const Scenario& sc : all) std::printf("%s\n", sc.name.c_str());
    return 0;
  }
  const int ndev = hcgpu::deviceCount();
  if (ndev <= 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  int failed = 0, ran = 0;
  for (const Scenario& sc : all) {
    if (!want.empty() && std::find(want.begin(), want.end(), sc.name) == want.end()) continue;
    ++ran;
    std::printf("[ RUN  ] %s: %zu rank(s) on %d GPU(s)\n", sc.name.c_str(), sc.nodes.size(), ndev);
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    hcgpu::Job job;
    job.nodes = sc.nodes;
    job.env = sc.env;
    job.timeout_s = 90;  // under device_check.sh's 100 s per scenario (HICOLL_TIMEOUT_MS fires first)
    const int rc = hcgpu::run(job, [&](int rank, int W) { return rankMain(sc, rank, W); });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ %s ] %s (%.1f s)\n", rc ? "FAIL" : " OK ", sc.name.c_str(), secs);
    std::fflush(stdout);
    failed += rc != 0;
  }
  if (ran == 0) {
    std::fprintf(stderr, "no scenario matched; --list shows them\n");
    return 2;
  }
  std::printf("%d of %d scenario(s) failed\n", failed, ran);
  return failed ? 1 : 0;
}
