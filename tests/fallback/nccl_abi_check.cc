// nccl_abi.h's values against NCCL's own header, where the build found one: a value copied
// wrong fails the build here instead of sending the wrong datatype or op to NCCL.
#include <nccl.h>

#include "fallback/nccl/nccl_abi.h"

namespace hicoll::nccl {

constexpr bool same(int ours, int theirs) {
  return ours == theirs;
}

static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes && NCCL_UNIQUE_ID_BYTES == kUniqueIdBytes);
static_assert(same(Success, ncclSuccess) && same(UnhandledCudaError, ncclUnhandledCudaError) &&
              same(SystemError, ncclSystemError) && same(InternalError, ncclInternalError) &&
              same(InvalidArgument, ncclInvalidArgument) && same(InvalidUsage, ncclInvalidUsage) &&
              same(RemoteError, ncclRemoteError) && same(InProgress, ncclInProgress));
static_assert(same(Sum, ncclSum) && same(Prod, ncclProd) && same(Max, ncclMax) && same(Min, ncclMin) &&
              same(Avg, ncclAvg) && same(NumOps, ncclNumOps));
static_assert(same(Int8, ncclInt8) && same(Uint8, ncclUint8) && same(Int32, ncclInt32) && same(Uint32, ncclUint32) &&
              same(Int64, ncclInt64) && same(Uint64, ncclUint64) && same(Float16, ncclFloat16) &&
              same(Float32, ncclFloat32) && same(Float64, ncclFloat64) && same(Bfloat16, ncclBfloat16));
static_assert(same(ScalarDevice, ncclScalarDevice) && same(ScalarHostImmediate, ncclScalarHostImmediate));

}  // namespace hicoll::nccl
