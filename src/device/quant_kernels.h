// The block quantizer of the device path (quant_kernels.cu): the packed image of
// algorithms/quantize.h, bit for bit what the host quantizer writes and reads.
#pragma once

#include <cuda_runtime_api.h>

#include "device/dev_stream.h"

namespace hicoll::dev {

// Enqueue job on stream; return the launch error, if any.
cudaError_t launchQuantize(const QuantJob& job, cudaStream_t stream);
cudaError_t launchDequantize(const QuantJob& job, cudaStream_t stream);
cudaError_t launchSumQuantized(const QuantSumJob& job, cudaStream_t stream);

}  // namespace hicoll::dev
