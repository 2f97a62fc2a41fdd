// Error checks for CUDA runtime and driver calls: a failure throws hicoll::Error with the
// call, the CUDA error name and text, and where it happened.
#pragma once

#include <cuda_runtime_api.h>

#include "base/error.h"

namespace hicoll::dev {

[[noreturn]] inline void throwCuda(cudaError_t e, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear a non-sticky error so later calls are not blamed
  throw Error(hcSystemError,
              fmt::format("{} failed: {} ({}) at {}:{}", call, cudaGetErrorString(e), cudaGetErrorName(e), file, line));
}

[[noreturn]] inline void throwCu(int r, const char* call, const char* file, int line) {
  throw Error(hcSystemError, fmt::format("{} failed: CUresult {} at {}:{}", call, r, file, line));
}

// Makes device current for a scope and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device) {
      cudaError_t e = cudaSetDevice(device);
      if (e != cudaSuccess) throwCuda(e, "cudaSetDevice", __FILE__, __LINE__);
    }
  }
  ~DeviceGuard() {
    int cur = -1;
    if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace hicoll::dev

#define HC_CUDA(call)                                                                     \
  do {                                                                                    \
    cudaError_t hc_e_ = (call);                                                           \
    if (hc_e_ != cudaSuccess) ::hicoll::dev::throwCuda(hc_e_, #call, __FILE__, __LINE__); \
  } while (0)
#define HC_CU(call)                                                           \
  do {                                                                        \
    int hc_r_ = static_cast<int>(call);                                       \
    if (hc_r_ != 0) ::hicoll::dev::throwCu(hc_r_, #call, __FILE__, __LINE__); \
  } while (0)
