// Point-to-point on hicoll (hcIsendTag / hcIrecvTag / hcIrecvAnyTag, c10d's tag as hicoll's):
// CPU tensors as bytes. The worker posts each in issue order and polls it to completion beside
// the queued calls, so the Works of isend / irecv complete independently (a pair that both send
// first does not deadlock). Negative tags and device tensors go to the fallback.
// monitoredBarrier is built on them.
#include <c10/util/Exception.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

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
  if (!reason && tag < 0) reason = c10::str("tag ", tag, " (hicoll's tags are >= 0)");
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
  HicollWork::Step post = [this, request, buf, bytes, send, peer, tag, op]() -> WorkPtr {
    hcResult_t res;
    if (send) {
      res = hcIsendTag(buf.data_ptr(), bytes, hcUint8, peer, tag, comm_, &request->req);
    } else if (peer < 0) {
      res = hcIrecvAnyTag(buf.data_ptr(), bytes, hcUint8, tag, comm_, &request->req);
    } else {
      res = hcIrecvTag(buf.data_ptr(), bytes, hcUint8, peer, tag, comm_, &request->req);
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

// gloo's algorithm on hicoll's point-to-point calls: every rank sends rank 0 a byte and waits
// for its answer; rank 0 waits up to the timeout for all of them (wait_all_ranks) or for each
// in rank order, and names the ranks that did not arrive. A late rank would leave a stale
// message between its pair, so a failed monitored barrier revokes the communicator.
void HicollBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const auto timeout = opTimeout(opts.timeout);
  if (forced_.count("all")) {
    countFallback("monitoredBarrier", c10::kCPU, "HICOLL_FORCE_FALLBACK names all");
    fallbackBackend(c10::kCPU)->monitoredBarrier(opts, wait_all_ranks);
    return;
  }
  auto run = [this, timeout, wait_all_ranks](hcStream_t) {
    const int n = getSize(), me = getRank();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<uint8_t> bytes(static_cast<size_t>(n), 1);
    // Polls reqs (null: done) until all are done or the deadline; returns the peers left.
    auto waitFor = [&](std::vector<hcRequest_t>& reqs, bool all) {
      std::vector<int> late;
      for (;;) {
        bool pending = false;
        for (int r = 0; r < n; ++r) {
          if (!reqs[r]) continue;
          int done = 0;
          const hcResult_t res = hcTest(reqs[r], &done);
          if (res != hcSuccess || done) {
            hcWait(reqs[r]);
            reqs[r] = nullptr;
            check(res, "monitoredBarrier");
          } else {
            pending = true;
            if (!all) break;  // rank order: the first missing one is the one named
          }
        }
        if (!pending) return late;
        if (std::chrono::steady_clock::now() > deadline) {
          for (int r = 0; r < n; ++r) {
            if (reqs[r]) late.push_back(r);
          }
          if (!all) late.resize(1);
          return late;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    };
    auto fail = [&](std::vector<hcRequest_t>& reqs, const std::string& why) {
      hcCommRevoke(comm_);
      for (auto& q : reqs) {
        if (q) hcWait(q);  // fails at once now: frees it
      }
      {
        std::lock_guard<std::mutex> lock(q_mu_);
        broken_ = why;
      }
      C10_THROW_ERROR(DistBackendError, why);
    };
    std::vector<hcRequest_t> reqs(static_cast<size_t>(n), nullptr);
    if (me == 0) {
      for (int r = 1; r < n; ++r) check(hcIrecv(&bytes[r], 1, hcUint8, r, comm_, &reqs[r]), "monitoredBarrier");
      const std::vector<int> late = waitFor(reqs, wait_all_ranks);
      if (!late.empty()) {
        std::string names;
        for (int r : late) names += c10::str(names.empty() ? "" : ", ", r);
        fail(reqs, c10::str("hicoll: rank 0 of group '", cfg_.group_name, "': rank", late.size() > 1 ? "s " : " ",
                            names, " failed to pass monitoredBarrier in ", timeout.count(), " ms"));
      }
      for (int r = 1; r < n; ++r) check(hcIsend(&bytes[r], 1, hcUint8, r, comm_, &reqs[r]), "monitoredBarrier");
    } else {
      check(hcIsend(&bytes[0], 1, hcUint8, 0, comm_, &reqs[0]), "monitoredBarrier");
      if (!waitFor(reqs, true).empty()) {
        fail(reqs, c10::str("hicoll: rank ", me, " of group '", cfg_.group_name, "': rank 0 did not take its ",
                            "monitoredBarrier message in ", timeout.count(), " ms"));
      }
      check(hcIrecv(&bytes[0], 1, hcUint8, 0, comm_, &reqs[0]), "monitoredBarrier");
    }
    if (!waitFor(reqs, true).empty()) {
      fail(reqs, c10::str("hicoll: rank ", me, " of group '", cfg_.group_name, "': monitoredBarrier's answer did ",
                          "not complete in ", timeout.count(), " ms"));
    }
  };
  auto fb = [opts, wait_all_ranks](c10d::Backend& b) mutable {
    b.monitoredBarrier(opts, wait_all_ranks);
    return WorkPtr();
  };
  // Bounded by its own deadline; the Work's wait allows it that and a margin.
  submit(OpType::BARRIER, "monitoredBarrier", {}, timeout + std::chrono::seconds(5), {}, std::nullopt, run, fb)->wait();
}

}  // namespace hicoll_torch
