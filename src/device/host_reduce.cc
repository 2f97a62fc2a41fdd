// The element-wise reduction on the host, with exactly the arithmetic of the CUDA kernels.
#include <cstring>

#include "base/error.h"
#include "device/dev_stream.h"

namespace hicoll::dev {
namespace {

template <class T>
void reduceAs(const ReduceJob& j) {
  using A = typename num::Arith<T>::Acc;
  const A s = num::scalarAs<T>(j.scalar);
  for (size_t i = 0; i < j.n; ++i) {
    A acc{};
    for (int k = 0; k < j.nin; ++k) {
      T v;
      std::memcpy(&v, static_cast<const char*>(j.in[k]) + i * sizeof(T), sizeof(T));
      A x = num::Arith<T>::load(v);
      if (j.premul) x = num::premul<A>(x, s);
      acc = k == 0 ? x : num::apply<A>(j.op, acc, x);
    }
    if (j.divisor > 0) acc = num::divide<A>(acc, j.divisor);
    T out = num::Arith<T>::store(acc);
    std::memcpy(static_cast<char*>(j.out) + i * sizeof(T), &out, sizeof(T));
  }
}

}  // namespace

void hostReduce(const ReduceJob& j) {
  HC_CHECK(j.nin >= 1 && j.nin <= kMaxReduceInputs, hcInternalError, "reduction with {} inputs", j.nin);
  switch (j.dtype) {
    case hcInt8: return reduceAs<int8_t>(j);
    case hcUint8: return reduceAs<uint8_t>(j);
    case hcInt32: return reduceAs<int32_t>(j);
    case hcUint32: return reduceAs<uint32_t>(j);
    case hcInt64: return reduceAs<int64_t>(j);
    case hcUint64: return reduceAs<uint64_t>(j);
    case hcFloat16: return reduceAs<num::Half>(j);
    case hcFloat32: return reduceAs<float>(j);
    case hcFloat64: return reduceAs<double>(j);
    case hcBfloat16: return reduceAs<num::BFloat16>(j);
    default: HC_THROW(hcInvalidArgument, "no reduction for datatype {}", static_cast<int>(j.dtype));
  }
}

}  // namespace hicoll::dev
