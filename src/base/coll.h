// One collective call, validated and resolved (a pre-multiplied sum carries its scalar).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "hicoll/hicoll.h"

namespace hicoll {

// The wire value (CallDesc) is the enumerator's: new kinds go last.
enum class OpKind { Sum, Prod, Max, Min, Avg, PreMulSum, Band, Bor, Bxor };
// Bitwise and, or, xor: integer datatypes only.
inline bool isBitwise(OpKind k) {
  return k == OpKind::Band || k == OpKind::Bor || k == OpKind::Bxor;
}

// hcTypeSize, inline for the library's own calls (a few per collective): 0 for an invalid type.
inline size_t typeSize(hcDataType_t t) {
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

struct RedOp {
  OpKind kind = OpKind::Sum;
  double scalar = 1.0;  // PreMulSum: every input is multiplied by this first
  hcRedOp_t handle = hcSum;
};

// A quantized call (hcAllGatherQuantized): the user's datatype and count, kept while the call
// itself moves the packed images (dtype uint8, count = bytes per rank) so that descriptors and
// messages name what the user called.
struct QuantArgs {
  size_t block = 0;  // elements per scale; 0: not quantized
  hcDataType_t dtype = hcFloat32;
  size_t count = 0;
  bool packed = false;  // CollArgs::dtype / count describe the images (the call that moves them)
  bool exact = false;   // a quantized call run exactly (HICOLL_QUANT_MIN_NODES)
};

struct CollArgs {
  hcColl_t coll = hcCollAllGather;
  const void* send = nullptr;
  void* recv = nullptr;
  // Elements: the per-rank block for AllGather (sendcount) and ReduceScatter (recvcount),
  // the whole buffer for AllReduce and Broadcast.
  size_t count = 0;
  hcDataType_t dtype = hcFloat32;
  RedOp op;
  int root = 0;
  void* stream = nullptr;  // cudaStream_t; nullptr for host buffers
  uint64_t call = 0;       // call number on the communicator (1, 2, ...; counts calls that communicate)
  bool destroy = false;    // the barrier hcCommDestroy runs (named so in a disagreement)
  QuantArgs quant;
  // AllToAll: elements to and from each rank (nranks entries each) and where they lie
  // (displacements in elements; null: packed in rank order). count is then what this rank
  // sends in all, for messages only: it may differ between ranks, so no descriptor carries it.
  const size_t* send_counts = nullptr;
  const size_t* send_displs = nullptr;
  const size_t* recv_counts = nullptr;
  const size_t* recv_displs = nullptr;
};

// What every rank of a call must agree on, packed into four words (the node board carries it
// in each phase's post, the network in one small message per agreement peer). The in-place
// flag is not in it: in place on some ranks and not on others is a valid call.
struct CallDesc {
  static constexpr uint64_t kInvalid = 1;  // flags: the rank rejected its own arguments
  static constexpr uint64_t kDestroy = 2;  // flags: hcCommDestroy's barrier
  // w[0]: coll (bits 0-7), dtype (8-15), op (16-23), flags (24-27), phase (28-31), root of a
  // Broadcast or a quantized call's block (32-63); w[1]: count (0 for an AllToAll, whose
  // per-pair counts are checked pair by pair); w[2]: the pre-multiplied sum's
  // scalar (double bits); w[3]: the call number. A quantized call is described by the user's
  // dtype and count.
  uint64_t w[4] = {};

  static CallDesc of(const CollArgs& a, uint64_t flags = 0);
  CollArgs args() const;  // back to the fields it carries (buffers and stream empty)
  uint64_t flags() const { return (w[0] >> 24) & 0xf; }
  bool invalid() const { return flags() & kInvalid; }
  // The same call, ignoring the phase kind. (Inline, as withPhase: every board wait asks.)
  bool sameCall(const CallDesc& o) const {
    const uint64_t mask = ~(0xfull << 28);
    return (w[0] & mask) == (o.w[0] & mask) && w[1] == o.w[1] && w[2] == o.w[2] && w[3] == o.w[3];
  }
  CallDesc withPhase(int phase) const {
    CallDesc d = *this;
    d.w[0] = (d.w[0] & ~(0xfull << 28)) | (static_cast<uint64_t>(phase) & 0xf) << 28;
    return d;
  }
  CallDesc withFlags(uint64_t flags) const {  // of(a, flags) from of(a)
    CallDesc d = *this;
    d.w[0] |= (flags & 0xf) << 24;
    return d;
  }
};
static_assert(sizeof(CallDesc) == 32, "wire layout");

// "AllReduce(max) #5 of 100 x float32", "Broadcast(root 1) #2 of 8 x uint8".
std::string describeCall(const CallDesc& d);
// What differs, for messages: "the reduction op", "the count", ...
std::string callDifference(const CallDesc& mine, const CallDesc& theirs);
// The one message of a disagreement: "rank 2 (node 'b') called A where rank 0 called B (the
// count differs)". peer: the other rank as named in messages (hcComm::who).
std::string callMismatch(const std::string& peer, const CallDesc& theirs, int rank, const CallDesc& mine);

const char* collName(hcColl_t c);
const char* dtypeName(hcDataType_t t);
bool isInteger(hcDataType_t t);  // int8 .. uint64 (what the bitwise ops take)
const char* opName(OpKind k);
std::string describe(const CollArgs& a);  // "AllGather #12 of 4096 x float32"

}  // namespace hicoll
