#include "base/coll.h"

#include <fmt/format.h>

#include <cstring>

namespace hicoll {

const char* collName(hcColl_t c) {
  switch (c) {
    case hcCollAllGather: return "AllGather";
    case hcCollReduceScatter: return "ReduceScatter";
    case hcCollAllReduce: return "AllReduce";
    case hcCollBroadcast: return "Broadcast";
    case hcCollBarrier: return "Barrier";
    case hcCollAllToAll: return "AllToAll";
    default: return "?";
  }
}

const char* dtypeName(hcDataType_t t) {
  switch (t) {
    case hcInt8: return "int8";
    case hcUint8: return "uint8";
    case hcInt32: return "int32";
    case hcUint32: return "uint32";
    case hcInt64: return "int64";
    case hcUint64: return "uint64";
    case hcFloat16: return "float16";
    case hcFloat32: return "float32";
    case hcFloat64: return "float64";
    case hcBfloat16: return "bfloat16";
    default: return "?";
  }
}

bool isInteger(hcDataType_t t) {
  return t == hcInt8 || t == hcUint8 || t == hcInt32 || t == hcUint32 || t == hcInt64 || t == hcUint64;
}

const char* opName(OpKind k) {
  switch (k) {
    case OpKind::Sum: return "sum";
    case OpKind::Prod: return "prod";
    case OpKind::Max: return "max";
    case OpKind::Min: return "min";
    case OpKind::Avg: return "avg";
    case OpKind::PreMulSum: return "premulsum";
    case OpKind::Band: return "band";
    case OpKind::Bor: return "bor";
    case OpKind::Bxor: return "bxor";
  }
  return "?";
}

std::string describe(const CollArgs& a) {
  if (a.quant.block)
    return fmt::format("{}(int8, block {}) #{} of {} x {}", collName(a.coll), a.quant.block, a.call, a.quant.count,
                       dtypeName(a.quant.dtype));
  if (a.coll == hcCollAllToAll)
    return fmt::format("AllToAll #{} of {} ({} elements sent by this rank)", a.call, dtypeName(a.dtype), a.count);
  std::string s = fmt::format("{} #{} of {} x {}", collName(a.coll), a.call, a.count, dtypeName(a.dtype));
  if (a.coll == hcCollReduceScatter || a.coll == hcCollAllReduce) s += fmt::format(" ({})", opName(a.op.kind));
  if (a.coll == hcCollBroadcast) s += fmt::format(" (root {})", a.root);
  return s;
}

namespace {
uint64_t bitsOf(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
double doubleOf(uint64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}
bool reduces(hcColl_t c) {
  return c == hcCollReduceScatter || c == hcCollAllReduce;
}
}  // namespace

CallDesc CallDesc::of(const CollArgs& a, uint64_t flags) {
  CallDesc d;
  const bool op = reduces(a.coll), q = a.quant.block != 0;
  const hcDataType_t dtype = q ? a.quant.dtype : a.dtype;
  d.w[0] = (static_cast<uint64_t>(a.coll) & 0xff) | (static_cast<uint64_t>(dtype) & 0xff) << 8 |
           (op ? static_cast<uint64_t>(a.op.kind) & 0xff : 0) << 16 |
           ((flags | (a.destroy ? kDestroy : 0)) & 0xf) << 24 |
           (a.coll == hcCollBroadcast ? static_cast<uint64_t>(static_cast<uint32_t>(a.root))
                                      : static_cast<uint64_t>(a.quant.block & 0xffffffffu))
               << 32;
  d.w[1] = a.coll == hcCollAllToAll ? 0 : q ? a.quant.count : a.count;
  d.w[2] = op && a.op.kind == OpKind::PreMulSum ? bitsOf(a.op.scalar) : 0;
  d.w[3] = a.call;
  return d;
}

CollArgs CallDesc::args() const {
  CollArgs a;
  a.coll = static_cast<hcColl_t>(w[0] & 0xff);
  a.dtype = static_cast<hcDataType_t>((w[0] >> 8) & 0xff);
  a.op.kind = static_cast<OpKind>((w[0] >> 16) & 0xff);
  a.op.scalar = a.op.kind == OpKind::PreMulSum ? doubleOf(w[2]) : 1.0;
  const uint32_t high = static_cast<uint32_t>(w[0] >> 32);
  a.root = a.coll == hcCollBroadcast ? static_cast<int>(high) : 0;
  a.count = w[1];
  a.call = w[3];
  if (a.coll != hcCollBroadcast && high) a.quant = {high, a.dtype, a.count};
  return a;
}

// The phase kind sits in the flags byte's upper half (bits 28..31).
std::string describeCall(const CallDesc& d) {
  const CollArgs a = d.args();
  if (d.flags() & CallDesc::kDestroy) return fmt::format("hcCommDestroy (its barrier, call #{})", a.call);
  std::string what = collName(a.coll);
  if (reduces(a.coll)) {
    what += fmt::format("({}", a.op.kind <= OpKind::Bxor ? opName(a.op.kind) : "?");
    if (a.op.kind == OpKind::PreMulSum) what += fmt::format(" x {}", a.op.scalar);
    what += ")";
  }
  if (a.coll == hcCollBroadcast) what += fmt::format("(root {})", a.root);
  if (a.quant.block) what += fmt::format("(int8, block {})", a.quant.block);
  if (a.coll == hcCollAllToAll)
    return fmt::format("{} #{} of {}", what, a.call, a.dtype < hcNumTypes ? dtypeName(a.dtype) : "?");
  return fmt::format("{} #{} of {} x {}", what, a.call, a.count, a.dtype < hcNumTypes ? dtypeName(a.dtype) : "?");
}

std::string callDifference(const CallDesc& mine, const CallDesc& theirs) {
  const CollArgs a = mine.args(), b = theirs.args();
  std::string d;
  auto add = [&](const char* what) { d += d.empty() ? what : std::string(", ") + what; };
  if ((mine.flags() ^ theirs.flags()) & CallDesc::kDestroy) return "one rank destroys the communicator";
  if (a.call != b.call) add("the call number");
  if (a.coll != b.coll) add("the collective");
  if (a.dtype != b.dtype) add("the datatype");
  if (a.count != b.count) add("the count");
  if (a.coll == b.coll && reduces(a.coll) && (a.op.kind != b.op.kind)) add("the reduction op");
  if (a.coll == b.coll && reduces(a.coll) && a.op.kind == b.op.kind && mine.w[2] != theirs.w[2])
    add("the pre-multiplied sum's scalar");
  if (a.coll == b.coll && a.coll == hcCollBroadcast && a.root != b.root) add("the root");
  if (a.coll == b.coll && a.quant.block != b.quant.block)
    add(a.quant.block && b.quant.block ? "the quantization block" : "quantized or exact");
  return d.empty() ? "the call" : d;
}

std::string callMismatch(const std::string& peer, const CallDesc& theirs, int rank, const CallDesc& mine) {
  return fmt::format("{} called {} where rank {} called {} ({} differs)", peer, describeCall(theirs), rank,
                     describeCall(mine), callDifference(mine, theirs));
}

}  // namespace hicoll

extern "C" size_t hcTypeSize(hcDataType_t t) {
  return hicoll::typeSize(t);
}
