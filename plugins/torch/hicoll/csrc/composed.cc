// Ops built from hicoll's calls, so the clients' occasional reduce / gather / scatter /
// all_gather_coalesced stay off gloo. Each costs more traffic than a dedicated algorithm
// (noted per op); the decision to run on hicoll depends only on what every rank shares (the
// op, the dtype, the device), so the ranks never split between hicoll and the fallback.
#include <c10/util/Exception.h>

#include "backend.hpp"
#include "tensor_ops.hpp"

namespace hicoll_torch {

using c10d::OpType;
using c10d::ReduceOp;

// reduce = AllReduce (ReduceScatter + AllGather: twice a reduce's traffic). Non-roots reduce a
// copy, so their tensor is left as it was, as NCCL does.
c10::intrusive_ptr<c10d::Work> HicollBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hicoll: reduce takes one tensor per process");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "hicoll: reduce root ", opts.rootRank,
              " outside a group of ", getSize());
  auto reason = declineReason("allreduce", tensors, &opts.reduceOp);
  const at::Tensor t = tensors[0];
  const bool root = opts.rootRank == getRank();
  const int size = getSize();
  auto run = [this, t, root, op = opts.reduceOp](hcStream_t s) {
    if (root) {
      throughContiguous(t, true, [&](const at::Tensor& c) { doAllReduce(c, op, s); });
    } else {
      doAllReduce(t.contiguous().clone(), op, s);
    }
  };
  auto fb = [tensors, opts, root, size](c10d::Backend& b) mutable -> WorkPtr {
    if (!needsSumEmulation(b, opts.reduceOp)) return b.reduce(tensors, opts);
    auto sum_opts = opts;
    sum_opts.reduceOp = ReduceOp(ReduceOp::SUM);
    auto w = b.reduce(tensors, sum_opts);
    w->wait();
    if (root) scaleAfterSum(tensors[0], opts.reduceOp, size);
    return w;
  };
  return submit(OpType::REDUCE, "reduce", tensors, opTimeout(opts.timeout), tensors, reason, run, fb);
}

// gather = AllGather into a scratch buffer (every rank receives the whole output, not only
// the root): fine for the small tensors DCP and the object collectives gather.
c10::intrusive_ptr<c10d::Work> HicollBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1, "hicoll: gather takes one input tensor per process");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "hicoll: gather root ", opts.rootRank,
              " outside a group of ", getSize());
  const at::Tensor input = inputs[0];
  const bool root = opts.rootRank == getRank();
  std::vector<at::Tensor> outs;
  if (root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "hicoll: gather: the root needs one list of ", getSize(), " output tensors");
    for (const auto& o : outputs[0]) {
      TORCH_CHECK(o.numel() == input.numel() && o.scalar_type() == input.scalar_type(),
                  "hicoll: gather: output tensors must match the input (", input.numel(), " x ", input.scalar_type(),
                  "), got ", o.numel(), " x ", o.scalar_type());
    }
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "hicoll: gather: only the root passes output tensors");
  }
  auto reason = declineReason("allgather", concat({input}, outs), nullptr);
  auto run = [this, input, outs](hcStream_t s) {
    const at::Tensor in = input.contiguous();
    at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
    doAllGather(in, flat, s);
    if (!outs.empty()) unflattenInto(flat, outs);
  };
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable { return b.gather(outputs, inputs, opts); };
  return submit(OpType::GATHER, "gather", outs, opTimeout(opts.timeout), {input}, reason, run, fb);
}

// scatter = Broadcast of the root's whole input (each rank receives all blocks and keeps its
// own): size x the traffic of a scatter, for the small objects DCP scatters.
c10::intrusive_ptr<c10d::Work> HicollBackend::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1, "hicoll: scatter takes one output tensor per process");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "hicoll: scatter root ", opts.rootRank,
              " outside a group of ", getSize());
  const at::Tensor output = outputs[0];
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> ins;
  if (root == getRank()) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "hicoll: scatter: the root needs one list of ", getSize(), " input tensors");
    for (const auto& t : inputs[0]) {
      TORCH_CHECK(t.numel() == output.numel() && t.scalar_type() == output.scalar_type(),
                  "hicoll: scatter: input tensors must match the output (", output.numel(), " x ", output.scalar_type(),
                  "), got ", t.numel(), " x ", t.scalar_type());
    }
    ins = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "hicoll: scatter: only the root passes input tensors");
  }
  auto reason = declineReason("broadcast", concat({output}, ins), nullptr);
  auto run = [this, output, ins, root](hcStream_t s) {
    const int64_t n = output.numel();
    at::Tensor flat = ins.empty()
                          ? at::empty({getSize() * n}, output.options().memory_format(at::MemoryFormat::Contiguous))
                          : flatCat(ins);
    doBroadcast(flat, root, s);
    output.copy_(flat.narrow(0, getRank() * n, n).view(output.sizes()));
  };
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable { return b.scatter(outputs, inputs, opts); };
  return submit(OpType::SCATTER, "scatter", {output}, opTimeout(opts.timeout), {output}, reason, run, fb);
}

// all_gather_coalesced = one AllGather of every input's bytes packed into one buffer (inputs
// may have different dtypes), unpacked into outputs[rank][i].
c10::intrusive_ptr<c10d::Work> HicollBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                  std::vector<at::Tensor>& inputs,
                                                                  const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == getSize(), "hicoll: allgather_coalesced: ", outputs.size(),
              " output lists for a group of ", getSize());
  std::vector<at::Tensor> outs;
  for (const auto& list : outputs) {
    TORCH_CHECK(list.size() == inputs.size(), "hicoll: allgather_coalesced: an output list has ", list.size(),
                " tensors for ", inputs.size(), " inputs");
    for (size_t i = 0; i < list.size(); ++i) {
      TORCH_CHECK(list[i].numel() == inputs[i].numel() && list[i].scalar_type() == inputs[i].scalar_type(),
                  "hicoll: allgather_coalesced: output ", i, " does not match input ", i);
    }
    outs.insert(outs.end(), list.begin(), list.end());
  }
  std::optional<std::string> reason;
  for (const auto& t : inputs) {
    if (!reason) reason = declineReason("allgather", {t}, nullptr);
  }
  if (!reason && !inputs.empty()) reason = declineReason("allgather", {inputs[0], outs[0]}, nullptr);
  auto run = [this, outputs, inputs](hcStream_t s) {
    if (inputs.empty()) return;
    std::vector<at::Tensor> bytes;
    for (const auto& t : inputs) bytes.push_back(t.contiguous().view({-1}).view(at::kByte));
    const at::Tensor in = at::cat(bytes);
    const int64_t block = in.numel();
    at::Tensor flat = at::empty({getSize() * block}, in.options());
    doAllGather(in, flat, s);
    for (int r = 0; r < getSize(); ++r) {
      int64_t off = r * block;
      for (const auto& o : outputs[r]) {
        const int64_t nb = o.numel() * o.element_size();
        throughContiguous(o, false,
                          [&](const at::Tensor& c) { c.view({-1}).view(at::kByte).copy_(flat.narrow(0, off, nb)); });
        off += nb;
      }
    }
  };
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable { return b.allgather_coalesced(outputs, inputs, opts); };
  return submit(OpType::ALLGATHER_COALESCED, "allgather_coalesced", outs, opTimeout(opts.timeout), inputs, reason, run,
                fb);
}

}  // namespace hicoll_torch
