#include "algorithms/reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include <emmintrin.h>

#include "base/error.h"
#include "base/kernel_clones.h"
#include "base/numeric.h"

namespace hicoll {

namespace {

struct Half {
  uint16_t v;
};
struct Bf16 {
  uint16_t v;
};

template <class T>
struct Traits {
  using Acc = T;
  static Acc load(T x) { return x; }
  static T store(Acc a) { return a; }
};
template <>
struct Traits<Half> {
  using Acc = float;
  static float load(Half x) { return num::halfToFloat(x.v); }
  static Half store(float a) { return Half{num::floatToHalf(a)}; }
};
template <>
struct Traits<Bf16> {
  using Acc = float;
  static float load(Bf16 x) { return num::bf16ToFloat(x.v); }
  static Bf16 store(float a) { return Bf16{num::floatToBf16(a)}; }
};

// Integer sums and products wrap (two's complement), as in NCCL, without signed overflow.
template <class A>
A addWrap(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <class A>
A mulWrap(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned, std::make_unsigned_t<A>>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

template <class T, OpKind K>
void reduceTyped(const ReduceSpec& s, T* dst, const void* const* srcs, int nsrc, size_t n) {
  using Acc = typename Traits<T>::Acc;
  constexpr size_t kBlock = 512;
  alignas(64) Acc acc[kBlock];
  const Acc scale = static_cast<Acc>(s.scalar);
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    const T* s0 = static_cast<const T*>(srcs[0]) + base;
    const bool premul0 = K == OpKind::PreMulSum && (s.premul_mask & 1);
    if (premul0) {
      for (size_t j = 0; j < m; ++j) acc[j] = mulWrap<Acc>(Traits<T>::load(s0[j]), scale);
    } else {
      for (size_t j = 0; j < m; ++j) acc[j] = Traits<T>::load(s0[j]);
    }
    for (int k = 1; k < nsrc; ++k) {
      const T* sk = static_cast<const T*>(srcs[k]) + base;
      const bool premul = K == OpKind::PreMulSum && k < 64 && ((s.premul_mask >> k) & 1);
      // One branch-free loop per case, so that each vectorises.
      if (premul) {
        for (size_t j = 0; j < m; ++j) acc[j] = addWrap<Acc>(acc[j], mulWrap<Acc>(Traits<T>::load(sk[j]), scale));
        continue;
      }
      for (size_t j = 0; j < m; ++j) {
        Acc x = Traits<T>::load(sk[j]);
        if constexpr (K == OpKind::Sum || K == OpKind::Avg || K == OpKind::PreMulSum) {
          acc[j] = addWrap<Acc>(acc[j], x);
        } else if constexpr (K == OpKind::Prod) {
          acc[j] = mulWrap<Acc>(acc[j], x);
        } else if constexpr (K == OpKind::Max) {
          acc[j] = x > acc[j] ? x : acc[j];
        } else if constexpr (K == OpKind::Band) {
          acc[j] &= x;
        } else if constexpr (K == OpKind::Bor) {
          acc[j] |= x;
        } else if constexpr (K == OpKind::Bxor) {
          acc[j] ^= x;
        } else {
          acc[j] = x < acc[j] ? x : acc[j];
        }
      }
    }
    if constexpr (K == OpKind::Avg) {
      if (s.avg_divisor > 0)
        for (size_t j = 0; j < m; ++j) acc[j] = static_cast<Acc>(acc[j] / static_cast<Acc>(s.avg_divisor));
    }
    T* d = dst + base;
    if (s.stream_dst && m == kBlock && reinterpret_cast<uintptr_t>(d) % 16 == 0) {
      // Past the caches: no read-for-ownership of the destination lines.
      alignas(16) T out[kBlock];
      for (size_t j = 0; j < m; ++j) out[j] = Traits<T>::store(acc[j]);
      auto* from = reinterpret_cast<const __m128i*>(out);
      auto* to = reinterpret_cast<__m128i*>(d);
      for (size_t j = 0; j < sizeof(out) / 16; ++j) _mm_stream_si128(to + j, _mm_load_si128(from + j));
      continue;
    }
    for (size_t j = 0; j < m; ++j) d[j] = Traits<T>::store(acc[j]);
  }
  if (s.stream_dst) _mm_sfence();
}

template <class T>
void reduceOp(const ReduceSpec& s, void* dst, const void* const* srcs, int nsrc, size_t n) {
  T* d = static_cast<T*>(dst);
  switch (s.kind) {
    case OpKind::Sum: return reduceTyped<T, OpKind::Sum>(s, d, srcs, nsrc, n);
    case OpKind::Prod: return reduceTyped<T, OpKind::Prod>(s, d, srcs, nsrc, n);
    case OpKind::Max: return reduceTyped<T, OpKind::Max>(s, d, srcs, nsrc, n);
    case OpKind::Min: return reduceTyped<T, OpKind::Min>(s, d, srcs, nsrc, n);
    case OpKind::Avg: return reduceTyped<T, OpKind::Avg>(s, d, srcs, nsrc, n);
    case OpKind::PreMulSum: return reduceTyped<T, OpKind::PreMulSum>(s, d, srcs, nsrc, n);
    case OpKind::Band:
    case OpKind::Bor:
    case OpKind::Bxor:
      if constexpr (std::is_integral_v<T>) {
        if (s.kind == OpKind::Band) return reduceTyped<T, OpKind::Band>(s, d, srcs, nsrc, n);
        if (s.kind == OpKind::Bor) return reduceTyped<T, OpKind::Bor>(s, d, srcs, nsrc, n);
        return reduceTyped<T, OpKind::Bxor>(s, d, srcs, nsrc, n);
      }
      // The API refuses these (integer types only); reaching here is a bug, not a wrong answer.
      HC_THROW(hcInternalError, "reduce: {} of {}", opName(s.kind), dtypeName(s.dtype));
  }
}

}  // namespace

HC_KERNEL_CLONES void reduceN(const ReduceSpec& s, void* dst, const void* const* srcs, int nsrc, size_t n) {
  if (n == 0) return;
  HC_CHECK(nsrc >= 1, hcInternalError, "reduce with no source");
  switch (s.dtype) {
    case hcInt8: return reduceOp<int8_t>(s, dst, srcs, nsrc, n);
    case hcUint8: return reduceOp<uint8_t>(s, dst, srcs, nsrc, n);
    case hcInt32: return reduceOp<int32_t>(s, dst, srcs, nsrc, n);
    case hcUint32: return reduceOp<uint32_t>(s, dst, srcs, nsrc, n);
    case hcInt64: return reduceOp<int64_t>(s, dst, srcs, nsrc, n);
    case hcUint64: return reduceOp<uint64_t>(s, dst, srcs, nsrc, n);
    case hcFloat16: return reduceOp<Half>(s, dst, srcs, nsrc, n);
    case hcFloat32: return reduceOp<float>(s, dst, srcs, nsrc, n);
    case hcFloat64: return reduceOp<double>(s, dst, srcs, nsrc, n);
    case hcBfloat16: return reduceOp<Bf16>(s, dst, srcs, nsrc, n);
    default: HC_THROW(hcInvalidArgument, "reduce: invalid datatype {}", static_cast<int>(s.dtype));
  }
}

}  // namespace hicoll
