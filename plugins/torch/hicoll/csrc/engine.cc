// What hicoll accepts (declineReason) and the C calls the collectives are made of.
#include <c10/util/Exception.h>

#include "backend.hpp"
#include "tensor_ops.hpp"

namespace hicoll_torch {

using c10d::ReduceOp;

std::optional<std::string> HicollBackend::declineReason(const char* coll, const std::vector<at::Tensor>& ts,
                                                        const ReduceOp* op) const {
  if (forced_.count("all") || forced_.count(coll)) {
    return c10::str("HICOLL_FORCE_FALLBACK names ", forced_.count("all") ? "all" : coll);
  }
  for (const auto& t : ts) {
    if (t.layout() != at::kStrided) return c10::str("tensor layout ", t.layout(), " (not strided)");
#ifdef HICOLL_PLUGIN_CUDA
    if (t.device().type() != c10::kCPU && t.device().type() != c10::kCUDA) {
      return c10::str("tensor on ", t.device(), ": hicoll drives host and CUDA buffers only");
    }
#else
    if (t.device().type() != c10::kCPU) {
      return c10::str("tensor on ", t.device(),
                      ": this build of the hicoll plugin has no CUDA support (host buffers only)");
    }
#endif
    if (t.device() != ts.front().device()) {
      return c10::str("tensors on ", ts.front().device(), " and ", t.device());
    }
    if (t.scalar_type() != ts.front().scalar_type()) return std::string("mixed dtypes");
  }
  if (!op || ts.empty()) return std::nullopt;
  const auto st = ts.front().scalar_type();
  const auto rt = at::isComplexType(st) ? c10::toRealValueType(st) : st;
  if (!reduceType(rt)) return c10::str("no hicoll reduction for dtype ", st);
  switch (op->op_) {
    case ReduceOp::SUM: return std::nullopt;
    case ReduceOp::AVG:
      if (st == at::kBool) return std::string("AVG of bool tensors");
      return std::nullopt;
    case ReduceOp::PREMUL_SUM:
      if (!at::isFloatingType(rt)) return c10::str("PREMUL_SUM on dtype ", st);
      return std::nullopt;
    case ReduceOp::PRODUCT:
    case ReduceOp::MIN:
    case ReduceOp::MAX:
      if (at::isComplexType(st)) return c10::str(redOpName(op->op_), " of complex tensors");
      return std::nullopt;
    // Integer and bool tensors (bool as uint8 0/1: and, or, parity, as gloo). Floating ones
    // are not declined: gloo and NCCL raise for them, and so does hicoll (hcInvalidArgument
    // naming the op and the dtype, on every rank).
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR: return std::nullopt;
    default: return c10::str("ReduceOp ", redOpName(op->op_), " is not a hicoll reduction");
  }
}

void HicollBackend::check(hcResult_t res, const char* what, hcStream_t stream) {
  if (res == hcSuccess) return;
  std::string msg = c10::str("hicoll: ", what, " failed on rank ", getRank(), " of ", getSize(), " (group '",
                             cfg_.group_name, "'): ", hcGetErrorString(res), ": ", hcGetLastError(comm_));
  if (res == hcUnsupported || (stream && res == hcInvalidUsage)) throw Declined{msg};
  if (res == hcRemoteError || res == hcTimeout) {
    std::lock_guard<std::mutex> lock(q_mu_);
    broken_ = msg;
    error_ = res == hcTimeout ? c10d::ErrorType::TIMEOUT : c10d::ErrorType::REMOTE_ERROR;
  }
  C10_THROW_ERROR(DistBackendError, msg);
}

void HicollBackend::withRedOp(const ReduceOp& op, at::ScalarType st,
                              const std::function<void(hcRedOp_t, hcDataType_t)>& fn) {
  const auto rt = at::isComplexType(st) ? c10::toRealValueType(st) : st;
  const hcDataType_t dt = *reduceType(rt);
  const bool is_bool = st == at::kBool;
  switch (op.op_) {
    case ReduceOp::SUM: return fn(is_bool ? hcMax : hcSum, dt);
    case ReduceOp::AVG: return fn(hcAvg, dt);
    case ReduceOp::PRODUCT: return fn(is_bool ? hcMin : hcProd, dt);
    case ReduceOp::MIN: return fn(hcMin, dt);
    case ReduceOp::MAX: return fn(hcMax, dt);
    case ReduceOp::BAND: return fn(hcBand, dt);
    case ReduceOp::BOR: return fn(hcBor, dt);
    case ReduceOp::BXOR: return fn(hcBxor, dt);
    case ReduceOp::PREMUL_SUM: {
      // The scalar is passed in the element type (fp16/bf16 factors are rounded like the data).
      const at::Tensor scalar = at::scalar_tensor(premulFactor(op), at::TensorOptions().dtype(rt));
      hcRedOp_t r{};
      check(hcRedOpCreatePreMulSum(&r, scalar.data_ptr(), dt, comm_), "hcRedOpCreatePreMulSum");
      try {
        fn(r, dt);
      } catch (...) {
        hcRedOpDestroy(r, comm_);
        throw;
      }
      hcRedOpDestroy(r, comm_);
      return;
    }
    default: throw Declined{c10::str("ReduceOp ", redOpName(op.op_))};
  }
}

void HicollBackend::doAllGather(const at::Tensor& in, const at::Tensor& out, hcStream_t s) {
  // Bytes are bytes: any dtype (float8, complex, bool...) gathers as uint8.
  check(hcAllGather(in.data_ptr(), out.data_ptr(), in.nbytes(), hcUint8, comm_, s), "allgather", s);
}

void HicollBackend::doReduceScatter(const at::Tensor& in, const at::Tensor& out, const ReduceOp& op, hcStream_t s) {
  const at::Tensor rin = realView(in), rout = realView(out);
  withRedOp(op, in.scalar_type(), [&](hcRedOp_t r, hcDataType_t dt) {
    check(hcReduceScatter(rin.data_ptr(), rout.data_ptr(), static_cast<size_t>(rout.numel()), dt, r, comm_, s),
          "reducescatter", s);
  });
}

void HicollBackend::doAllReduce(const at::Tensor& t, const ReduceOp& op, hcStream_t s) {
  const at::Tensor rt = realView(t);
  withRedOp(op, t.scalar_type(), [&](hcRedOp_t r, hcDataType_t dt) {
    check(hcAllReduce(rt.data_ptr(), rt.data_ptr(), static_cast<size_t>(rt.numel()), dt, r, comm_, s), "allreduce", s);
  });
}

void HicollBackend::doBroadcast(const at::Tensor& t, int root, hcStream_t s) {
  check(hcBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), hcUint8, root, comm_, s), "broadcast", s);
}

}  // namespace hicoll_torch
