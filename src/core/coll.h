// One collective call, validated and resolved (a pre-multiplied sum carries its scalar).
#pragma once

#include <cstddef>
#include <string>

#include "hicoll/hicoll.h"

namespace hicoll {

enum class OpKind { Sum, Prod, Max, Min, Avg, PreMulSum };

struct RedOp {
  OpKind kind = OpKind::Sum;
  double scalar = 1.0;  // PreMulSum: every input is multiplied by this first
  hcRedOp_t handle = hcSum;
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
  uint64_t seq = 0;        // collective sequence number on the communicator
};

const char* collName(hcColl_t c);
const char* dtypeName(hcDataType_t t);
const char* opName(OpKind k);
std::string describe(const CollArgs& a);  // "AllGather seq 12 of 4096 x float32"

}  // namespace hicoll
