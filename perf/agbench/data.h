// Data for the correctness check: small integers chosen so that every result is exact in
// every type (sums, products and averages included), computed independently on each rank.
#pragma once

#include <cstddef>
#include <cstdint>

#include "agbench.h"

namespace agbench {

// Rank q's input element at global index j is value(q, j). The global index is the position in
// the reduced vector (ReduceScatter/AllReduce) or in the gathered output (AllGather), so a
// block that lands in the wrong place is caught. AllToAll: j is the position in the sender's
// buffer, and root is the receiving rank (expected() is what it receives).
class Pattern {
 public:
  Pattern(Coll coll, const TypeDesc& type, int op, int nranks, int root, size_t block, uint64_t seed);

  int64_t value(int q, size_t j) const;
  // The correct output element at global index j.
  int64_t expected(size_t j) const;
  const TypeDesc& type() const { return type_; }

 private:
  Coll coll_;
  TypeDesc type_;
  int op_, nranks_, root_;
  size_t block_;  // AllGather: elements per rank
  uint64_t seed_;
  int64_t range_ = 0;   // values are 0..range_
  int prod_ranks_ = 0;  // prod: ranks that may contribute a factor 2
};

// dst[k] = value(q, first + k), k < n, in the pattern's type.
void fillInput(const Pattern& p, int q, size_t first, size_t n, void* dst);
// Elements k < n of got that differ (bitwise) from expected(first + k).
size_t countWrongOutput(const Pattern& p, const void* got, size_t first, size_t n);
// Elements k < n of got that differ from value(q, first + k) (an input left intact).
size_t countWrongInput(const Pattern& p, int q, const void* got, size_t first, size_t n);

// A quantized AllGather's output (hcAllGatherQuantized, int8 with one absmax per `block`
// elements of each rank's `per_rank` elements): elements k < nranks * per_rank further from
// expected(k) than the format's bound, absmax(block) / 254, plus the type's own rounding.
size_t countOutsideQuantBound(const Pattern& p, const void* got, size_t per_rank, int nranks, size_t block);

// A quantized ReduceScatter's output (hcReduceScatterQuantized): elements k < n (global index
// first + k) further from expected than nranks * max|input| / 254 (every partial that crossed
// a node is off by at most its absmax / 254, and a partial sums at most nranks inputs) plus
// the type's rounding.
size_t countOutsideQuantBoundRS(const Pattern& p, const void* got, size_t first, size_t n, int nranks);

// The value written over receive buffers before a checked call; no pattern value equals it.
constexpr unsigned char kPoison = 0xCD;
constexpr unsigned char kGuard = 0xA5;
constexpr size_t kGuardBytes = 4096;

// A page-aligned host buffer with guard pages' worth of bytes on both sides, so writes past
// either end are counted as wrong elements.
class GuardedBuffer {
 public:
  // node_memory: from hcMemAlloc (the node's ranks can map it) instead of private memory.
  // slack: bytes the data may be shifted by (shift()), beyond `bytes`.
  explicit GuardedBuffer(size_t bytes, bool node_memory = false, size_t slack = 0);
  ~GuardedBuffer();
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  char* data() const { return data_ + shift_; }
  size_t bytes() const { return bytes_; }
  // Moves data() `by` bytes (at most the slack) past the page-aligned start: nccl-tests' -u,
  // buffers that start at an element that is not the first of a cache line. The guards move
  // with it.
  void shift(size_t by);
  // Poisons the first n data bytes and guards the kGuardBytes before and after them.
  void poison(size_t n) const;
  // Elements of size ts in those guards that changed since poison(n).
  size_t damagedGuards(size_t n, size_t ts) const;

 private:
  char* base_ = nullptr;
  char* data_ = nullptr;
  size_t bytes_ = 0, mapped_ = 0, slack_ = 0, shift_ = 0;
  bool node_memory_ = false;
};

}  // namespace agbench
