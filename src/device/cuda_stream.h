// The CUDA backend of DevStream: one non-blocking stream per communicator, copies with
// cudaMemcpyAsync (copy engines, including peer copies into/out of CUDA IPC mappings),
// counters with cuStreamWriteValue32 / cuStreamWaitValue32 on pinned host memory, the
// reduction and quantization kernels, and stream-ordered scratch from a private memory pool.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "device/dev_stream.h"

namespace hicoll::dev {

// cuStreamWaitValue32 / cuStreamWriteValue32, resolved through the runtime (no libcuda link).
struct StreamMemOps {
  using WaitFn = int (*)(cudaStream_t, uint64_t, uint32_t, unsigned);
  using WriteFn = int (*)(cudaStream_t, uint64_t, uint32_t, unsigned);
  WaitFn wait = nullptr;
  WriteFn write = nullptr;
  // Resolves both; returns "" or why they are unavailable.
  std::string load();
};

class CudaStream final : public DevStream {
 public:
  // Creates the stream, its join events and memory pool on device. Throws hicoll::Error.
  CudaStream(int device, const StreamMemOps& ops);
  ~CudaStream() override;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  void joinFrom(void* user) override;
  void joinTo(void* user) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) override;
  void writeFlag(const FlagRef& f, uint32_t value) override;
  void waitFlag(const FlagRef& f, uint32_t value) override;
  void reduce(const ReduceJob& job) override;
  void quantize(const QuantJob& job) override;
  void dequantize(const QuantJob& job) override;
  void sumQuantized(const QuantSumJob& job) override;
  void* allocTemp(size_t bytes) override;
  void freeTemp(void* p) override;
  bool idle() override;

  cudaStream_t raw() const { return stream_; }

 private:
  int device_;
  StreamMemOps ops_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t in_ = nullptr, out_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  int max_blocks_ = 32;
};

// Checks that a stream can write and wait on a counter at dev (registered host memory whose
// host address is host): one write, one wait, bounded. Returns "" or what failed.
std::string probeStreamMemOps(const StreamMemOps& ops, volatile uint32_t* host, uint64_t dev, long timeout_ms);

}  // namespace hicoll::dev
