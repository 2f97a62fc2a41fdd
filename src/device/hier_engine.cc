// The device engine itself: construction (slot sizes, the proxy thread started), destruction
// (drain, stop, the stream run through) and enqueue (a collective onto the stream, its network
// steps to the proxy). The rooms: hier_plan.cc, hier_schedules.cc, hier_proxy.cc.
#include "device/hier_engine.h"

#include "base/deadline.h"
#include "base/error.h"
#include "base/log.h"

namespace hicoll::dev {
namespace {

// A buffer cut into parts fixed slots. The slot of a step never depends on the collective, so
// the slot of step s and the one of step s-1 never overlap whatever their chunk sizes.
size_t slotBytes(size_t total, size_t parts) {
  const size_t s = total / parts;
  return s >= 256 ? s - s % 256 : s - s % 8;
}

}  // namespace

HierEngine::HierEngine(Resources res, std::unique_ptr<DevStream> stream)
    : res_(std::move(res)), stream_(std::move(stream)) {
  const Topology& t = res_.topo;
  HC_CHECK(t.uniform && t.nranks > 0, hcInternalError, "device path: needs the same number of ranks on every node");
  W_ = t.nranks;
  N_ = t.nnodes;
  id_.rank = res_.rank;
  id_.nranks = W_;
  id_.topo = t;
  n_ = t.node_of[res_.rank];
  l_ = t.local_of[res_.rank];
  L_ = t.localSize(n_);
  HC_CHECK(static_cast<int>(res_.dsort.size()) == L_, hcInternalError,
           "device path: {} sort buffers for {} local ranks", res_.dsort.size(), L_);
  HC_CHECK(N_ == 1 || res_.net, hcInternalError, "device path: {} nodes but no network transport", N_);
  dslot_ = slotBytes(res_.dsort_bytes, kDepth);
  wslot_ = slotBytes(res_.dwork_bytes, kDepth + 1);
  hsslot_ = slotBytes(res_.hscratch_bytes, kDepth);
  hrslot_ = slotBytes(res_.hsort_bytes, kDepth);
  proxy_ = std::thread([this] { proxyMain(); });
}

HierEngine::~HierEngine() {
  if (!failed_) {
    try {
      drain();
    } catch (const std::exception& e) {
      HC_WARN("device path: at destruction: {}", e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (proxy_.joinable()) proxy_.join();
  if (!stream_->idle()) {
    // Failed or aborted with work in flight: let the stream run through, then free.
    releaseCounters();
    if (!waitUntil([&] { return stream_->idle(); }, Deadline(res_.timeout_ms)))
      HC_WARN("device path: the stream still has work {} ms after its counters were released", res_.timeout_ms);
  }
}

void HierEngine::enqueue(const CollArgs& a) {
  throwIfFailed();  // the caller decided (dev::decide, which asked unsupported()) that it runs here
  if (a.count == 0) return;
  const size_t e = typeSize(a.dtype);
  Job job;
  job.id = J_ + 1;
  job.what = describe(a);
  stream_->joinFrom(a.stream);  // if this throws, nothing of the collective is enqueued
  try {
    stream_->writeFlag(mine(Counter::Started), static_cast<uint32_t>(job.id));
    switch (a.coll) {
      case hcCollAllGather:
        if (quantizes(a)) emitQuantizedAllGather(a, job);
        else emitAllGather(static_cast<const char*>(a.send), static_cast<char*>(a.recv), a.count * e, e, job);
        break;
      case hcCollReduceScatter:
        emitReduceScatter(static_cast<const char*>(a.send), static_cast<char*>(a.recv), a.count * e, a, job);
        break;
      case hcCollBroadcast:
        emitBroadcast(static_cast<const char*>(a.send), static_cast<char*>(a.recv), a.count * e, a.root, job);
        break;
      case hcCollAllReduce: emitAllReduce(a, job); break;
      default: HC_THROW(hcInternalError, "device path: {}", describe(a));
    }
    stream_->writeFlag(mine(Counter::Finished), static_cast<uint32_t>(job.id));
    stream_->joinTo(a.stream);
  } catch (const Error& e) {
    // Half a collective is on the stream: this rank's counters no longer match its peers'.
    abort(e.code(), fmt::format("{}: could not enqueue: {}", job.what, e.what()));
    throw;
  }
  J_ = job.id;
  job.desc = CallDesc::of(a);
  publishDesc(job);
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

}  // namespace hicoll::dev
