// Ops hicoll has no call for: forwarded to the fallback, announced and counted. send/recv
// would need point-to-point calls in the C API (hcSend / hcRecv).
#include <c10/util/Exception.h>

#include "backend.hpp"
#include "tensor_ops.hpp"

namespace hicoll_torch {

using c10d::OpType;

c10::intrusive_ptr<c10d::Work> HicollBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  auto fb = [tensors, opts](c10d::Backend& b) mutable { return b.allreduce_sparse(tensors, opts); };
  return forward(OpType::_ALLREDUCE_SPARSE, "allreduce_sparse", tensors, tensors, opTimeout(opts.timeout), false, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  auto fb = [tensors, dst, tag](c10d::Backend& b) mutable { return b.send(tensors, dst, tag); };
  return forward(OpType::SEND, "send", tensors, {}, cfg_.timeout, true, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  auto fb = [tensors, src, tag](c10d::Backend& b) mutable { return b.recv(tensors, src, tag); };
  return forward(OpType::RECV, "recv", tensors, tensors, cfg_.timeout, true, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  auto fb = [tensors, tag](c10d::Backend& b) mutable { return b.recvAnysource(tensors, tag); };
  return forward(OpType::RECVANYSOURCE, "recvAnysource", tensors, tensors, cfg_.timeout, true, fb);
}

void HicollBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  countFallback("monitoredBarrier", c10::kCPU, "not implemented by hicoll");
  fallbackBackend(c10::kCPU)->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace hicoll_torch
