// The element-wise reduction kernel (reduce_kernels.cu), one launch per ReduceJob.
#pragma once

#include <cuda_runtime_api.h>

#include "device/dev_stream.h"

namespace hicoll::dev {

// Enqueues job on stream with at most max_blocks thread blocks (the copy engines move the
// data; the reduction takes only a slice of the GPU). Returns the launch error, if any.
cudaError_t launchReduce(const ReduceJob& job, cudaStream_t stream, int max_blocks);

}  // namespace hicoll::dev
