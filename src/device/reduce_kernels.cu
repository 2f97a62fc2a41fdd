// Reductions of the device path: out = fin(op over inputs of pre(x)), with the arithmetic of
// numeric.h (fp16/bf16 accumulated in fp32, wrapping integers). Memory-bound: a grid-stride
// loop over a bounded grid, so most SMs stay with the user's kernels.
#include "device/reduce_kernels.h"

namespace hicoll::dev {
namespace {

struct Args {
  const void* in[kMaxReduceInputs];
  void* out;
  size_t n;
  int nin;
  int op;
  int premul;
  int divisor;
  double scalar;
};

template <class T>
__global__ void reduceKernel(Args a) {
  using A = typename num::Arith<T>::Acc;
  const A s = num::scalarAs<T>(a.scalar);
  const num::Op op = static_cast<num::Op>(a.op);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    A acc = num::Arith<T>::load(static_cast<const T*>(a.in[0])[i]);
    if (a.premul) acc = num::premul<A>(acc, s);
    for (int k = 1; k < a.nin; ++k) {
      A x = num::Arith<T>::load(static_cast<const T*>(a.in[k])[i]);
      if (a.premul) x = num::premul<A>(x, s);
      acc = num::apply<A>(op, acc, x);
    }
    if (a.divisor > 0) acc = num::divide<A>(acc, a.divisor);
    static_cast<T*>(a.out)[i] = num::Arith<T>::store(acc);
  }
}

template <class T>
cudaError_t launch(const Args& a, cudaStream_t stream, int max_blocks) {
  constexpr int kThreads = 256;
  const size_t want = (a.n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(want < static_cast<size_t>(max_blocks) ? want : max_blocks);
  reduceKernel<T><<<blocks > 0 ? blocks : 1, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launchReduce(const ReduceJob& j, cudaStream_t stream, int max_blocks) {
  if (j.n == 0) return cudaSuccess;
  if (j.nin < 1 || j.nin > kMaxReduceInputs) return cudaErrorInvalidValue;
  Args a{};
  for (int k = 0; k < j.nin; ++k) a.in[k] = j.in[k];
  a.out = j.out;
  a.n = j.n;
  a.nin = j.nin;
  a.op = static_cast<int>(j.op);
  a.premul = j.premul ? 1 : 0;
  a.divisor = j.divisor;
  a.scalar = j.scalar;
  switch (j.dtype) {
    case hcInt8: return launch<int8_t>(a, stream, max_blocks);
    case hcUint8: return launch<uint8_t>(a, stream, max_blocks);
    case hcInt32: return launch<int32_t>(a, stream, max_blocks);
    case hcUint32: return launch<uint32_t>(a, stream, max_blocks);
    case hcInt64: return launch<int64_t>(a, stream, max_blocks);
    case hcUint64: return launch<uint64_t>(a, stream, max_blocks);
    case hcFloat16: return launch<num::Half>(a, stream, max_blocks);
    case hcFloat32: return launch<float>(a, stream, max_blocks);
    case hcFloat64: return launch<double>(a, stream, max_blocks);
    case hcBfloat16: return launch<num::BFloat16>(a, stream, max_blocks);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace hicoll::dev
