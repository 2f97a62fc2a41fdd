// The device quantizer: one thread block per quantization block finds its absmax and writes its
// codes; dequantization is element-wise. Exact arithmetic rather than the host's fast paths
// (which the host proves equal to it): x * 127 is exact in double and the quotient is rounded
// once, and the dequantized value is q * (a / 127) rounded as the host rounds it, with the
// same conversions (base/numeric.h), so a device image and its output match the host's bits.
#include "device/quant_kernels.h"

#include "base/numeric.h"

namespace hicoll::dev {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGrid = 65535;
constexpr int kNonFinite = -128;

struct F32 {
  using Elem = float;
  static __device__ float load(float x) { return x; }
  static __device__ float store(float y) { return y; }
};
struct BF16 {
  using Elem = uint16_t;
  static __device__ float load(uint16_t x) { return num::bf16ToFloat(x); }
  static __device__ uint16_t store(float y) { return num::floatToBf16(y); }
};
struct F16 {
  using Elem = uint16_t;
  static __device__ float load(uint16_t x) { return num::halfToFloat(x); }
  static __device__ uint16_t store(float y) { return num::floatToHalf(y); }
};

// base/quant_format's numBlocks / packedBytes for the kernels (those check the block and
// throw; the launchers take blocks that the API validated).
__host__ __device__ size_t blocksOf(size_t count, size_t block) { return (count + block - 1) / block; }
__host__ __device__ size_t imageBytes(size_t count, size_t block) {
  const size_t used = blocksOf(count, block) * sizeof(float) + count;
  return (used + 7) / 8 * 8;
}

template <class F>
__global__ void quantizeKernel(const typename F::Elem* in, size_t count, size_t block, unsigned char* img) {
  __shared__ float part[kThreads];
  const size_t nb = blocksOf(count, block);
  auto* scales = reinterpret_cast<float*>(img);
  auto* codes = reinterpret_cast<signed char*>(img + nb * sizeof(float));
  for (size_t b = blockIdx.x; b < nb; b += gridDim.x) {
    const size_t off = b * block, n = block < count - off ? block : count - off;
    float m = 0.0f;  // the largest finite magnitude
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = fabsf(F::load(in[off + i]));
      if (isfinite(v) && v > m) m = v;
    }
    part[threadIdx.x] = m;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
      if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
      __syncthreads();
    }
    const float a = part[0];
    const double ad = a > 0.0f ? static_cast<double>(a) : 1.0;
    if (threadIdx.x == 0) scales[b] = a;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float x = F::load(in[off + i]);
      const int q = isfinite(x) ? static_cast<int>(rint(static_cast<double>(x) * 127.0 / ad)) : kNonFinite;
      codes[off + i] = static_cast<signed char>(q);
    }
    __syncthreads();  // part[] is reused by the next block
  }
  if (blockIdx.x == 0) {  // the zeros after the codes
    const size_t used = nb * sizeof(float) + count, total = imageBytes(count, block);
    for (size_t i = used + threadIdx.x; i < total; i += blockDim.x) img[i] = 0;
  }
}

template <class F>
__global__ void dequantizeKernel(const unsigned char* img, size_t count, size_t block, typename F::Elem* out) {
  const size_t nb = blocksOf(count, block);
  const auto* scales = reinterpret_cast<const float*>(img);
  const auto* codes = reinterpret_cast<const signed char*>(img + nb * sizeof(float));
  const float nan = num::bitsToFloat(0x7fc00000u);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int q = codes[i];
    const double c = static_cast<double>(scales[i / block]) / 127.0;
    float y;
    if constexpr (sizeof(typename F::Elem) == 4)
      y = static_cast<float>(static_cast<double>(q) * c);  // one rounding, to fp32
    else
      y = static_cast<float>(q) * static_cast<float>(c);  // float, then the 16-bit rounding
    out[i] = F::store(q == kNonFinite ? nan : y);
  }
}

// The quantized ReduceScatter's final sum, element-wise: own plus each image's value in fp32
// (q * (a / 127) in double, rounded once, as the host's sumImages), divided, rounded to dtype.
template <class F>
__global__ void sumQuantizedKernel(QuantSumJob j) {
  const size_t nb = blocksOf(j.count, j.block);
  const float nan = num::bitsToFloat(0x7fc00000u);
  const auto* own = static_cast<const typename F::Elem*>(j.own);
  auto* out = static_cast<typename F::Elem*>(j.out);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < j.count; i += stride) {
    float acc = F::load(own[i]);
    for (int k = 0; k < j.nimages; ++k) {
      const auto* img = static_cast<const unsigned char*>(j.images[k]);
      const int q = reinterpret_cast<const signed char*>(img + nb * sizeof(float))[i];
      const double c = static_cast<double>(reinterpret_cast<const float*>(img)[i / j.block]) / 127.0;
      acc += q == kNonFinite ? nan : static_cast<float>(static_cast<double>(q) * c);
    }
    if (j.divisor > 0) acc = acc / static_cast<float>(j.divisor);
    out[i] = F::store(acc);
  }
}

int grid(size_t want) { return static_cast<int>(want < kMaxGrid ? (want ? want : 1) : kMaxGrid); }

}  // namespace

cudaError_t launchQuantize(const QuantJob& j, cudaStream_t stream) {
  if (j.count == 0) return cudaSuccess;
  if (j.block == 0) return cudaErrorInvalidValue;
  auto* img = static_cast<unsigned char*>(j.out);
  const int g = grid(blocksOf(j.count, j.block));
  switch (j.dtype) {
    case hcFloat32:
      quantizeKernel<F32><<<g, kThreads, 0, stream>>>(static_cast<const float*>(j.in), j.count, j.block, img);
      break;
    case hcBfloat16:
      quantizeKernel<BF16><<<g, kThreads, 0, stream>>>(static_cast<const uint16_t*>(j.in), j.count, j.block, img);
      break;
    case hcFloat16:
      quantizeKernel<F16><<<g, kThreads, 0, stream>>>(static_cast<const uint16_t*>(j.in), j.count, j.block, img);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launchDequantize(const QuantJob& j, cudaStream_t stream) {
  if (j.count == 0) return cudaSuccess;
  if (j.block == 0) return cudaErrorInvalidValue;
  const auto* img = static_cast<const unsigned char*>(j.in);
  const int g = grid((j.count + kThreads - 1) / kThreads);
  switch (j.dtype) {
    case hcFloat32:
      dequantizeKernel<F32><<<g, kThreads, 0, stream>>>(img, j.count, j.block, static_cast<float*>(j.out));
      break;
    case hcBfloat16:
      dequantizeKernel<BF16><<<g, kThreads, 0, stream>>>(img, j.count, j.block, static_cast<uint16_t*>(j.out));
      break;
    case hcFloat16:
      dequantizeKernel<F16><<<g, kThreads, 0, stream>>>(img, j.count, j.block, static_cast<uint16_t*>(j.out));
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launchSumQuantized(const QuantSumJob& j, cudaStream_t stream) {
  if (j.count == 0) return cudaSuccess;
  if (j.block == 0 || j.nimages < 0 || j.nimages > kMaxReduceInputs) return cudaErrorInvalidValue;
  const int g = grid((j.count + kThreads - 1) / kThreads);
  switch (j.dtype) {
    case hcFloat32: sumQuantizedKernel<F32><<<g, kThreads, 0, stream>>>(j); break;
    case hcBfloat16: sumQuantizedKernel<BF16><<<g, kThreads, 0, stream>>>(j); break;
    case hcFloat16: sumQuantizedKernel<F16><<<g, kThreads, 0, stream>>>(j); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace hicoll::dev
