#include "reference.h"

#include <cmath>
#include <cstdio>
#include <cstring>

namespace hctest {

const hcDataType_t kAllTypes[10] = {hcInt8,   hcUint8,   hcInt32,   hcUint32,  hcInt64,
                                    hcUint64, hcFloat16, hcFloat32, hcFloat64, hcBfloat16};
const hcRedOp_t kBuiltinOps[8] = {hcSum, hcProd, hcMax, hcMin, hcAvg, hcBand, hcBor, hcBxor};

const char* typeName(hcDataType_t t) {
  static const char* names[] = {"int8",   "uint8", "int32", "uint32", "int64",
                                "uint64", "half",  "float", "double", "bfloat16"};
  return t >= 0 && t < hcNumTypes ? names[t] : "?";
}

const char* opName(hcRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg", "band", "bor", "bxor"};
  return op >= 0 && op < hcNumOps ? names[op] : "premulsum";
}

static bool isSigned(hcDataType_t t) {
  return t == hcInt8 || t == hcInt32 || t == hcInt64;
}
bool isFloat(hcDataType_t t) {
  return t == hcFloat16 || t == hcFloat32 || t == hcFloat64 || t == hcBfloat16;
}
bool isBitwise(int op) {
  return op == hcBand || op == hcBor || op == hcBxor;
}

static int valueBits(hcDataType_t t) {
  switch (t) {
    case hcInt8:
    case hcUint8: return 8;
    case hcInt32:
    case hcUint32: return 32;
    default: return 52;
  }
}

// x's low bits bits wide, as the type reads them (sign-extended for signed types).
static double bitsValue(hcDataType_t t, uint64_t x) {
  const int bits = valueBits(t);
  x &= (uint64_t{1} << bits) - 1;
  if (isSigned(t) && (x >> (bits - 1)) & 1) return -static_cast<double>((uint64_t{1} << bits) - x);
  return static_cast<double>(x);
}

static uint64_t mix(uint64_t x) {
  x = (x + 1) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 32);
}

double inputValue(hcDataType_t t, hcRedOp_t op, int rank, size_t i, int salt) {
  const size_t h = (static_cast<size_t>(rank) * 7919u + i * 104729u + static_cast<size_t>(salt) * 31u) % 9973u;
  if (isBitwise(op)) {
    if (h % 31 == 0) return bitsValue(t, ~uint64_t{0});  // all ones (-1 when signed)
    if (h % 37 == 0) return 0;
    const uint64_t a = mix(h), b = mix(h + 9973u);
    return bitsValue(t, op == hcBand ? a | b : op == hcBor ? a & b : a);
  }
  if (op == hcProd) return (h % 5 == 0) ? 2.0 : 1.0;  // products stay exact (and wrap in 8 bits)
  double v = static_cast<double>(h % 9);              // 0..8
  if (isSigned(t) || isFloat(t)) v -= 4;              // -4..4
  return v;
}

// 16-bit float conversions, written independently of the library's.
static uint16_t toHalf(double d) {
  _Float16 h = static_cast<_Float16>(static_cast<float>(d));
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
static double fromHalf(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<double>(h);
}
static uint16_t toBf16(double d) {
  float f = static_cast<float>(d);
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t rounded = x + 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(rounded >> 16);
}
static double fromBf16(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

void store(void* buf, hcDataType_t t, size_t i, double v) {
  switch (t) {
    case hcInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(static_cast<int64_t>(v)); break;
    case hcUint8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(v)); break;
    case hcInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case hcUint32: static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(static_cast<int64_t>(v)); break;
    case hcInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case hcUint64: static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(static_cast<int64_t>(v)); break;
    case hcFloat16: static_cast<uint16_t*>(buf)[i] = toHalf(v); break;
    case hcFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case hcFloat64: static_cast<double*>(buf)[i] = v; break;
    case hcBfloat16: static_cast<uint16_t*>(buf)[i] = toBf16(v); break;
    default: break;
  }
}

double load(const void* buf, hcDataType_t t, size_t i) {
  switch (t) {
    case hcInt8: return static_cast<const int8_t*>(buf)[i];
    case hcUint8: return static_cast<const uint8_t*>(buf)[i];
    case hcInt32: return static_cast<const int32_t*>(buf)[i];
    case hcUint32: return static_cast<const uint32_t*>(buf)[i];
    case hcInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case hcUint64: return static_cast<double>(static_cast<const uint64_t*>(buf)[i]);
    case hcFloat16: return fromHalf(static_cast<const uint16_t*>(buf)[i]);
    case hcFloat32: return static_cast<const float*>(buf)[i];
    case hcFloat64: return static_cast<const double*>(buf)[i];
    case hcBfloat16: return fromBf16(static_cast<const uint16_t*>(buf)[i]);
    default: return NAN;
  }
}

// Reduces to the value the type can hold: integers wrap (two's complement).
static double wrap(hcDataType_t t, long double v) {
  int64_t x = static_cast<int64_t>(v);
  switch (t) {
    case hcInt8: return static_cast<int8_t>(x);
    case hcUint8: return static_cast<uint8_t>(x);
    case hcInt32: return static_cast<int32_t>(x);
    case hcUint32: return static_cast<uint32_t>(x);
    default: return static_cast<double>(v);
  }
}

double premulScalar(hcDataType_t t) {
  return isFloat(t) ? 0.5 : 2.0;
}

double expectedReduce(hcDataType_t t, int op, const std::vector<double>& vals, double scalar) {
  long double acc = vals[0];
  switch (op) {
    case hcProd:
      for (size_t i = 1; i < vals.size(); ++i) acc = wrap(t, acc * vals[i]);
      return wrap(t, acc);
    case hcMax:
      for (double v : vals) acc = v > acc ? v : acc;
      return static_cast<double>(acc);
    case hcMin:
      for (double v : vals) acc = v < acc ? v : acc;
      return static_cast<double>(acc);
    case hcAvg: {
      long double s = 0;
      for (double v : vals) s += v;
      if (isFloat(t)) return static_cast<double>(s / vals.size());
      return wrap(t, static_cast<int64_t>(wrap(t, s)) / static_cast<int64_t>(vals.size()));
    }
    case hcBand:
    case hcBor:
    case hcBxor: {
      // Two's complement in int64 (the values are exact integers within 52 bits).
      int64_t x = static_cast<int64_t>(vals[0]);
      for (size_t i = 1; i < vals.size(); ++i) {
        const int64_t v = static_cast<int64_t>(vals[i]);
        x = op == hcBand ? x & v : op == hcBor ? x | v : x ^ v;
      }
      return wrap(t, x);
    }
    case -1: {
      long double s = 0;
      for (double v : vals) s += v * scalar;
      return wrap(t, s);
    }
    default: {
      long double s = 0;
      for (double v : vals) s += v;
      return wrap(t, s);
    }
  }
}

bool matches(hcDataType_t t, double got, double want) {
  double tol = 0;
  if (t == hcFloat16) tol = 1e-3;
  if (t == hcBfloat16) tol = 8e-3;
  if (t == hcFloat32) tol = 1e-6;
  if (t == hcFloat64) tol = 1e-12;
  return std::fabs(got - want) <= tol * std::fabs(want);
}

void Checker::check(hcDataType_t t, size_t i, double got, double want) {
  if (matches(t, got, want)) return;
  if (wrong++ < 5)
    std::fprintf(stderr, "[rank %d] %s: element %zu is %g, expected %g\n", rank, what.c_str(), i, got, want);
}

}  // namespace hctest
