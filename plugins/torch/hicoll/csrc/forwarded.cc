// Ops hicoll has no call for: forwarded to the fallback, announced and counted. alltoall and
// send/recv would need point-to-point calls in the C API (hcSend / hcRecv, or hcAllToAllv).
#include <numeric>

#include <c10/util/Exception.h>

#include "backend.hpp"
#include "tensor_ops.hpp"

namespace hicoll_torch {

using c10d::OpType;

c10::intrusive_ptr<c10d::Work> HicollBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  auto fb = [tensors, opts](c10d::Backend& b) mutable { return b.allreduce_sparse(tensors, opts); };
  return forward(OpType::_ALLREDUCE_SPARSE, "allreduce_sparse", tensors, tensors,
                 opTimeout(opts.timeout), false, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                            std::vector<int64_t>& output_splits,
                                                            std::vector<int64_t>& input_splits,
                                                            const c10d::AllToAllOptions& opts) {
  auto fb = [output, input, output_splits, input_splits, opts](c10d::Backend& b) mutable {
    return b.alltoall_base(output, input, output_splits, input_splits, opts);
  };
  return forward(OpType::ALLTOALL_BASE, "alltoall_base", {input}, {output},
                 opTimeout(opts.timeout), false, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable -> WorkPtr {
    if (b.getBackendName() != "gloo") return b.alltoall(outputs, inputs, opts);
    // Gloo has only alltoall_base: pack, exchange, unpack (equal or uneven splits).
    std::vector<int64_t> in_splits, out_splits;
    std::vector<at::Tensor> in_parts;
    for (auto& t : inputs) {
      in_splits.push_back(t.numel());
      in_parts.push_back(t.reshape({-1}));
    }
    for (auto& t : outputs) out_splits.push_back(t.numel());
    at::Tensor in = at::cat(in_parts);
    at::Tensor out = at::empty({std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0})},
                               in.options());
    auto w = b.alltoall_base(out, in, out_splits, in_splits, opts);
    w->wait();
    int64_t off = 0;
    for (auto& t : outputs) {
      t.copy_(out.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
    return w;
  };
  return forward(OpType::ALLTOALL, "alltoall", inputs, outputs, opTimeout(opts.timeout), false, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                   int tag) {
  auto fb = [tensors, dst, tag](c10d::Backend& b) mutable { return b.send(tensors, dst, tag); };
  return forward(OpType::SEND, "send", tensors, {}, cfg_.timeout, true, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                   int tag) {
  auto fb = [tensors, src, tag](c10d::Backend& b) mutable { return b.recv(tensors, src, tag); };
  return forward(OpType::RECV, "recv", tensors, tensors, cfg_.timeout, true, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                            int tag) {
  auto fb = [tensors, tag](c10d::Backend& b) mutable { return b.recvAnysource(tensors, tag); };
  return forward(OpType::RECVANYSOURCE, "recvAnysource", tensors, tensors, cfg_.timeout, true, fb);
}

void HicollBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  countFallback("monitoredBarrier", c10::kCPU, "not implemented by hicoll");
  fallbackBackend(c10::kCPU)->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace hicoll_torch
