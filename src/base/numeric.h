// Element types and reduction arithmetic shared by the CUDA kernels (reduce_kernels.cu) and
// the host reference (host_reduce.cc), so that host tests and the GPU compute the same thing:
// fp16/bf16 are widened to fp32, reduced, and rounded once (round to nearest even); integer
// sums and products wrap (computed unsigned); hcAvg divides the finished sum by the divisor.
#pragma once

#include <cstdint>
#include <cstring>

#include "hicoll/hicoll.h"

#if defined(__CUDACC__)
#define HC_HD __host__ __device__ __forceinline__
#else
#define HC_HD inline
#endif

namespace hicoll::num {

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

HC_HD float bitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

HC_HD uint32_t floatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

HC_HD float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bitsToFloat(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bitsToFloat(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    return bitsToFloat(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | ((man & 0x3ffu) << 13));
  }
  return bitsToFloat(sign | (exp + 127 - 15) << 23 | (man << 13));
}

HC_HD uint16_t floatToHalf(float f) {
  const uint32_t u = floatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);  // nan / inf
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                                  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {               // below the smallest normal half: subnormal
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14 .. 24
    uint32_t r = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

HC_HD float bf16ToFloat(uint16_t b) {
  return bitsToFloat(static_cast<uint32_t>(b) << 16);
}

HC_HD uint16_t floatToBf16(float f) {
  const uint32_t u = floatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet nan
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

// Accumulator and conversions per storage type.
template <class T>
struct Arith {
  using Acc = T;
  HC_HD static Acc load(T v) { return v; }
  HC_HD static T store(Acc v) { return v; }
};
template <>
struct Arith<Half> {
  using Acc = float;
  HC_HD static Acc load(Half v) { return halfToFloat(v.bits); }
  HC_HD static Half store(Acc v) { return Half{floatToHalf(v)}; }
};
template <>
struct Arith<BFloat16> {
  using Acc = float;
  HC_HD static Acc load(BFloat16 v) { return bf16ToFloat(v.bits); }
  HC_HD static BFloat16 store(Acc v) { return BFloat16{floatToBf16(v)}; }
};

template <class A>
struct Unsigned {
  using type = A;
};
template <>
struct Unsigned<int8_t> {
  using type = uint8_t;
};
template <>
struct Unsigned<int32_t> {
  using type = uint32_t;
};
template <>
struct Unsigned<int64_t> {
  using type = uint64_t;
};

// The binary reductions. Integers wrap like NCCL's (no signed-overflow UB). The bitwise ops
// are for integers only (the API refuses them on floating types, whose apply has no case for
// them).
enum class Op : int { Sum = 0, Prod = 1, Max = 2, Min = 3, Band = 4, Bor = 5, Bxor = 6 };

template <class A>
HC_HD A apply(Op op, A a, A b) {
  using U = typename Unsigned<A>::type;
  switch (op) {
    case Op::Sum: return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    case Op::Prod: return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
    case Op::Max: return b > a ? b : a;
    case Op::Band: return static_cast<A>(a & b);
    case Op::Bor: return static_cast<A>(a | b);
    case Op::Bxor: return static_cast<A>(a ^ b);
    default: return b < a ? b : a;
  }
}
template <>
HC_HD float apply<float>(Op op, float a, float b) {
  switch (op) {
    case Op::Sum: return a + b;
    case Op::Prod: return a * b;
    case Op::Max: return b > a ? b : a;
    default: return b < a ? b : a;
  }
}
template <>
HC_HD double apply<double>(Op op, double a, double b) {
  switch (op) {
    case Op::Sum: return a + b;
    case Op::Prod: return a * b;
    case Op::Max: return b > a ? b : a;
    default: return b < a ? b : a;
  }
}

// Pre-multiplication (hcRedOpCreatePreMulSum) in the accumulator type.
template <class A>
HC_HD A premul(A x, A s) {
  using U = typename Unsigned<A>::type;
  return static_cast<A>(static_cast<U>(x) * static_cast<U>(s));
}
template <>
HC_HD float premul<float>(float x, float s) {
  return x * s;
}
template <>
HC_HD double premul<double>(double x, double s) {
  return x * s;
}

// hcAvg: the finished sum divided by the number of ranks (truncating for integers).
template <class A>
HC_HD A divide(A x, int d) {
  return static_cast<A>(x / static_cast<A>(d));
}

// The scalar of a pre-multiplied sum as the accumulator sees it: the user's value rounded to
// the datatype first (the API stores it as a double).
template <class T>
HC_HD typename Arith<T>::Acc scalarAs(double s) {
  return static_cast<typename Arith<T>::Acc>(s);
}
template <>
HC_HD float scalarAs<Half>(double s) {
  return halfToFloat(floatToHalf(static_cast<float>(s)));
}
template <>
HC_HD float scalarAs<BFloat16>(double s) {
  return bf16ToFloat(floatToBf16(static_cast<float>(s)));
}

// Writes v as one element of t (host memory) — the scalar handed to ncclRedOpCreatePreMulSum.
inline void encodeScalar(double v, hcDataType_t t, void* out) {
  switch (t) {
    case hcInt8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(out, &x, 1);
      break;
    }
    case hcUint8: {
      uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(out, &x, 1);
      break;
    }
    case hcInt32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(out, &x, 4);
      break;
    }
    case hcUint32: {
      uint32_t x = static_cast<uint32_t>(v);
      std::memcpy(out, &x, 4);
      break;
    }
    case hcInt64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(out, &x, 8);
      break;
    }
    case hcUint64: {
      uint64_t x = static_cast<uint64_t>(v);
      std::memcpy(out, &x, 8);
      break;
    }
    case hcFloat16: {
      uint16_t x = floatToHalf(static_cast<float>(v));
      std::memcpy(out, &x, 2);
      break;
    }
    case hcBfloat16: {
      uint16_t x = floatToBf16(static_cast<float>(v));
      std::memcpy(out, &x, 2);
      break;
    }
    case hcFloat32: {
      float x = static_cast<float>(v);
      std::memcpy(out, &x, 4);
      break;
    }
    case hcFloat64: std::memcpy(out, &v, 8); break;
    default: break;
  }
}

// Reads one element of t as a double (a pre-multiplied sum's scalar); false for an invalid t.
inline bool decodeScalar(const void* in, hcDataType_t t, double* v) {
  switch (t) {
    case hcInt8: {
      int8_t x;
      std::memcpy(&x, in, 1);
      *v = x;
      return true;
    }
    case hcUint8: {
      uint8_t x;
      std::memcpy(&x, in, 1);
      *v = x;
      return true;
    }
    case hcInt32: {
      int32_t x;
      std::memcpy(&x, in, 4);
      *v = x;
      return true;
    }
    case hcUint32: {
      uint32_t x;
      std::memcpy(&x, in, 4);
      *v = x;
      return true;
    }
    case hcInt64: {
      int64_t x;
      std::memcpy(&x, in, 8);
      *v = static_cast<double>(x);
      return true;
    }
    case hcUint64: {
      uint64_t x;
      std::memcpy(&x, in, 8);
      *v = static_cast<double>(x);
      return true;
    }
    case hcFloat16: {
      uint16_t x;
      std::memcpy(&x, in, 2);
      *v = halfToFloat(x);
      return true;
    }
    case hcBfloat16: {
      uint16_t x;
      std::memcpy(&x, in, 2);
      *v = bf16ToFloat(x);
      return true;
    }
    case hcFloat32: {
      float x;
      std::memcpy(&x, in, 4);
      *v = x;
      return true;
    }
    case hcFloat64: std::memcpy(v, in, 8); return true;
    default: return false;
  }
}

}  // namespace hicoll::num
