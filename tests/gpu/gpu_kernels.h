// Test kernels: user work that a stream-ordered collective must wait for.
#pragma once

#include <cuda_runtime_api.h>

namespace hcgpu {

// One thread spins on the global timer for ms milliseconds.
cudaError_t launchSpin(cudaStream_t s, double ms);

}  // namespace hcgpu
