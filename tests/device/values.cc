#include "values.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "algorithms/quantize.h"
#include "base/numeric.h"
#include "device/dev_stream.h"

namespace hctest {

double testValue(hcDataType_t t, hicoll::OpKind op, int rank, size_t i) {
  const bool is_unsigned = t == hcUint8 || t == hcUint32 || t == hcUint64;
  const size_t k = static_cast<size_t>(rank) * 7 + i * 3;
  if (op == hicoll::OpKind::Prod) {  // |product| <= 2^W: fits int8 for W <= 6
    static const double s[] = {1, 2, -1, 1, 2};
    static const double u[] = {1, 2, 1};
    return is_unsigned ? u[k % 3] : s[k % 5];
  }
  if (is_unsigned) return static_cast<double>(k % 5);
  return static_cast<double>(k % 9) - 4;
}

void setElem(hcDataType_t t, void* base, size_t i, double v) {
  char* p = static_cast<char*>(base) + i * hcTypeSize(t);
  switch (t) {
    case hcInt8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case hcUint8: {
      uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case hcInt32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case hcUint32: {
      uint32_t x = static_cast<uint32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case hcInt64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case hcUint64: {
      uint64_t x = static_cast<uint64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case hcFloat16: {
      uint16_t x = hicoll::num::floatToHalf(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case hcBfloat16: {
      uint16_t x = hicoll::num::floatToBf16(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case hcFloat32: {
      float x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case hcFloat64: std::memcpy(p, &v, 8); break;
    default: break;
  }
}

double getElem(hcDataType_t t, const void* base, size_t i) {
  const char* p = static_cast<const char*>(base) + i * hcTypeSize(t);
  switch (t) {
    case hcInt8: {
      int8_t x;
      std::memcpy(&x, p, 1);
      return x;
    }
    case hcUint8: {
      uint8_t x;
      std::memcpy(&x, p, 1);
      return x;
    }
    case hcInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case hcUint32: {
      uint32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case hcInt64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case hcUint64: {
      uint64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case hcFloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return hicoll::num::halfToFloat(x);
    }
    case hcBfloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return hicoll::num::bf16ToFloat(x);
    }
    case hcFloat32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case hcFloat64: {
      double x;
      std::memcpy(&x, p, 8);
      return x;
    }
    default: return 0;
  }
}

std::string dtypeLabel(hcDataType_t t) {
  static const char* names[] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                                "uint64", "float16", "float32", "float64", "bfloat16"};
  return t >= 0 && t < hcNumTypes ? names[t] : "?";
}

double testScalar(hcDataType_t t) {
  return t == hcFloat16 || t == hcBfloat16 || t == hcFloat32 || t == hcFloat64 ? 0.5 : 2.0;
}

std::vector<char> testInput(hcColl_t coll, hcDataType_t t, hicoll::OpKind op, size_t count, int rank, int nranks) {
  const size_t n = coll == hcCollReduceScatter ? count * nranks : count;
  const hicoll::OpKind value_op = coll == hcCollAllGather || coll == hcCollBroadcast ? hicoll::OpKind::Sum : op;
  std::vector<char> v(n * hcTypeSize(t));
  for (size_t i = 0; i < n; ++i) setElem(t, v.data(), i, testValue(t, value_op, rank, i));
  return v;
}

std::vector<char> expectedOutput(hcColl_t coll, hcDataType_t t, hicoll::OpKind op, size_t count, int root, int rank,
                                 int W) {
  const size_t e = hcTypeSize(t);
  std::vector<char> want;
  if (coll == hcCollAllGather) {
    for (int r = 0; r < W; ++r) {
      std::vector<char> in = testInput(coll, t, op, count, r, W);
      want.insert(want.end(), in.begin(), in.end());
    }
    return want;
  }
  if (coll == hcCollBroadcast) return testInput(coll, t, op, count, root, W);
  std::vector<std::vector<char>> inputs;
  for (int k = 0; k < W; ++k) inputs.push_back(testInput(coll, t, op, count, k, W));
  hicoll::dev::ReduceJob j;
  j.dtype = t;
  switch (op) {
    case hicoll::OpKind::Prod: j.op = hicoll::num::Op::Prod; break;
    case hicoll::OpKind::Max: j.op = hicoll::num::Op::Max; break;
    case hicoll::OpKind::Min: j.op = hicoll::num::Op::Min; break;
    case hicoll::OpKind::Band: j.op = hicoll::num::Op::Band; break;
    case hicoll::OpKind::Bor: j.op = hicoll::num::Op::Bor; break;
    case hicoll::OpKind::Bxor: j.op = hicoll::num::Op::Bxor; break;
    default: j.op = hicoll::num::Op::Sum; break;
  }
  j.premul = op == hicoll::OpKind::PreMulSum;
  j.scalar = testScalar(t);
  j.divisor = op == hicoll::OpKind::Avg ? W : 0;
  j.nin = W;
  const size_t off = coll == hcCollReduceScatter ? static_cast<size_t>(rank) * count * e : 0;
  for (int k = 0; k < W; ++k) j.in[k] = inputs[k].data() + off;
  want.resize(count * e);
  j.out = want.data();
  j.n = count;
  hicoll::dev::hostReduce(j);
  return want;
}

std::string compareOutput(hcDataType_t t, const void* got, const std::vector<char>& want) {
  const size_t e = hcTypeSize(t);
  for (size_t i = 0; i < want.size() / e; ++i)
    if (std::memcmp(want.data() + i * e, static_cast<const char*>(got) + i * e, e) != 0)
      return "element " + std::to_string(i) + " is " + std::to_string(getElem(t, got, i)) + ", expected " +
             std::to_string(getElem(t, want.data(), i));
  return "";
}

std::vector<char> quantInput(hcDataType_t t, size_t count, size_t block, int rank) {
  const size_t e = hcTypeSize(t);
  std::vector<char> out(count * e);
  for (size_t i = 0; i < count; ++i) {
    const size_t b = i / block;
    float x = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(rank)) *
              std::ldexp(1.0f, static_cast<int>(b % 7) - 3);
    if (b == 1) x = 0.0f;
    if (rank % 2 == 1 && i == 2) x = std::numeric_limits<float>::quiet_NaN();
    if (rank % 2 == 1 && i == count - 1 && count > 3) x = -std::numeric_limits<float>::infinity();
    if (t == hcFloat32) {
      std::memcpy(out.data() + i * e, &x, e);
    } else {
      const uint16_t h = t == hcBfloat16 ? hicoll::num::floatToBf16(x) : hicoll::num::floatToHalf(x);
      std::memcpy(out.data() + i * e, &h, e);
    }
  }
  return out;
}

std::vector<char> quantExpected(hcDataType_t t, size_t count, size_t block, int nranks) {
  const size_t e = hcTypeSize(t);
  std::vector<char> out(static_cast<size_t>(nranks) * count * e), img(hicoll::quant::packedBytes(count, block));
  for (int j = 0; j < nranks; ++j) {
    const auto in = quantInput(t, count, block, j);
    hicoll::quant::quantize(in.data(), count, t, block, img.data());
    hicoll::quant::dequantize(img.data(), count, t, block, out.data() + static_cast<size_t>(j) * count * e);
  }
  return out;
}

}  // namespace hctest
