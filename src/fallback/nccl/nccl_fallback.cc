#include "fallback/nccl/nccl_fallback.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "base/numeric.h"

namespace hicoll::nccl {
namespace {

// One rank's outcome of loading the library, exchanged so that every rank fails alike.
struct LoadStatus {
  int32_t code;  // hcResult_t
  char error[252];
};
static_assert(sizeof(LoadStatus) == 256, "LoadStatus is a wire struct");

// Rank 0's unique id (or why it has none), broadcast to all.
struct IdMessage {
  int32_t code;
  char error[124];
  UniqueId id;
};
static_assert(sizeof(IdMessage) == 256, "IdMessage is a wire struct");

hcResult_t codeOf(Result r) {
  switch (r) {
    case Success: return hcSuccess;
    case InvalidArgument: return hcInvalidArgument;
    case InvalidUsage: return hcInvalidUsage;
    case RemoteError: return hcRemoteError;
    case InternalError: return hcInternalError;
    case InProgress: return hcInProgress;
    default: return hcSystemError;  // system and unhandled CUDA errors
  }
}

// NCCL 2.19.1 to 2.29.2 run a reduction on a one-rank communicator with oneRankReduce, a
// kernel on bn = min(32, ceil(bytes / 16 KiB)) blocks whose block b covers elements
// [b * a, (b + 1) * a) with a = alignUp(count / bn, 16 / esize). The floor in count / bn leaves
// the last (count - bn * a) elements, fewer than bn, unwritten whenever that is positive (4097
// float32: 2 blocks of 2048, element 4096 untouched). NCCL 2.29.7 rounds up instead. The kernel
// runs only for a pre-multiplied sum, which NCCL also uses for avg of floating-point types;
// other ops on one rank are a copy.
constexpr int kOneRankTailFirst = 21901, kOneRankTailFixed = 22907;

bool oneRankTailBug(int version) {
  return version >= kOneRankTailFirst && version < kOneRankTailFixed;
}

bool isFloating(hcDataType_t t) {
  return t == hcFloat16 || t == hcFloat32 || t == hcFloat64 || t == hcBfloat16;
}

}  // namespace

size_t oneRankKernelCovers(size_t count, size_t esize) {
  if (count == 0 || esize == 0 || esize > 16) return count;
  const size_t bn = std::min<size_t>(32, (count * esize + (16 << 10) - 1) / (16 << 10));
  const size_t per_pack = 16 / esize;
  const size_t per_block = (count / bn + per_pack - 1) / per_pack * per_pack;
  return std::min(count, bn * per_block);
}

DataType toNccl(hcDataType_t t) {
  switch (t) {
    case hcInt8: return Int8;
    case hcUint8: return Uint8;
    case hcInt32: return Int32;
    case hcUint32: return Uint32;
    case hcInt64: return Int64;
    case hcUint64: return Uint64;
    case hcFloat16: return Float16;
    case hcFloat32: return Float32;
    case hcFloat64: return Float64;
    case hcBfloat16: return Bfloat16;
    default: HC_THROW(hcInvalidArgument, "NCCL fallback: no NCCL datatype for hicoll datatype {}", static_cast<int>(t));
  }
}

RedOp toNccl(OpKind k) {
  switch (k) {
    case OpKind::Sum: return Sum;
    case OpKind::Prod: return Prod;
    case OpKind::Max: return Max;
    case OpKind::Min: return Min;
    case OpKind::Avg: return Avg;
    case OpKind::Band:
    case OpKind::Bor:
    case OpKind::Bxor: HC_THROW(hcUnsupported, "NCCL fallback: NCCL has no {} reduction (no bitwise ops)", opName(k));
    default: HC_THROW(hcInternalError, "NCCL fallback: {} is not a built-in NCCL op", opName(k));
  }
}

Fallback::Fallback(std::string lib_path, int rank, int nranks, BootstrapOps ops)
    : lib_path_(std::move(lib_path)), rank_(rank), nranks_(nranks), ops_(std::move(ops)) {}

Fallback::~Fallback() {
  if (!comm_) return;
  Result r = aborted_ ? lib_->fn().commAbort(comm_) : lib_->fn().commDestroy(comm_);
  if (r != Success)
    HC_WARN("NCCL fallback: {} failed: {}", aborted_ ? "ncclCommAbort" : "ncclCommDestroy", lib_->describe(r, nullptr));
}

void Fallback::init() {
  // 1. Every rank loads the library; all learn whether anyone failed.
  LoadStatus mine{};
  try {
    lib_ = Library::open(lib_path_);
  } catch (const Error& e) {
    mine.code = e.code();
    std::snprintf(mine.error, sizeof mine.error, "%s", e.what());
  }
  std::vector<LoadStatus> all(static_cast<size_t>(nranks_));
  ops_.allgather(&mine, all.data(), sizeof mine);
  for (int r = 0; r < nranks_; ++r) {
    if (all[r].code == hcSuccess) continue;
    if (r == rank_) HC_THROW(static_cast<hcResult_t>(all[r].code), "{}", all[r].error);
    HC_THROW(hcRemoteError, "NCCL fallback: rank {} could not load NCCL: {}", r, all[r].error);
  }
  // 2. Rank 0 makes the unique id and broadcasts it (or its failure).
  IdMessage msg{};
  if (rank_ == 0) {
    Result r = lib_->fn().getUniqueId(&msg.id);
    if (r != Success) {
      msg.code = codeOf(r);
      std::snprintf(msg.error, sizeof msg.error, "ncclGetUniqueId: %s", lib_->describe(r, nullptr).c_str());
    }
  }
  ops_.broadcast(&msg, sizeof msg, 0);
  if (msg.code != hcSuccess)
    HC_THROW(rank_ == 0 ? static_cast<hcResult_t>(msg.code) : hcRemoteError, "NCCL fallback: rank 0: {}", msg.error);
  // 3. The NCCL communicator (collective inside NCCL; bounded by NCCL's own timeouts).
  CommHandle c = nullptr;
  Result r = lib_->fn().commInitRank(&c, nranks_, msg.id, rank_);
  HC_CHECK(r == Success, codeOf(r), "NCCL fallback: ncclCommInitRank(nranks {}, rank {}) failed: {}", nranks_, rank_,
           lib_->describe(r, c));
  comm_ = c;
  HC_INFO("NCCL fallback ready: {} (NCCL version code {}), {} ranks", lib_->path(), lib_->version(), nranks_);
}

void Fallback::check(Result r, const char* fn, const CollArgs& a) {
  if (r == Success) return;
  check(r, fn, [&a] { return describe(a); });
}

void Fallback::check(Result r, const char* fn, const std::function<std::string()>& what) {
  if (r == Success) return;
  HC_THROW(codeOf(r), "NCCL fallback: {} for {} failed: {}", fn, what(), lib_->describe(r, comm_));
}

void Fallback::ready(const std::function<std::string()>& what) {
  if (!comm_) {
    HC_CHECK(init_code_ == hcSuccess, init_code_, "{}", init_error_);
    try {
      init();
    } catch (const Error& e) {
      init_code_ = e.code();
      init_error_ = e.what();
      throw;
    }
  }
  Result async = Success;
  check(lib_->fn().commGetAsyncError(comm_, &async), "ncclCommGetAsyncError", what);
  HC_CHECK(async == Success, hcRemoteError, "NCCL fallback: the NCCL communicator failed earlier: {}",
           lib_->describe(async, comm_));
}

void Fallback::sendRecv(bool send, void* buf, size_t count, hcDataType_t dtype, int peer, Stream stream, bool grouped) {
  const auto what = [&] {
    return fmt::format("{} of {} x {} {} rank {}", send ? "a send" : "a receive", count, dtypeName(dtype),
                       send ? "to" : "from", peer);
  };
  const DataType dt = toNccl(dtype);
  ready(what);
  const Functions& f = lib_->fn();
  if (grouped && !group_open_) {
    check(f.groupStart(), "ncclGroupStart", what);
    group_open_ = true;
  }
  if (send) check(f.send(buf, count, dt, peer, comm_, stream), "ncclSend", what);
  else check(f.recv(buf, count, dt, peer, comm_, stream), "ncclRecv", what);
}

void Fallback::endGroup() {
  if (!group_open_) return;
  group_open_ = false;
  check(lib_->fn().groupEnd(), "ncclGroupEnd", [] { return std::string("a group of point-to-point calls"); });
}

void Fallback::run(const CollArgs& a) {
  // Before NCCL is loaded or its communicator made: every rank refuses alike.
  HC_CHECK(!isBitwise(a.op.kind), hcUnsupported,
           "NCCL fallback: {}: NCCL has no {} reduction (bitwise ops run on hicoll's own paths only)", describe(a),
           opName(a.op.kind));
  ready([&a] { return describe(a); });
  const Functions& f = lib_->fn();

  const DataType dt = toNccl(a.dtype);
  switch (a.coll) {
    case hcCollAllGather: check(f.allGather(a.send, a.recv, a.count, dt, comm_, a.stream), "ncclAllGather", a); return;
    case hcCollBroadcast:
      check(f.broadcast(a.send, a.recv, a.count, dt, a.root, comm_, a.stream), "ncclBroadcast", a);
      return;
    case hcCollReduceScatter:
    case hcCollAllReduce: break;
    default: HC_THROW(hcInvalidUsage, "NCCL fallback: {} is not a device collective", collName(a.coll));
  }
  RedOp op;
  const bool premul = a.op.kind == OpKind::PreMulSum;
  // One rank on an NCCL with the oneRankReduce tail bug (above): avg of one rank is the input
  // itself, which NCCL's copy gives exactly (sum of one rank); a pre-multiplied sum is issued
  // again for the elements the kernel leaves out (fewer than 32, one block, always covered).
  const bool tail_bug = nranks_ == 1 && oneRankTailBug(lib_->version());
  if (premul) {
    alignas(8) unsigned char scalar[8] = {};
    num::encodeScalar(a.op.scalar, a.dtype, scalar);
    check(f.redOpCreatePreMulSum(&op, scalar, dt, ScalarHostImmediate, comm_), "ncclRedOpCreatePreMulSum", a);
  } else if (tail_bug && a.op.kind == OpKind::Avg && isFloating(a.dtype)) {
    op = Sum;
  } else {
    op = toNccl(a.op.kind);
  }
  auto call = [&](size_t off, size_t n) {
    const size_t bytes = off * typeSize(a.dtype);
    const void* send = static_cast<const char*>(a.send) + bytes;
    void* recv = static_cast<char*>(a.recv) + bytes;
    return a.coll == hcCollReduceScatter ? f.reduceScatter(send, recv, n, dt, op, comm_, a.stream)
                                         : f.allReduce(send, recv, n, dt, op, comm_, a.stream);
  };
  Result rc = call(0, a.count);
  if (rc == Success && premul && tail_bug) {
    const size_t covered = oneRankKernelCovers(a.count, typeSize(a.dtype));
    if (covered < a.count) {
      HC_TRACE(
          "NCCL fallback: {}: NCCL {} leaves elements {}..{} of a one-rank pre-multiplied sum unwritten; "
          "issuing them again",
          describe(a), lib_->version(), covered, a.count - 1);
      rc = call(covered, a.count - covered);
    }
  }
  // NCCL allows destroying the op as soon as the collective using it has been enqueued.
  if (premul) {
    Result rd = f.redOpDestroy(op, comm_);
    if (rd != Success && rc == Success) check(rd, "ncclRedOpDestroy", a);
  }
  check(rc, a.coll == hcCollReduceScatter ? "ncclReduceScatter" : "ncclAllReduce", a);
}

}  // namespace hicoll::nccl
