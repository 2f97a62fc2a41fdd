// The part of NCCL's C ABI the fallback calls, declared here so that hicoll builds without
// nccl.h (host-only builds, and the tests that drive a stand-in library). Values and layouts
// are NCCL's (nccl.h, 2.x); tests/fallback checks them against the real header when present.
#pragma once

#include <cstddef>

namespace hicoll::nccl {

struct Comm;  // ncclComm
using CommHandle = Comm*;
using Stream = void*;  // cudaStream_t

constexpr size_t kUniqueIdBytes = 128;
struct UniqueId {
  char internal[kUniqueIdBytes];
};

enum Result : int {
  Success = 0,
  UnhandledCudaError = 1,
  SystemError = 2,
  InternalError = 3,
  InvalidArgument = 4,
  InvalidUsage = 5,
  RemoteError = 6,
  InProgress = 7,
};

// Values of ncclRedOp_t; handles made by ncclRedOpCreatePreMulSum are >= NumOps.
enum RedOp : int { Sum = 0, Prod = 1, Max = 2, Min = 3, Avg = 4, NumOps = 5 };

enum DataType : int {
  Int8 = 0,
  Uint8 = 1,
  Int32 = 2,
  Uint32 = 3,
  Int64 = 4,
  Uint64 = 5,
  Float16 = 6,
  Float32 = 7,
  Float64 = 8,
  Bfloat16 = 9,
};

enum ScalarResidence : int { ScalarDevice = 0, ScalarHostImmediate = 1 };

// Function types, one per symbol the fallback resolves.
using GetVersionFn = Result (*)(int* version);
using GetUniqueIdFn = Result (*)(UniqueId* id);
using CommInitRankFn = Result (*)(CommHandle* comm, int nranks, UniqueId id, int rank);
using CommDestroyFn = Result (*)(CommHandle comm);
using CommAbortFn = Result (*)(CommHandle comm);
using CommGetAsyncErrorFn = Result (*)(CommHandle comm, Result* async_error);
using GetErrorStringFn = const char* (*)(Result result);
using GetLastErrorFn = const char* (*)(CommHandle comm);
using AllGatherFn = Result (*)(const void* send, void* recv, size_t sendcount, DataType dtype, CommHandle comm,
                               Stream stream);
using ReduceScatterFn = Result (*)(const void* send, void* recv, size_t recvcount, DataType dtype, RedOp op,
                                   CommHandle comm, Stream stream);
using AllReduceFn = Result (*)(const void* send, void* recv, size_t count, DataType dtype, RedOp op, CommHandle comm,
                               Stream stream);
using BroadcastFn = Result (*)(const void* send, void* recv, size_t count, DataType dtype, int root, CommHandle comm,
                               Stream stream);
using RedOpCreatePreMulSumFn = Result (*)(RedOp* op, void* scalar, DataType dtype, ScalarResidence residence,
                                          CommHandle comm);
using RedOpDestroyFn = Result (*)(RedOp op, CommHandle comm);
using SendFn = Result (*)(const void* send, size_t count, DataType dtype, int peer, CommHandle comm, Stream stream);
using RecvFn = Result (*)(void* recv, size_t count, DataType dtype, int peer, CommHandle comm, Stream stream);
using GroupStartFn = Result (*)();
using GroupEndFn = Result (*)();

}  // namespace hicoll::nccl
