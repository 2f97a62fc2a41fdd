// Ops hicoll has no call for: forwarded to the fallback, announced and counted.
#include <c10/util/Exception.h>

#include "backend.hpp"
#include "tensor_ops.hpp"

namespace hicoll_torch {

using c10d::OpType;

c10::intrusive_ptr<c10d::Work> HicollBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  auto fb = [tensors, opts](c10d::Backend& b) mutable { return b.allreduce_sparse(tensors, opts); };
  return forward(OpType::_ALLREDUCE_SPARSE, "allreduce_sparse", tensors, tensors, opTimeout(opts.timeout), fb);
}

}  // namespace hicoll_torch
