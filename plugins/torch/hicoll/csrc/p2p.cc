// Point-to-point on hicoll (hcIsend / hcIrecv / hcIrecvAny): CPU tensors as bytes. The worker
// posts each in issue order and polls it to completion beside the queued calls, so the Works
// of isend / irecv complete independently (a pair that both send first does not deadlock).
// Tags other than 0 and device tensors go to the fallback.
#include <c10/util/Exception.h>

#include <memory>

#include "backend.hpp"
#include "tensor_ops.hpp"

namespace hicoll_torch {

using c10d::OpType;

namespace {

// The request of one operation, freed by hcWait once it is complete or failed.
struct Request {
  hcRequest_t req = nullptr;
  ~Request() {
    if (req) hcWait(req);
  }
};

}  // namespace

HicollBackend::WorkPtr HicollBackend::pointToPoint(c10d::OpType type, const char* op, std::vector<at::Tensor>& tensors,
                                                   int peer, int tag, FallbackCall fb) {
  TORCH_CHECK(tensors.size() == 1, "hicoll ", op, ": one tensor per call, got ", tensors.size());
  const at::Tensor t = tensors.front();
  auto reason = declineReason(op, tensors, nullptr);
  if (!reason && tag != 0) {
    reason = c10::str("tag ", tag, " (hicoll matches a pair's messages in posting order, without tags)");
  }
  const auto device = t.device().type();
  if (!reason && device != c10::kCPU) reason = std::string("point-to-point on device tensors runs on the fallback");
  seq_++;
  if (reason) {
    // On the caller's thread, as gloo's own non-blocking pairs expect.
    countFallback(op, device, *reason);
    return fb(*fallbackBackend(device));
  }
  countHicoll(op);
  const bool send = type == OpType::SEND;
  // A receive into a non-contiguous tensor lands in a contiguous one and is copied after.
  const at::Tensor buf =
      t.is_contiguous() ? t : (send ? t.contiguous() : at::empty_like(t, at::MemoryFormat::Contiguous));
  const size_t bytes = static_cast<size_t>(buf.numel()) * buf.element_size();
  auto request = std::make_shared<Request>();
  HicollWork::Step post = [this, request, buf, bytes, send, peer, op]() -> WorkPtr {
    hcResult_t res;
    if (send) {
      res = hcIsend(buf.data_ptr(), bytes, hcUint8, peer, comm_, &request->req);
    } else if (peer < 0) {
      res = hcIrecvAny(buf.data_ptr(), bytes, hcUint8, comm_, &request->req);
    } else {
      res = hcIrecv(buf.data_ptr(), bytes, hcUint8, peer, comm_, &request->req);
    }
    check(res, op);
    return WorkPtr();
  };
  auto work = c10::make_intrusive<HicollWork>(getRank(), type, send ? std::vector<at::Tensor>{} : tensors, cfg_.timeout,
                                              seq_.load(), std::move(post), [] { return WorkPtr(); });
  work->setPoll([this, request, t, buf, op](int* source) {
    int done = 0;
    const hcResult_t res = hcTest(request->req, &done);
    if (res != hcSuccess) {
      hcWait(request->req);  // frees it, with the same error as the communicator's last
      request->req = nullptr;
      check(res, op);  // throws, naming the call (a remote error or a timeout breaks the group)
    }
    if (!done) return false;
    hcRequestSource(request->req, source);
    hcWait(request->req);
    request->req = nullptr;
    if (!buf.is_same(t)) t.copy_(buf);
    return true;
  });
  enqueue(work);
  return work;
}

c10::intrusive_ptr<c10d::Work> HicollBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  auto fb = [tensors, dst, tag](c10d::Backend& b) mutable { return b.send(tensors, dst, tag); };
  return pointToPoint(OpType::SEND, "send", tensors, dst, tag, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  auto fb = [tensors, src, tag](c10d::Backend& b) mutable { return b.recv(tensors, src, tag); };
  return pointToPoint(OpType::RECV, "recv", tensors, src, tag, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  auto fb = [tensors, tag](c10d::Backend& b) mutable { return b.recvAnysource(tensors, tag); };
  return pointToPoint(OpType::RECVANYSOURCE, "recvAnysource", tensors, -1, tag, fb);
}

}  // namespace hicoll_torch
