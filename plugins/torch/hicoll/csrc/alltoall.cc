// all_to_all_single (alltoall_base) and all_to_all (alltoall) on hcAllToAllv: any dtype, as
// bytes; CPU tensors (hicoll's AllToAll runs on host buffers; CUDA ones go to NCCL).
#include <numeric>

#include <c10/util/Exception.h>

#include "backend.hpp"
#include "tensor_ops.hpp"

namespace hicoll_torch {

using c10d::OpType;

namespace {

// Bytes per rank of t split along dim 0 (splits empty: equal blocks), as all_to_all_single
// defines them.
std::vector<size_t> splitBytes(const at::Tensor& t, const std::vector<int64_t>& splits, int W, const char* side) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const size_t row_bytes = rows == 0 ? 0 : t.nbytes() / static_cast<size_t>(rows);
  std::vector<size_t> bytes(static_cast<size_t>(W));
  if (splits.empty()) {
    TORCH_CHECK(rows % W == 0, "hicoll: all_to_all_single: ", side, " has ", rows,
                " rows along dim 0, not a multiple of the group size ", W, " (give split sizes)");
    for (auto& b : bytes) b = static_cast<size_t>(rows / W) * row_bytes;
    return bytes;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == W, "hicoll: all_to_all_single: ", splits.size(), " ", side,
              " split sizes for a group of ", W);
  int64_t sum = 0;
  for (int p = 0; p < W; ++p) {
    TORCH_CHECK(splits[p] >= 0, "hicoll: all_to_all_single: ", side, " split size ", p, " is ", splits[p]);
    sum += splits[p];
    bytes[p] = static_cast<size_t>(splits[p]) * row_bytes;
  }
  TORCH_CHECK(sum == rows, "hicoll: all_to_all_single: ", side, " split sizes add up to ", sum, ", not its ", rows,
              " rows");
  return bytes;
}

std::optional<std::string> hostOnly(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts)
    if (!t.device().is_cpu())
      return c10::str("tensor on ", t.device(), ": hicoll's AllToAll runs on host buffers only");
  return std::nullopt;
}

}  // namespace

void HicollBackend::doAllToAll(const at::Tensor& in, const std::vector<size_t>& send_bytes, const at::Tensor& out,
                               const std::vector<size_t>& recv_bytes) {
  // Not in place: an input that shares the output's memory is copied first.
  const at::Tensor src = in.is_alias_of(out) ? in.clone() : in;
  check(hcAllToAllv(src.data_ptr(), send_bytes.data(), nullptr, out.data_ptr(), recv_bytes.data(), nullptr, hcUint8,
                    comm_, nullptr),
        "alltoall");
}

c10::intrusive_ptr<c10d::Work> HicollBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                            std::vector<int64_t>& output_splits,
                                                            std::vector<int64_t>& input_splits,
                                                            const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "hicoll: all_to_all_single: output and input dtypes differ");
  const std::vector<size_t> sb = splitBytes(input, input_splits, getSize(), "input");
  const std::vector<size_t> rb = splitBytes(output, output_splits, getSize(), "output");
  auto reason = declineReason("alltoall", {input, output}, nullptr);
  if (!reason) reason = hostOnly({input, output});
  auto run = [this, output, input, sb, rb](hcStream_t) {
    throughContiguous(output, false, [&](const at::Tensor& out) { doAllToAll(input.contiguous(), sb, out, rb); });
  };
  auto fb = [output, input, output_splits, input_splits, opts](c10d::Backend& b) mutable {
    return b.alltoall_base(output, input, output_splits, input_splits, opts);
  };
  return submit(OpType::ALLTOALL_BASE, "alltoall_base", {output}, opTimeout(opts.timeout), {input}, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  const int W = getSize();
  TORCH_CHECK(static_cast<int>(inputs.size()) == W && static_cast<int>(outputs.size()) == W,
              "hicoll: all_to_all: ", inputs.size(), " inputs and ", outputs.size(), " outputs for a group of ", W);
  auto reason = declineReason("alltoall", concat(inputs, outputs), nullptr);  // also: one dtype
  if (!reason) reason = hostOnly(concat(inputs, outputs));
  std::vector<size_t> sb, rb;
  for (const auto& t : inputs) sb.push_back(t.nbytes());
  for (const auto& t : outputs) rb.push_back(t.nbytes());
  auto run = [this, outputs, inputs, sb, rb](hcStream_t) {
    // Packed in rank order, exchanged once, unpacked.
    const at::Tensor in = flatCat(inputs);
    at::Tensor out = at::empty({static_cast<int64_t>(std::accumulate(rb.begin(), rb.end(), size_t{0}) /
                                                     std::max<size_t>(in.element_size(), 1))},
                               in.options());
    doAllToAll(in, sb, out, rb);
    unflattenInto(out, outputs);
  };
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
    at::Tensor out = at::empty({std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0})}, in.options());
    auto w = b.alltoall_base(out, in, out_splits, in_splits, opts);
    w->wait();
    int64_t off = 0;
    for (auto& t : outputs) {
      t.copy_(out.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
    return w;
  };
  return submit(OpType::ALLTOALL, "alltoall", outputs, opTimeout(opts.timeout), inputs, reason, run, fb);
}

}  // namespace hicoll_torch
