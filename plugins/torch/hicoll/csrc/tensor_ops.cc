#include "tensor_ops.hpp"

#include <c10/util/Exception.h>

namespace hicoll_torch {

using c10d::ReduceOp;

std::optional<hcDataType_t> reduceType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return hcFloat32;
    case at::kDouble: return hcFloat64;
    case at::kHalf: return hcFloat16;
    case at::kBFloat16: return hcBfloat16;
    case at::kChar: return hcInt8;
    case at::kByte: return hcUint8;
    case at::kBool: return hcUint8;
    case at::kInt: return hcInt32;
    case at::kLong: return hcInt64;
    case at::kUInt32: return hcUint32;
    case at::kUInt64: return hcUint64;
    default: return std::nullopt;
  }
}

const char* redOpName(ReduceOp::RedOpType op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

double premulFactor(const ReduceOp& op) {
  // PREMUL_SUM always carries this supplement (torch.distributed._make_nccl_premul_sum).
  auto* sup = static_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(sup, "hicoll: PREMUL_SUM without a factor");
  return sup->tensor_factor.defined() ? sup->tensor_factor.item<double>() : sup->double_factor;
}

at::Tensor realView(const at::Tensor& t) {
  return t.is_complex() ? at::view_as_real(t) : t;
}

std::vector<at::Tensor> concat(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string deviceName(c10::DeviceType d) {
  return c10::DeviceTypeName(d, /*lower_case=*/true);
}

at::Tensor flatCat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> parts;
  parts.reserve(ts.size());
  for (const auto& t : ts) parts.push_back(t.reshape({-1}));
  return at::cat(parts);
}

void unflattenInto(const at::Tensor& flat, const std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (const auto& t : ts) {
    t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

bool needsSumEmulation(const c10d::Backend& b, const ReduceOp& op) {
  return b.getBackendName() == "gloo" && (op.op_ == ReduceOp::AVG || op.op_ == ReduceOp::PREMUL_SUM);
}

void scaleAfterSum(const at::Tensor& t, const ReduceOp& op, int size) {
  at::NoGradGuard no_grad;
  if (op.op_ == ReduceOp::AVG) {
    if (at::isFloatingType(t.scalar_type()) || t.is_complex()) {
      t.div_(size);
    } else {
      t.div_(size, "trunc");
    }
  } else {
    t.mul_(premulFactor(op));  // sum(f * x) == f * sum(x) up to rounding
  }
}

c10::intrusive_ptr<c10d::Work> emulatedReduceScatter(c10d::Backend& b, const at::Tensor& output,
                                                     const at::Tensor& flat_input, const ReduceOp& op,
                                                     std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> tmp{flat_input.reshape({-1}).clone()};
  c10d::AllreduceOptions ao;
  ao.reduceOp = ReduceOp(ReduceOp::SUM);
  ao.timeout = timeout;
  auto w = b.allreduce(tmp, ao);
  w->wait(timeout.count() > 0 ? timeout : ::kNoTimeout);
  const at::Tensor block = tmp[0].narrow(0, b.getRank() * output.numel(), output.numel());
  scaleAfterSum(block, op, b.getSize());
  at::NoGradGuard no_grad;
  output.copy_(block.view(output.sizes()));
  return w;
}

}  // namespace hicoll_torch
