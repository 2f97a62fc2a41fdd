// The collectives run by hicoll. Non-contiguous tensors go through a contiguous copy
// (throughContiguous); each op also says how to make the same call on the fallback.
#include <c10/util/Exception.h>

#include "backend.hpp"
#include "tensor_ops.hpp"

namespace hicoll_torch {

using c10d::OpType;
using c10d::ReduceOp;

c10::intrusive_ptr<c10d::Work> HicollBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "hicoll: all_gather_into_tensor: output and input dtypes differ");
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "hicoll: all_gather_into_tensor: output has ",
              output.numel(), " elements, expected world size x input = ", input.numel() * getSize());
  auto reason = declineReason("allgather", {input, output}, nullptr);
  auto run = [this, output, input](hcStream_t s) {
    throughContiguous(output, false, [&](const at::Tensor& out) { doAllGather(input.contiguous(), out, s); });
  };
  auto fb = [output, input, opts](c10d::Backend& b) mutable { return b._allgather_base(output, input, opts); };
  return submit(OpType::_ALLGATHER_BASE, "_allgather_base", {output}, opTimeout(opts.timeout), {input}, reason, run,
                fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::allgatherQuantized(at::Tensor& output, at::Tensor& input, int64_t block) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "hicoll: allgather_quantized: output and input dtypes differ");
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "hicoll: allgather_quantized: output has ", output.numel(),
              " elements, expected world size x input = ", input.numel() * getSize());
  TORCH_CHECK(input.device() == output.device(), "hicoll: allgather_quantized: input on ", input.device(),
              ", output on ", output.device());
  TORCH_CHECK(input.device().is_cpu() || input.device().is_cuda(),
              "hicoll: allgather_quantized: CPU or CUDA tensors, not ", input.device());
  const at::ScalarType t = input.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "hicoll: allgather_quantized: ", t,
              " cannot be quantized (float32, bfloat16 or float16)");
  TORCH_CHECK(block > 0, "hicoll: allgather_quantized: block must be positive, not ", block);
  const hcDataType_t dt = *reduceType(t);
  auto run = [this, output, input, dt, block](hcStream_t s) {
    throughContiguous(output, false, [&](const at::Tensor& out) {
      const at::Tensor in = input.contiguous();
      hcQuant q = HC_QUANT_INITIALIZER;
      q.block = static_cast<size_t>(block);
      check(hcAllGatherQuantized(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()), dt, &q, comm_, s),
            "allgather_quantized", s);
    });
  };
  // Where hicoll declines a CUDA call (a libhicoll without CUDA): NCCL's exact all-gather.
  auto fb = [output, input](c10d::Backend& b) mutable {
    return b._allgather_base(output, input, c10d::AllgatherOptions());
  };
  return submit(OpType::_ALLGATHER_BASE, "allgather_quantized", {output}, opTimeout(c10d::kUnsetTimeout), {input},
                std::nullopt, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::reducescatterQuantized(at::Tensor& output, at::Tensor& input,
                                                                     const ReduceOp& op, int64_t block) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "hicoll: reducescatter_quantized: output and input dtypes differ");
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "hicoll: reducescatter_quantized: input has ", input.numel(),
              " elements, expected world size x output = ", output.numel() * getSize());
  TORCH_CHECK(input.device() == output.device(), "hicoll: reducescatter_quantized: input on ", input.device(),
              ", output on ", output.device());
  TORCH_CHECK(input.device().is_cpu() || input.device().is_cuda(),
              "hicoll: reducescatter_quantized: CPU or CUDA tensors, not ", input.device());
  const at::ScalarType t = input.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "hicoll: reducescatter_quantized: ", t,
              " cannot be quantized (float32, bfloat16 or float16)");
  TORCH_CHECK(op.op_ == ReduceOp::SUM || op.op_ == ReduceOp::AVG || op.op_ == ReduceOp::PREMUL_SUM,
              "hicoll: reducescatter_quantized: only sum, avg and premul_sum have a quantized form");
  TORCH_CHECK(block > 0, "hicoll: reducescatter_quantized: block must be positive, not ", block);
  auto run = [this, output, input, op, block](hcStream_t s) {
    throughContiguous(output, false, [&](const at::Tensor& out) {
      const at::Tensor in = input.contiguous();
      hcQuant q = HC_QUANT_INITIALIZER;
      q.block = static_cast<size_t>(block);
      withRedOp(op, in.scalar_type(), [&](hcRedOp_t r, hcDataType_t dt) {
        check(hcReduceScatterQuantized(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), dt, r, &q,
                                       comm_, s),
              "reducescatter_quantized", s);
      });
    });
  };
  // Where hicoll declines a CUDA call (a libhicoll without CUDA): NCCL's exact reduce-scatter.
  auto fb = [output, input, op](c10d::Backend& b) mutable -> WorkPtr {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = op;
    if (!needsSumEmulation(b, op)) return b._reduce_scatter_base(output, input, opts);
    return emulatedReduceScatter(b, output, input, op, c10d::kUnsetTimeout);
  };
  return submit(OpType::_REDUCE_SCATTER_BASE, "reducescatter_quantized", {output}, opTimeout(c10d::kUnsetTimeout),
                {input}, std::nullopt, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                              std::vector<at::Tensor>& inputs,
                                                                              const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "hicoll: allgather_into_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  std::optional<std::string> reason;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(
        outputs[i].numel() == inputs[i].numel() * getSize() && outputs[i].scalar_type() == inputs[i].scalar_type(),
        "hicoll: allgather_into_tensor_coalesced: output ", i, " does not match input ", i);
    if (!reason) reason = declineReason("allgather", {inputs[i], outputs[i]}, nullptr);
  }
  auto run = [this, outputs, inputs](hcStream_t s) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      throughContiguous(outputs[i], false, [&](const at::Tensor& out) { doAllGather(inputs[i].contiguous(), out, s); });
    }
  };
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable {
    return b.allgather_into_tensor_coalesced(outputs, inputs, opts);
  };
  return submit(OpType::COALESCED, "allgather_into_tensor_coalesced", outputs, opTimeout(opts.timeout), inputs, reason,
                run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1,
              "hicoll: allgather takes one input tensor and one output list per process");
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == getSize(), "hicoll: allgather: ", outputs[0].size(),
              " output tensors for a group of ", getSize());
  const at::Tensor input = inputs[0];
  std::optional<std::string> reason;
  for (const auto& o : outputs[0]) {
    if (o.numel() != input.numel() || o.scalar_type() != input.scalar_type()) {
      reason = "output tensors of different sizes or dtypes";  // uneven all_gather: gloo/NCCL
    }
  }
  if (!reason) reason = declineReason("allgather", concat({input}, outputs[0]), nullptr);
  auto outs = outputs[0];
  auto run = [this, input, outs](hcStream_t s) {
    const at::Tensor in = input.contiguous();
    at::Tensor flat = at::empty({static_cast<int64_t>(outs.size()) * in.numel()}, in.options());
    doAllGather(in, flat, s);
    unflattenInto(flat, outs);
  };
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable { return b.allgather(outputs, inputs, opts); };
  return submit(OpType::ALLGATHER, "allgather", outs, opTimeout(opts.timeout), {input}, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "hicoll: reduce_scatter_tensor: output and input dtypes differ");
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "hicoll: reduce_scatter_tensor: input has ", input.numel(),
              " elements, expected world size x output = ", output.numel() * getSize());
  auto reason = declineReason("reducescatter", {input, output}, &opts.reduceOp);
  auto run = [this, output, input, op = opts.reduceOp](hcStream_t s) {
    throughContiguous(output, false, [&](const at::Tensor& out) { doReduceScatter(input.contiguous(), out, op, s); });
  };
  auto fb = [output, input, opts](c10d::Backend& b) mutable -> WorkPtr {
    if (!needsSumEmulation(b, opts.reduceOp)) return b._reduce_scatter_base(output, input, opts);
    return emulatedReduceScatter(b, output, input, opts.reduceOp, opts.timeout);
  };
  return submit(OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", {output}, opTimeout(opts.timeout), {input},
                reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                              std::vector<at::Tensor>& inputs,
                                                                              const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "hicoll: reduce_scatter_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  std::optional<std::string> reason;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(
        inputs[i].numel() == outputs[i].numel() * getSize() && outputs[i].scalar_type() == inputs[i].scalar_type(),
        "hicoll: reduce_scatter_tensor_coalesced: output ", i, " does not match input ", i);
    if (!reason) reason = declineReason("reducescatter", {inputs[i], outputs[i]}, &opts.reduceOp);
  }
  auto run = [this, outputs, inputs, op = opts.reduceOp](hcStream_t s) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      throughContiguous(outputs[i], false,
                        [&](const at::Tensor& out) { doReduceScatter(inputs[i].contiguous(), out, op, s); });
    }
  };
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable -> WorkPtr {
    if (!needsSumEmulation(b, opts.reduceOp)) {
      return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    }
    WorkPtr w;
    for (size_t i = 0; i < outputs.size(); ++i) {
      w = emulatedReduceScatter(b, outputs[i], inputs[i], opts.reduceOp, opts.timeout);
    }
    return w;
  };
  return submit(OpType::COALESCED, "reduce_scatter_tensor_coalesced", outputs, opTimeout(opts.timeout), inputs, reason,
                run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                             std::vector<std::vector<at::Tensor>>& inputs,
                                                             const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
              "hicoll: reduce_scatter takes one output tensor and one input list per process");
  TORCH_CHECK(static_cast<int>(inputs[0].size()) == getSize(), "hicoll: reduce_scatter: ", inputs[0].size(),
              " input tensors for a group of ", getSize());
  const at::Tensor output = outputs[0];
  std::optional<std::string> reason;
  for (const auto& t : inputs[0]) {
    if (t.numel() != output.numel() || t.scalar_type() != output.scalar_type()) {
      reason = "input tensors of different sizes or dtypes";
    }
  }
  if (!reason) reason = declineReason("reducescatter", concat({output}, inputs[0]), &opts.reduceOp);
  auto ins = inputs[0];
  auto run = [this, output, ins, op = opts.reduceOp](hcStream_t s) {
    throughContiguous(output, false, [&](const at::Tensor& out) { doReduceScatter(flatCat(ins), out, op, s); });
  };
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable -> WorkPtr {
    if (!needsSumEmulation(b, opts.reduceOp)) return b.reduce_scatter(outputs, inputs, opts);
    return emulatedReduceScatter(b, outputs[0], flatCat(inputs[0]), opts.reduceOp, opts.timeout);
  };
  return submit(OpType::REDUCE_SCATTER, "reduce_scatter", {output}, opTimeout(opts.timeout), {output}, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "hicoll: allreduce of no tensors");
  auto reason = declineReason("allreduce", tensors, &opts.reduceOp);
  const int size = getSize();
  auto run = [this, tensors, op = opts.reduceOp](hcStream_t s) {
    for (const auto& t : tensors) {
      throughContiguous(t, true, [&](const at::Tensor& c) { doAllReduce(c, op, s); });
    }
  };
  auto fb = [tensors, opts, size](c10d::Backend& b) mutable -> WorkPtr {
    if (!needsSumEmulation(b, opts.reduceOp)) return b.allreduce(tensors, opts);
    auto sum_opts = opts;
    sum_opts.reduceOp = ReduceOp(ReduceOp::SUM);
    auto w = b.allreduce(tensors, sum_opts);
    w->wait();
    for (auto& t : tensors) scaleAfterSum(t, opts.reduceOp, size);
    return w;
  };
  return submit(OpType::ALLREDUCE, "allreduce", tensors, opTimeout(opts.timeout), tensors, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                  const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "hicoll: allreduce_coalesced of no tensors");
  auto reason = declineReason("allreduce", tensors, &opts.reduceOp);  // also: one dtype
  const int size = getSize();
  auto run = [this, tensors, op = opts.reduceOp](hcStream_t s) {
    // One call on a flat buffer (one dtype, checked above), then copy back.
    const at::Tensor flat = flatCat(tensors);
    doAllReduce(flat, op, s);
    unflattenInto(flat, tensors);
  };
  auto fb = [tensors, opts, size](c10d::Backend& b) mutable -> WorkPtr {
    if (!needsSumEmulation(b, opts.reduceOp)) return b.allreduce_coalesced(tensors, opts);
    auto sum_opts = opts;
    sum_opts.reduceOp = ReduceOp(ReduceOp::SUM);
    auto w = b.allreduce_coalesced(tensors, sum_opts);
    w->wait();
    for (auto& t : tensors) scaleAfterSum(t, opts.reduceOp, size);
    return w;
  };
  return submit(OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors, opTimeout(opts.timeout), tensors, reason,
                run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hicoll: broadcast takes one tensor per process");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "hicoll: broadcast root ", opts.rootRank,
              " outside a group of ", getSize());
  auto reason = declineReason("broadcast", tensors, nullptr);
  const at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  auto run = [this, t, root](hcStream_t s) {
    throughContiguous(t, true, [&](const at::Tensor& c) { doBroadcast(c, root, s); });
  };
  auto fb = [tensors, opts](c10d::Backend& b) mutable { return b.broadcast(tensors, opts); };
  return submit(OpType::BROADCAST, "broadcast", tensors, opTimeout(opts.timeout), tensors, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::barrier(const c10d::BarrierOptions& opts) {
  // Runs after every call queued before it, so it also orders this rank's earlier work.
  std::optional<std::string> reason;
  if (forced_.count("all")) reason = "HICOLL_FORCE_FALLBACK names all";
  auto run = [this](hcStream_t) { check(hcBarrier(comm_), "barrier"); };
  auto fb = [opts](c10d::Backend& b) mutable { return b.barrier(opts); };
  return submit(OpType::BARRIER, "barrier", {}, opTimeout(opts.timeout), {}, reason, run, fb);
}

}  // namespace hicoll_torch
