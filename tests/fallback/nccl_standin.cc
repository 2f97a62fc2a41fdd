// A stand-in for libnccl.so.2: every NCCL function the fallback resolves, recording its
// arguments. Built twice: complete, and without ncclAllReduce (a library missing a symbol).
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
  const char* v = std::getenv("HCSTANDIN_VERSION");
  *version = v ? std::atoi(v) : 22809;
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

STANDIN_API const char* ncclGetLastError(CommHandle) { return "standin last error"; }

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

STANDIN_API Result ncclReduceScatter(const void* send, void* recv, size_t count, DataType dt, RedOp op,
                                     CommHandle comm, Stream stream) {
  std::lock_guard<std::mutex> lk(g_mu);
  StandinCall& c = record("ncclReduceScatter");
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.dtype = dt;
  c.op = op;
  c.comm = comm;
  c.stream = stream;
  return injected("ncclReduceScatter");
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
  return injected("ncclAllReduce");
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
