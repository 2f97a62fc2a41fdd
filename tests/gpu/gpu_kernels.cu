#include "gpu_kernels.h"

namespace hcgpu {
namespace {

__device__ unsigned long long globalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin(unsigned long long ns) {
  const unsigned long long t0 = globalTimer();
  while (globalTimer() - t0 < ns) {
  }
}

}  // namespace

cudaError_t launchSpin(cudaStream_t s, double ms) {
  spin<<<1, 1, 0, s>>>(static_cast<unsigned long long>(ms * 1e6));
  return cudaGetLastError();
}

}  // namespace hcgpu
