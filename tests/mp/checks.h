// Collective checks run inside one rank: every dtype and op, in place and out of place,
// against the references of tests/common/reference.h. Each returns the number of failures.
#pragma once

#include <cstddef>
#include <vector>

#include "hicoll/hicoll.h"

namespace hctest {

// The checks' buffers come from hcMemAlloc (node memory) instead of the heap.
void useNodeMemory(bool on);

int checkAllGather(hcComm_t comm, hcDataType_t t, size_t count, bool in_place, int salt);
int checkReduceScatter(hcComm_t comm, hcDataType_t t, hcRedOp_t op, size_t count, bool in_place, int salt);
int checkAllReduce(hcComm_t comm, hcDataType_t t, hcRedOp_t op, size_t count, bool in_place, int salt);
int checkBroadcast(hcComm_t comm, hcDataType_t t, size_t count, int root, bool in_place, int salt);
// hcBand / hcBor / hcBxor on every floating type fail with hcInvalidArgument naming the op
// and the datatype (hcReduceScatter and hcAllReduce; every rank calls it alike).
int checkBitwiseRefused(hcComm_t comm);
// The full matrix: every dtype x op x in-place x size (bitwise ops on integer types, and
// checkBitwiseRefused first).
int checkMatrix(hcComm_t comm, const std::vector<size_t>& sizes);

}  // namespace hctest
