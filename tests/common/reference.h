// Test data and independently computed expected results (no hicoll code is used here).
// Inputs are small integers, so sums and products are exact in every type and every order;
// only Avg (a division) and the 16-bit float types are compared with a tolerance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hicoll/hicoll.h"

namespace hctest {

extern const hcDataType_t kAllTypes[10];
extern const hcRedOp_t kBuiltinOps[8];
const char* typeName(hcDataType_t t);
const char* opName(hcRedOp_t op);  // builtin ops; "premulsum" for others
bool isFloat(hcDataType_t t);
bool isBitwise(int op);  // hcBand, hcBor, hcBxor: integer types only

// The value rank r contributes at element i (salt varies it between calls). For the bitwise
// ops: mixed bit patterns over the whole type (negative for signed types), mostly ones for
// hcBand and mostly zeros for hcBor, with 0 and all ones among them; within 52 bits, so
// doubles hold them exactly.
double inputValue(hcDataType_t t, hcRedOp_t op_kind, int rank, size_t i, int salt);
void store(void* buf, hcDataType_t t, size_t i, double v);
double load(const void* buf, hcDataType_t t, size_t i);
// The expected reduction of vals (one per rank, in rank order). op_kind is a builtin op or
// -1 for a pre-multiplied sum with scalar.
double expectedReduce(hcDataType_t t, int op_kind, const std::vector<double>& vals, double scalar);
bool matches(hcDataType_t t, double got, double want);
// Scalar for pre-multiplied sums: exact in every type.
double premulScalar(hcDataType_t t);

// Counts wrong elements, printing the first few with context.
struct Checker {
  std::string what;
  int rank;
  size_t wrong = 0;
  void check(hcDataType_t t, size_t i, double got, double want);
};

}  // namespace hctest
