// A stand-in for libnccl.so.2: every NCCL function the fallback resolves, recording its
// arguments. Built twice: complete, and without ncclAllReduce (a library missing a symbol).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "fallback/nccl/nccl_abi.h"
#include "nccl_standin.h"

using namespace hicoll::nccl;

namespace {

struct FakeComm {
  int nranks, rank;
  char id[kUniqueIdBytes];
};

std::mutex g_mu;
std::vector<StandinCall> g_calls;
std::string g_fail_fn;
int g_fail_code = 0;
int g_ids = 0;
int g_ops = 0;

StandinCall& record(const char* fn) {
  g_calls.emplace_back();
  StandinCall& c = g_calls.back();
  std::memset(&c, 0, sizeof c);
  std::snprintf(c.fn, sizeof c.fn, "%s", fn);
  c.op = -1;
  c.root = -1;
  c.dtype = -1;
  return c;
}

Result injected(const char* fn) {
  return g_fail_fn == fn ? static_cast<Result>(g_fail_code) : Success;
}

// With HCSTANDIN_EXECUTE=1, reductions on a one-rank communicator move the data (host memory)
// the way NCCL does: a copy, or for a pre-multiplied sum (and avg of floating-point types, a
// pre-multiplied sum by 1/nranks inside NCCL) the oneRankReduce kernel, including the tail
// that NCCL 2.19.1-2.29.2 leave unwritten (HCSTANDIN_VERSION picks the version). float32 and
// float64 only.
struct PremulOp {
  int dtype;
  double scalar;
};
std::vector<PremulOp> g_premul;  // by op - NumOps

int versionCode() {
  const char* v = std::getenv("HCSTANDIN_VERSION");
  return v ? std::atoi(v) : 22809;
}

bool executing() {
  const char* e = std::getenv("HCSTANDIN_EXECUTE");
  return e && std::atoi(e) != 0;
}

template <class T>
void scaleBlocks(const void* send, void* recv, size_t n, double scalar) {
  const size_t bytes = n * sizeof(T);
  const size_t bn = std::min<size_t>(32, (bytes + (16 << 10) - 1) / (16 << 10));
  const size_t pack = 16 / sizeof(T);
  const int v = versionCode();
  const size_t per = v >= 21901 && v < 22907 ? n / bn : (n + bn - 1) / bn;  // the bug: floor
  const size_t a = (per + pack - 1) / pack * pack;
  for (size_t b = 0; b < bn; ++b) {
    const size_t i0 = std::min(n, b * a), i1 = std::min(n, (b + 1) * a);
    for (size_t i = i0; i < i1; ++i)
      static_cast<T*>(recv)[i] = static_cast<T>(static_cast<const T*>(send)[i] * static_cast<T>(scalar));
  }
}

Result executeOneRank(const void* send, void* recv, size_t n, DataType dt, RedOp op, CommHandle comm) {
  if (!executing() || reinterpret_cast<FakeComm*>(comm)->nranks != 1) return Success;
  const size_t esize = dt == Float32 ? 4 : dt == Float64 ? 8 : 0;
  if (!esize) return InvalidArgument;
  bool kernel = false;
  double scalar = 1.0;
  if (op >= NumOps) {
    const size_t k = static_cast<size_t>(op - NumOps);
    if (k >= g_premul.size() || g_premul[k].dtype != dt) return InvalidArgument;
    kernel = true;
    scalar = g_premul[k].scalar;
  } else if (op == Avg) {
    kernel = true;  // floating point: a pre-multiplied sum by 1/nranks = 1
  }
  if (!kernel) {
    if (send != recv) std::memmove(recv, send, n * esize);
    return Success;
  }
  if (dt == Float32) scaleBlocks<float>(send, recv, n, scalar);
  else scaleBlocks<double>(send, recv, n, scalar);
  return Success;
}

}  // namespace

#define STANDIN_API extern "C" __attribute__((visibility("default")))

STANDIN_API int hcstandin_count() {
  std::lock_guard<std::mutex> lk(g_mu);
  return static_cast<int>(g_calls.size());
}
STANDIN_API const StandinCall* hcstandin_call(int i) {
  std::lock_guard<std::mutex> lk(g_mu);
  return i >= 0 && i < static_cast<int>(g_calls.size()) ? &g_calls[i] : nullptr;
}
STANDIN_API void hcstandin_reset() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_calls.clear();
  g_fail_fn.clear();
  g_fail_code = 0;
}
STANDIN_API void hcstandin_fail(const char* fn, int code) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_fail_fn = code ? fn : "";
  g_fail_code = code;
}

STANDIN_API Result ncclGetVersion(int* version) {
  std::lock_guard<std::mutex> lk(g_mu);
  record("ncclGetVersion");
  *version = versionCode();
  return injected("ncclGetVersion");
}

STANDIN_API Result ncclGetUniqueId(UniqueId* id) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclGetUniqueId");
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "standin-id-%d", ++g_ids);
  std::memcpy(c.id, id->internal, sizeof c.id);
  return injected("ncclGetUniqueId");
}

STANDIN_API Result ncclCommInitRank(CommHandle* comm, int nranks, UniqueId id, int rank) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclCommInitRank");
  c.nranks = nranks;
  c.rank = rank;
  std::memcpy(c.id, id.internal, sizeof c.id);
  Result r = injected("ncclCommInitRank");
  if (r != Success) return r;
  auto* fc = new FakeComm{nranks, rank, {}};
  std::memcpy(fc->id, id.internal, sizeof fc->id);
  *comm = reinterpret_cast<CommHandle>(fc);
  c.comm = *comm;
  return Success;
}

STANDIN_API Result ncclCommDestroy(CommHandle comm) {
  std::lock_guard<std::mutex> lk(g_mu);
  record("ncclCommDestroy").comm = comm;
  delete reinterpret_cast<FakeComm*>(comm);
  return Success;
}

STANDIN_API Result ncclCommAbort(CommHandle comm) {
  std::lock_guard<std::mutex> lk(g_mu);
  record("ncclCommAbort").comm = comm;
  delete reinterpret_cast<FakeComm*>(comm);
  return Success;
}

STANDIN_API Result ncclCommGetAsyncError(CommHandle comm, Result* async_error) {
  std::lock_guard<std::mutex> lk(g_mu);
  record("ncclCommGetAsyncError").comm = comm;
  *async_error = injected("async");
  return Success;
}

STANDIN_API const char* ncclGetErrorString(Result r) {
  static thread_local char buf[64];
  std::snprintf(buf, sizeof buf, "standin error %d", static_cast<int>(r));
  return buf;
}

STANDIN_API const char* ncclGetLastError(CommHandle) {
  return "standin last error";
}

STANDIN_API Result ncclAllGather(const void* send, void* recv, size_t count, DataType dt, CommHandle comm,
                                 Stream stream) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclAllGather");
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.dtype = dt;
  c.comm = comm;
  c.stream = stream;
  return injected("ncclAllGather");
}

STANDIN_API Result ncclReduceScatter(const void* send, void* recv, size_t count, DataType dt, RedOp op, CommHandle comm,
                                     Stream stream) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclReduceScatter");
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.dtype = dt;
  c.op = op;
  c.comm = comm;
  c.stream = stream;
  Result r = injected("ncclReduceScatter");
  return r != Success ? r : executeOneRank(send, recv, count, dt, op, comm);
}

#ifndef HCSTANDIN_OMIT_ALLREDUCE
STANDIN_API Result ncclAllReduce(const void* send, void* recv, size_t count, DataType dt, RedOp op, CommHandle comm,
                                 Stream stream) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclAllReduce");
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.dtype = dt;
  c.op = op;
  c.comm = comm;
  c.stream = stream;
  Result r = injected("ncclAllReduce");
  return r != Success ? r : executeOneRank(send, recv, count, dt, op, comm);
}
#endif

STANDIN_API Result ncclBroadcast(const void* send, void* recv, size_t count, DataType dt, int root, CommHandle comm,
                                 Stream stream) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclBroadcast");
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.dtype = dt;
  c.root = root;
  c.comm = comm;
  c.stream = stream;
  return injected("ncclBroadcast");
}

STANDIN_API Result ncclRedOpCreatePreMulSum(RedOp* op, void* scalar, DataType dt, ScalarResidence residence,
                                            CommHandle comm) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclRedOpCreatePreMulSum");
  static const int kSize[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  if (dt >= 0 && dt < 10) std::memcpy(c.scalar, scalar, kSize[dt]);
  c.dtype = dt;
  c.residence = residence;
  c.comm = comm;
  Result r = injected("ncclRedOpCreatePreMulSum");
  if (r != Success) return r;
  *op = static_cast<RedOp>(NumOps + g_ops++);
  double v = 0;
  if (dt == Float32) {
    float f;
    std::memcpy(&f, scalar, sizeof f);
    v = f;
  } else if (dt == Float64) {
    std::memcpy(&v, scalar, sizeof v);
  }
  g_premul.resize(static_cast<size_t>(g_ops));
  g_premul.back() = PremulOp{dt, v};
  c.op = *op;
  return Success;
}

STANDIN_API Result ncclRedOpDestroy(RedOp op, CommHandle comm) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclRedOpDestroy");
  c.op = op;
  c.comm = comm;
  return injected("ncclRedOpDestroy");
}

// Point-to-point: the peer is recorded as root, the buffer as send or recv.
STANDIN_API Result ncclSend(const void* send, size_t count, DataType dt, int peer, CommHandle comm, Stream stream) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclSend");
  c.send = send;
  c.count = count;
  c.dtype = dt;
  c.root = peer;
  c.comm = comm;
  c.stream = stream;
  return injected("ncclSend");
}

STANDIN_API Result ncclRecv(void* recv, size_t count, DataType dt, int peer, CommHandle comm, Stream stream) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclRecv");
  c.recv = recv;
  c.count = count;
  c.dtype = dt;
  c.root = peer;
  c.comm = comm;
  c.stream = stream;
  return injected("ncclRecv");
}

STANDIN_API Result ncclGroupStart() {
  std::lock_guard<std::mutex> lk(g_mu);
  record("ncclGroupStart");
  return injected("ncclGroupStart");
}

STANDIN_API Result ncclGroupEnd() {
  std::lock_guard<std::mutex> lk(g_mu);
  record("ncclGroupEnd");
  return injected("ncclGroupEnd");
}
