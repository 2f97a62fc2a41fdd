// Tensor-level helpers shared by the collectives: dtype and ReduceOp mapping, the one
// contiguous-copy rule, and the gloo emulation of AVG / PREMUL_SUM.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "hicoll/hicoll.h"

namespace hicoll_torch {

// Element type for reductions. Bool reduces as uint8 (SUM as MAX, PRODUCT as MIN, like NCCL).
std::optional<hcDataType_t> reduceType(at::ScalarType t);
const char* redOpName(c10d::ReduceOp::RedOpType op);
// The factor of a PREMUL_SUM (torch.distributed._make_nccl_premul_sum).
double premulFactor(const c10d::ReduceOp& op);
// Complex tensors reduce as their real and imaginary parts (only for SUM/AVG/PREMUL_SUM).
at::Tensor realView(const at::Tensor& t);
std::vector<at::Tensor> concat(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b);
std::string deviceName(c10::DeviceType d);
// Every tensor of the list flattened into one 1-D tensor (one dtype, checked by the caller).
at::Tensor flatCat(const std::vector<at::Tensor>& ts);
// Copies consecutive blocks of `flat` back into `ts` (the inverse of flatCat).
void unflattenInto(const at::Tensor& flat, const std::vector<at::Tensor>& ts);

// Runs fn on a contiguous tensor with t's contents (`t` itself when it is contiguous, else a
// copy: filled from t when `read`, empty otherwise) and writes the result back into t.
template <class F>
void throughContiguous(const at::Tensor& t, bool read, F&& fn) {
  const at::Tensor c =
      t.is_contiguous() ? t : (read ? t.contiguous() : at::empty_like(t, at::MemoryFormat::Contiguous));
  fn(c);
  if (!c.is_same(t)) t.copy_(c);
}

// Gloo has neither AVG nor PREMUL_SUM: run SUM on it and scale here (CPU fallback only).
bool needsSumEmulation(const c10d::Backend& b, const c10d::ReduceOp& op);
void scaleAfterSum(const at::Tensor& t, const c10d::ReduceOp& op, int size);
// Reduce-scatter on gloo as SUM allreduce of a copy, then this rank's block, scaled. (Gloo's
// own reduce-scatter writes its output after its Work completes, so it cannot be scaled.)
c10::intrusive_ptr<c10d::Work> emulatedReduceScatter(c10d::Backend& b, const at::Tensor& output,
                                                     const at::Tensor& flat_input, const c10d::ReduceOp& op,
                                                     std::chrono::milliseconds timeout);

}  // namespace hicoll_torch
