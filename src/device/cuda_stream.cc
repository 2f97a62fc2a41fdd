#include "device/cuda_stream.h"

#include <cuda.h>

#include <chrono>
#include <thread>

#include "device/cuda_check.h"
#include "device/quant_kernels.h"
#include "device/reduce_kernels.h"

namespace hicoll::dev {
namespace {

// Thread blocks a reduction may use: a slice of the GPU, enough to keep up with NVLink.
constexpr int kReduceBlocksPerSm = 1;
constexpr int kReduceMaxBlocks = 32;

template <class Fn>
std::string resolve(const char* name, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
#else  // older toolkits on GPU machines
  cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
    (void)cudaGetLastError();
    return fmt::format("{} is not available from the CUDA driver ({})", name,
                       e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found");
  }
  *out = reinterpret_cast<Fn>(fn);
  return "";
}

}  // namespace

std::string StreamMemOps::load() {
  // CUstream and cudaStream_t are the same handle; CUdeviceptr is a 64-bit address.
  static_assert(sizeof(CUdeviceptr) == sizeof(uint64_t), "CUdeviceptr is 64-bit");
  std::string why = resolve("cuStreamWaitValue32", &wait);
  if (why.empty()) why = resolve("cuStreamWriteValue32", &write);
  return why;
}

CudaStream::CudaStream(int device, const StreamMemOps& ops) : device_(device), ops_(ops) {
  HC_CHECK(ops_.wait && ops_.write, hcInternalError, "stream memory operations not resolved");
  DeviceGuard g(device_);
  HC_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  HC_CUDA(cudaEventCreateWithFlags(&in_, cudaEventDisableTiming));
  HC_CUDA(cudaEventCreateWithFlags(&out_, cudaEventDisableTiming));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device_;
  HC_CUDA(cudaMemPoolCreate(&pool_, &props));
  // Keep freed scratch in the pool: AllReduce padding is allocated on every call.
  uint64_t keep = ~uint64_t{0};
  HC_CUDA(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
  int sms = 0;
  HC_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
  max_blocks_ = std::max(1, std::min(kReduceMaxBlocks, sms * kReduceBlocksPerSm));
}

CudaStream::~CudaStream() {
  int prev = -1;
  (void)cudaGetDevice(&prev);
  (void)cudaSetDevice(device_);
  if (stream_) (void)cudaStreamDestroy(stream_);  // pending work still completes
  if (in_) (void)cudaEventDestroy(in_);
  if (out_) (void)cudaEventDestroy(out_);
  if (pool_) (void)cudaMemPoolDestroy(pool_);
  if (prev >= 0) (void)cudaSetDevice(prev);
}

void CudaStream::joinFrom(void* user) {
  HC_CUDA(cudaEventRecord(in_, static_cast<cudaStream_t>(user)));
  HC_CUDA(cudaStreamWaitEvent(stream_, in_, 0));
}

void CudaStream::joinTo(void* user) {
  HC_CUDA(cudaEventRecord(out_, stream_));
  HC_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(user), out_, 0));
}

void CudaStream::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) HC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

void CudaStream::copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
  if (width && height) HC_CUDA(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, stream_));
}

void CudaStream::writeFlag(const FlagRef& f, uint32_t value) {
  HC_CU(ops_.write(stream_, f.dev, value, CU_STREAM_WRITE_VALUE_DEFAULT));
}

void CudaStream::waitFlag(const FlagRef& f, uint32_t value) {
  HC_CU(ops_.wait(stream_, f.dev, value, CU_STREAM_WAIT_VALUE_GEQ));
}

void CudaStream::reduce(const ReduceJob& job) {
  HC_CUDA(launchReduce(job, stream_, max_blocks_));
}
void CudaStream::quantize(const QuantJob& job) {
  HC_CUDA(launchQuantize(job, stream_));
}
void CudaStream::dequantize(const QuantJob& job) {
  HC_CUDA(launchDequantize(job, stream_));
}
void CudaStream::sumQuantized(const QuantSumJob& job) {
  HC_CUDA(launchSumQuantized(job, stream_));
}

void* CudaStream::allocTemp(size_t bytes) {
  void* p = nullptr;
  HC_CUDA(cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, pool_, stream_));
  return p;
}

void CudaStream::freeTemp(void* p) {
  if (p) HC_CUDA(cudaFreeAsync(p, stream_));
}

bool CudaStream::idle() {
  cudaError_t e = cudaStreamQuery(stream_);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) (void)cudaGetLastError();  // a failed stream has nothing left to run
  return true;
}

std::string probeStreamMemOps(const StreamMemOps& ops, volatile uint32_t* host, uint64_t dev, long timeout_ms) {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cudaStreamCreate failed";
  }
  const uint32_t v = *host + 0x5a5a;
  std::string why;
  int r = ops.write(s, dev, v, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r == 0) r = ops.wait(s, dev, v, CU_STREAM_WAIT_VALUE_GEQ);
  if (r != 0)
    why = fmt::format("cuStreamWriteValue32/cuStreamWaitValue32 on pinned host memory returned CUresult {}", r);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  cudaError_t e = cudaErrorNotReady;
  while ((e = cudaStreamQuery(s)) == cudaErrorNotReady && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (why.empty() && e != cudaSuccess)
    why = fmt::format("a stream write/wait on pinned host memory did not complete: {}", cudaGetErrorString(e));
  if (why.empty() && *host != v) why = "a stream write to pinned host memory was not visible to the host";
  (void)cudaGetLastError();
  if (e != cudaErrorNotReady) (void)cudaStreamDestroy(s);  // a stuck stream is leaked, not waited on
  return why;
}

}  // namespace hicoll::dev
