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

// c ? a : b by masks, for integers. A ?: whose operand is computed in floating point makes GCC
// keep that computation conditional (it may trap), and the loop around it then does not
// vectorise.
template <class I>
HC_HD I pick(bool c, I a, I b) {
  const I m = static_cast<I>(-static_cast<I>(c));
  return static_cast<I>((a & m) | (b & ~m));
}

// The half conversions are branch-free, so that loops over them vectorise (host reductions,
// the quantization kernels): every case is computed and the right one selected.
HC_HD float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa in fp32's places
  const uint32_t exp = em & 0x0f800000u;
  const uint32_t normal = em + (112u << 23);  // the exponent rebiased (127 - 15)
  const uint32_t special = em | 0x7f800000u;  // inf / nan
  // Subnormal (and zero): read as the normal of the smallest exponent, minus that exponent's
  // 1.0 (2^-14), which is exact.
  const uint32_t sub = floatToBits(bitsToFloat(em + (113u << 23)) - bitsToFloat(113u << 23));
  const uint32_t r = pick(exp == 0, sub, pick(exp == 0x0f800000u, special, normal));
  return bitsToFloat(sign | r);
}

HC_HD uint16_t floatToHalf(float f) {
  const uint32_t u = floatToBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  // A normal half: the mantissa rounded to 10 bits, to nearest even (a carry moves into the
  // exponent), the exponent rebiased; from 65520 up (and inf) it overflows to inf.
  const uint32_t n = ((abs + 0xfffu + ((abs >> 13) & 1u)) >> 13) - (112u << 10);
  const uint32_t normal = n < 0x7c00u ? n : 0x7c00u;
  // Below the smallest normal half (2^-14): adding 0.5, whose ulp is the subnormal half's step
  // (2^-24), leaves the value's steps in the low bits, rounded to nearest even by the addition.
  const uint32_t sub = floatToBits(bitsToFloat(abs) + 0.5f) - 0x3f000000u;
  const uint32_t r = pick(abs > 0x7f800000u, 0x7e00u, pick(abs < 0x38800000u, sub, normal));  // nan, subnormal
  return static_cast<uint16_t>(sign | r);
}

HC_HD float bf16ToFloat(uint16_t b) {
  return bitsToFloat(static_cast<uint32_t>(b) << 16);
}

// A float that is not a NaN, rounded to bf16 (to nearest even; past the largest bf16, inf).
HC_HD uint16_t roundToBf16(float f) {
  const uint32_t u = floatToBits(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

HC_HD uint16_t floatToBf16(float f) {
  const uint32_t u = floatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet nan
  return roundToBf16(f);
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
