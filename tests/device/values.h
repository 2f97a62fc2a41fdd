// Test values shared by the host engine tests and the GPU tests: small integers, so every sum,
// product and average of a handful of ranks is exact in every datatype (fp16 and bf16
// included) and any reduction order gives the same bits.
#pragma once

#include <string>
#include <vector>

#include "base/coll.h"
#include "hicoll/hicoll.h"

namespace hctest {

// The value of element i of rank's input for a collective with op (sum-like ops: -4..4, or
// 0..4 unsigned; products: 1, 2, -1).
double testValue(hcDataType_t t, hicoll::OpKind op, int rank, size_t i);
void setElem(hcDataType_t t, void* base, size_t i, double v);
double getElem(hcDataType_t t, const void* base, size_t i);
std::string dtypeLabel(hcDataType_t t);
// The scalar of the pre-multiplied sums in tests (exact in every datatype).
double testScalar(hcDataType_t t);
// The inputs of rank for a collective (what testValue gives, as bytes of t), and the output
// rank must receive: copies for AllGather / Broadcast, the host reference reduction
// (base/numeric.h arithmetic) for ReduceScatter / AllReduce.
std::vector<char> testInput(hcColl_t coll, hcDataType_t t, hicoll::OpKind op, size_t count, int rank, int nranks);
std::vector<char> expectedOutput(hcColl_t coll, hcDataType_t t, hicoll::OpKind op, size_t count, int root, int rank,
                                 int nranks);
// The quantized AllGather's tests (host engine and GPU): rank's block of count elements of a
// float type, a smooth signal whose scale changes per quantization block, a zero block and, on
// odd ranks, a NaN and an infinity; and what every rank must hold, the host quantizer's
// dequantize(quantize(.)) of every rank's block.
std::vector<char> quantInput(hcDataType_t t, size_t count, size_t block, int rank);
std::vector<char> quantExpected(hcDataType_t t, size_t count, size_t block, int nranks);

// "" when got (bytes) equals want, else the first differing element, decoded.
std::string compareOutput(hcDataType_t t, const void* got, const std::vector<char>& want);

}  // namespace hctest
