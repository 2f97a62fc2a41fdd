#include "data.h"

#include <hicoll/hicoll.h>
#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace agbench {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint16_t floatToHalf(float f) {  // round to nearest even; values here are small integers
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

uint16_t floatToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

// Element encodings: the stored representation T and the conversion from an exact integer.
template <class T>
struct Plain {
  using Elem = T;
  static Elem enc(int64_t v) { return static_cast<T>(v); }
};
struct Half {
  using Elem = uint16_t;
  static Elem enc(int64_t v) { return floatToHalf(static_cast<float>(v)); }
};
struct Bf16 {
  using Elem = uint16_t;
  static Elem enc(int64_t v) { return floatToBf16(static_cast<float>(v)); }
};

template <class F>
auto dispatch(hcDataType_t dt, F&& f) {
  switch (dt) {
    case hcInt8: return f(Plain<int8_t>{});
    case hcUint8: return f(Plain<uint8_t>{});
    case hcInt32: return f(Plain<int32_t>{});
    case hcUint32: return f(Plain<uint32_t>{});
    case hcInt64: return f(Plain<int64_t>{});
    case hcUint64: return f(Plain<uint64_t>{});
    case hcFloat16: return f(Half{});
    case hcFloat32: return f(Plain<float>{});
    case hcFloat64: return f(Plain<double>{});
    case hcBfloat16: return f(Bf16{});
    default: break;
  }
  throw std::invalid_argument("agbench: unknown datatype");
}

}  // namespace

Pattern::Pattern(Coll coll, const TypeDesc& type, int op, int nranks, int root, size_t block, uint64_t seed)
    : coll_(coll), type_(type), op_(op), nranks_(nranks), root_(root), block_(block), seed_(mix(seed)) {
  const int64_t w = nranks;
  const int64_t exact = type.exact;
  const int64_t cap = 65535;
  switch (collReduces(coll) ? op : kOpNone) {
    case hcSum: range_ = exact / w; break;
    case hcAvg: range_ = exact / (w * w); break;  // values w*u, so the sum divides exactly
    case kOpMulSum: range_ = exact / (2 * w); break;
    case hcProd: {
      int bits = 0;
      while (bits < 20 && (int64_t{2} << bits) <= exact) ++bits;
      prod_ranks_ = std::min(nranks, bits);
      range_ = 2;
      break;
    }
    default: range_ = exact; break;  // no reduction, min, max
  }
  range_ = std::clamp<int64_t>(range_, 0, cap);
}

int64_t Pattern::value(int q, size_t j) const {
  uint64_t h = mix(seed_ ^ mix((static_cast<uint64_t>(q) << 40) ^ j));
  if (collReduces(coll_) && op_ == hcProd) return q < prod_ranks_ ? 1 + static_cast<int64_t>(h & 1) : 1;
  int64_t v = static_cast<int64_t>(h % static_cast<uint64_t>(range_ + 1));
  if (collReduces(coll_) && op_ == hcAvg) v *= nranks_;
  return v;
}

int64_t Pattern::expected(size_t j) const {
  switch (coll_) {
    case Coll::AllGather: return value(block_ ? static_cast<int>(j / block_) : 0, j);
    case Coll::Broadcast: return value(root_, j);
    case Coll::SendRecv:
      return value(sendRecvPeer(root_, nranks_), j);  // root_ receives it
    // Receiver root_ gets block j / block_ from that rank: its elements sent to root_.
    case Coll::AllToAll: return value(static_cast<int>(j / block_), static_cast<size_t>(root_) * block_ + j % block_);
    default: break;
  }
  int64_t acc = value(0, j);
  for (int q = 1; q < nranks_; ++q) {
    int64_t v = value(q, j);
    switch (op_) {
      case hcProd: acc *= v; break;
      case hcMax: acc = std::max(acc, v); break;
      case hcMin: acc = std::min(acc, v); break;
      default: acc += v; break;  // sum, avg, mulsum
    }
  }
  if (op_ == hcAvg) acc /= nranks_;
  if (op_ == kOpMulSum) acc *= 2;
  return acc;
}

void fillInput(const Pattern& p, int q, size_t first, size_t n, void* dst) {
  dispatch(p.type().dt, [&](auto enc) {
    using E = decltype(enc);
    auto* out = static_cast<typename E::Elem*>(dst);
    for (size_t k = 0; k < n; ++k) out[k] = E::enc(p.value(q, first + k));
    return 0;
  });
}

namespace {
template <class Want>
size_t countDiff(const Pattern& p, const void* got, size_t first, size_t n, Want want) {
  return dispatch(p.type().dt, [&](auto enc) {
    using E = decltype(enc);
    using T = typename E::Elem;
    const auto* g = static_cast<const unsigned char*>(got);
    size_t wrong = 0;
    for (size_t k = 0; k < n; ++k) {
      T w = E::enc(want(first + k));
      // Bitwise: an exact result has exactly this representation.
      if (std::memcmp(g + k * sizeof(T), &w, sizeof(T)) != 0) ++wrong;
    }
    return wrong;
  });
}
}  // namespace

size_t countWrongOutput(const Pattern& p, const void* got, size_t first, size_t n) {
  return countDiff(p, got, first, n, [&p](size_t j) { return p.expected(j); });
}

size_t countWrongInput(const Pattern& p, int q, const void* got, size_t first, size_t n) {
  return countDiff(p, got, first, n, [&p, q](size_t j) { return p.value(q, j); });
}

namespace {
// Element k of a float buffer of dtype dt, and half an ulp of dt relative to a value.
double loadFloat(hcDataType_t dt, const void* got, size_t k) {
  if (dt == hcFloat32) return static_cast<const float*>(got)[k];
  const uint16_t b = static_cast<const uint16_t*>(got)[k];
  if (dt == hcBfloat16) return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
  return static_cast<double>(std::bit_cast<_Float16>(b));
}
double halfUlp(hcDataType_t dt) {
  return dt == hcBfloat16 ? 0x1p-8 : dt == hcFloat16 ? 0x1p-11 : 0x1p-24;
}
}  // namespace

size_t countOutsideQuantBound(const Pattern& p, const void* got, size_t per_rank, int nranks, size_t block) {
  const hcDataType_t dt = p.type().dt;
  const double half_ulp = halfUlp(dt);
  auto load = [&](size_t k) { return loadFloat(dt, got, k); };
  size_t wrong = 0;
  for (size_t q = 0; q < static_cast<size_t>(nranks); ++q)
    for (size_t lo = 0; lo < per_rank; lo += block) {
      const size_t first = q * per_rank + lo, n = std::min(block, per_rank - lo);
      double absmax = 0;
      for (size_t k = 0; k < n; ++k) absmax = std::max(absmax, std::abs(static_cast<double>(p.expected(first + k))));
      for (size_t k = 0; k < n; ++k) {
        const double want = static_cast<double>(p.expected(first + k)), have = load(first + k);
        // Also catches NaN (the comparison is false).
        if (!(std::abs(have - want) <= absmax / 254 * (1 + 1e-6) + std::abs(have) * half_ulp)) ++wrong;
      }
    }
  return wrong;
}

size_t countOutsideQuantBoundRS(const Pattern& p, const void* got, size_t first, size_t n, int nranks) {
  const hcDataType_t dt = p.type().dt;
  const double half_ulp = halfUlp(dt);
  auto load = [&](size_t k) { return loadFloat(dt, got, k); };
  double absmax = 0;
  for (size_t k = 0; k < n; ++k)
    for (int q = 0; q < nranks; ++q) absmax = std::max(absmax, std::abs(static_cast<double>(p.value(q, first + k))));
  size_t wrong = 0;
  for (size_t k = 0; k < n; ++k) {
    const double want = static_cast<double>(p.expected(first + k)), have = load(k);
    const double tol = nranks * absmax / 254 * (1 + 1e-6) + (std::abs(want) + nranks * absmax) * 2 * half_ulp;
    if (!(std::abs(have - want) <= tol)) ++wrong;
  }
  return wrong;
}

GuardedBuffer::GuardedBuffer(size_t bytes, bool node_memory, size_t slack)
    : bytes_(bytes), slack_(slack), node_memory_(node_memory) {
  mapped_ = bytes + slack + 2 * kGuardBytes;
  void* p = nullptr;
  if (node_memory) {
    if (hcMemAlloc(&p, mapped_) != hcSuccess) throw std::runtime_error(hcGetLastError(nullptr));
  } else {
    p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("cannot map a buffer of " + std::to_string(mapped_) + " bytes (" + std::strerror(errno) +
                               "): the largest size (-e) asks for it");
  }
  base_ = static_cast<char*>(p);
  data_ = base_ + kGuardBytes;
  std::memset(base_, kGuard, mapped_);  // touch every page before timing
}

GuardedBuffer::~GuardedBuffer() {
  if (base_ && node_memory_) hcMemFree(base_);
  else if (base_) ::munmap(base_, mapped_);
}

void GuardedBuffer::shift(size_t by) {
  if (by > slack_) throw std::invalid_argument("GuardedBuffer: shift beyond the slack");
  shift_ = by;
}

void GuardedBuffer::poison(size_t n) const {
  char* d = data();
  std::memset(d - kGuardBytes, kGuard, kGuardBytes);
  std::memset(d, kPoison, n);
  std::memset(d + n, kGuard, kGuardBytes);
}

size_t GuardedBuffer::damagedGuards(size_t n, size_t ts) const {
  size_t bad = 0;
  const char* d = data();
  for (const char* g : {d - kGuardBytes, d + n}) {
    for (size_t off = 0; off < kGuardBytes; off += ts) {
      for (size_t b = 0; b < ts; ++b) {
        if (static_cast<unsigned char>(g[off + b]) != kGuard) {
          ++bad;
          break;
        }
      }
    }
  }
  return bad;
}

}  // namespace agbench
