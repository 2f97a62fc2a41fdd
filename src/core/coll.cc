#include "core/coll.h"

#include <fmt/format.h>

namespace hicoll {

const char* collName(hcColl_t c) {
  switch (c) {
    case hcCollAllGather: return "AllGather";
    case hcCollReduceScatter: return "ReduceScatter";
    case hcCollAllReduce: return "AllReduce";
    case hcCollBroadcast: return "Broadcast";
    case hcCollBarrier: return "Barrier";
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

const char* opName(OpKind k) {
  switch (k) {
    case OpKind::Sum: return "sum";
    case OpKind::Prod: return "prod";
    case OpKind::Max: return "max";
    case OpKind::Min: return "min";
    case OpKind::Avg: return "avg";
    case OpKind::PreMulSum: return "premulsum";
  }
  return "?";
}

std::string describe(const CollArgs& a) {
  std::string s = fmt::format("{} #{} of {} x {}", collName(a.coll), a.seq, a.count, dtypeName(a.dtype));
  if (a.coll == hcCollReduceScatter || a.coll == hcCollAllReduce) s += fmt::format(" ({})", opName(a.op.kind));
  if (a.coll == hcCollBroadcast) s += fmt::format(" (root {})", a.root);
  return s;
}

}  // namespace hicoll

extern "C" size_t hcTypeSize(hcDataType_t t) {
  switch (t) {
    case hcInt8:
    case hcUint8: return 1;
    case hcFloat16:
    case hcBfloat16: return 2;
    case hcInt32:
    case hcUint32:
    case hcFloat32: return 4;
    case hcInt64:
    case hcUint64:
    case hcFloat64: return 8;
    default: return 0;
  }
}
