#include "backend.hpp"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#ifdef HICOLL_PLUGIN_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace hicoll_torch {
namespace {

using c10d::OpType;
using c10d::ReduceOp;

int parseLogLevel() {
  const char* v = std::getenv("HICOLL_DEBUG");
  std::string s = v ? v : "";
  std::transform(s.begin(), s.end(), s.begin(), ::toupper);
  if (s == "NONE") return 0;
  if (s == "INFO") return 2;
  if (s == "TRACE") return 3;
  return 1;
}

// The same words libhicoll accepts (its config table); an unknown word is an error there too.
std::set<std::string> parseForced() {
  static const std::set<std::string> allowed = {"allgather", "reducescatter", "allreduce",
                                                "broadcast", "all"};
  std::set<std::string> out;
  const char* v = std::getenv("HICOLL_FORCE_FALLBACK");
  std::string s = v ? v : "", word;
  s.push_back(',');
  for (char c : s) {
    if (c == ',') {
      if (!word.empty()) {
        TORCH_CHECK(allowed.count(word), "HICOLL_FORCE_FALLBACK: unknown collective '", word,
                    "' (allowed: allgather|reducescatter|allreduce|broadcast|all)");
        out.insert(word);
      }
      word.clear();
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      word.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
  }
  return out;
}

// Element type for reductions. Bool reduces as uint8 (SUM as MAX, PRODUCT as MIN, like NCCL).
std::optional<hcDataType_t> reduceType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return hcFloat32;
    case at::kDouble: return hcFloat64;
    case at::kHalf: return hcFloat16;
    case at::kBFloat16: return hcBfloat16;
    case at::kChar: return hcInt8;
    case at::kByte: return hcUint8;
    case at::kBool: return hcUint8;
    case at::kInt: return hcInt32;
    case at::kLong: return hcInt64;
    case at::kUInt32: return hcUint32;
    case at::kUInt64: return hcUint64;
    default: return std::nullopt;
  }
}

const char* redOpName(ReduceOp::RedOpType op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

double premulFactor(const ReduceOp& op) {
  // PREMUL_SUM always carries this supplement (torch.distributed._make_nccl_premul_sum).
  auto* sup = static_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(sup, "hicoll: PREMUL_SUM without a factor");
  return sup->tensor_factor.defined() ? sup->tensor_factor.item<double>() : sup->double_factor;
}

// Complex tensors reduce as their real and imaginary parts (only for SUM/AVG/PREMUL_SUM).
at::Tensor realView(const at::Tensor& t) {
  return t.is_complex() ? at::view_as_real(t) : t;
}

std::vector<at::Tensor> concat(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string deviceName(c10::DeviceType d) { return c10::DeviceTypeName(d, /*lower_case=*/true); }

}  // namespace

// ---------------------------------------------------------------------------------------------
StoreBridge::StoreBridge(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  ops_.size = sizeof(hcStoreOps);
  ops_.ctx = this;
  ops_.set = &StoreBridge::set;
  ops_.get = &StoreBridge::get;
}

int StoreBridge::set(void* ctx, const char* key, const void* value, size_t len) {
  try {
    auto* p = static_cast<const uint8_t*>(value);
    static_cast<StoreBridge*>(ctx)->store_->set(key, std::vector<uint8_t>(p, p + len));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hicoll torch: store set '%s' failed: %s\n", key, e.what());
    return 1;
  }
}

int StoreBridge::get(void* ctx, const char* key, void* value, size_t len, int timeout_ms) {
  try {
    auto& store = static_cast<StoreBridge*>(ctx)->store_;
    store->wait({key}, std::chrono::milliseconds(std::max(timeout_ms, 1)));
    auto v = store->get(key);
    if (v.size() != len) {
      std::fprintf(stderr, "hicoll torch: store key '%s' has %zu bytes, expected %zu\n", key,
                   v.size(), len);
      return 2;
    }
    if (len) std::memcpy(value, v.data(), len);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hicoll torch: store get '%s' failed: %s\n", key, e.what());
    return 1;
  }
}

// ---------------------------------------------------------------------------------------------
HicollWork::HicollWork(int rank, c10d::OpType type, const char* title,
                       std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                       uint64_t seq, std::function<void()> run, std::function<void()> fallback)
    : Work(rank, type, title),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      seq_(seq),
      run_(std::move(run)),
      fallback_(std::move(fallback)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

bool HicollWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, limit, [&] { return completed_; })) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hicoll: rank ", rank_, " timed out after ", limit.count(),
                             " ms waiting for ", c10d::opTypeToString(opType_), " (seq ", seq_,
                             ")"));
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

void HicollWork::execute(bool declined_before_run) {
  std::exception_ptr err;
  try {
    if (declined_before_run || !run_) {
      fallback_();
    } else {
      run_();
    }
  } catch (...) {
    err = std::current_exception();
  }
  complete(err);
}

void HicollWork::complete(std::exception_ptr err) {
  finish(err);
  if (err) {
    future_->setError(err);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

// ---------------------------------------------------------------------------------------------
HicollBackend::HicollBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             Config cfg)
    : Backend(rank, size), store_(store), cfg_(std::move(cfg)) {
  log_level_ = parseLogLevel();
  forced_ = parseForced();
  bridge_ = std::make_unique<StoreBridge>(c10::make_intrusive<c10d::PrefixStore>("hicoll", store_));
  const hcResult_t res = hcCommInitRankStore(&comm_, size, rank, bridge_->ops(), "comm");
  if (res != hcSuccess) {
    comm_ = nullptr;
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hicoll: communicator creation failed on rank ", rank, " of ", size,
                             " (group '", cfg_.group_name, "'): ", hcGetErrorString(res), ": ",
                             hcGetLastError(nullptr)));
  }
  worker_ = std::thread([this] { workerLoop(); });
}

HicollBackend::~HicollBackend() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hicoll torch: shutdown failed: %s\n", e.what());
  }
}

void HicollBackend::stopWorker(bool drain) {
  std::deque<c10::intrusive_ptr<HicollWork>> dropped;
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    stopping_ = true;
    if (!drain) dropped.swap(queue_);
  }
  q_cv_.notify_all();
  idle_cv_.notify_all();
  for (auto& w : dropped) {
    w->complete(std::make_exception_ptr(c10::DistBackendError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, "hicoll: process group aborted")));
  }
  if (worker_.joinable()) worker_.join();  // an in-flight call ends within HICOLL_TIMEOUT_MS
}

void HicollBackend::shutdown() {
  stopWorker(/*drain=*/true);
  {
    std::lock_guard<std::mutex> lock(fb_mu_);
    for (auto& [dev, b] : fallbacks_) b->shutdown();
    fallbacks_.clear();
  }
  std::lock_guard<std::mutex> call(call_mu_);  // no device call in progress
  if (comm_) {
    hcCommDestroy(comm_);  // drains the device calls in flight
    comm_ = nullptr;
  }
}

void HicollBackend::abort() {
  stopWorker(/*drain=*/false);
  {
    std::lock_guard<std::mutex> lock(fb_mu_);
    for (auto& [dev, b] : fallbacks_) b->abort();
    fallbacks_.clear();
  }
  if (comm_) {
    hcCommAbort(comm_);
    comm_ = nullptr;
  }
}

#if HICOLL_TORCH_HAS_SPLIT
c10d::ErrorType HicollBackend::getError() {
  std::lock_guard<std::mutex> lock(q_mu_);
  return error_;
}

c10::intrusive_ptr<c10d::Backend::Options> HicollBackend::getBackendOptions() {
  auto opts = c10::make_intrusive<Options>("hicoll", cfg_.timeout);
  opts->group_name = cfg_.group_name;
  opts->global_ranks_in_group = cfg_.global_ranks;
  return opts;
}

// Members only (ProcessGroup::splitGroup calls this on the ranks of the new group): a fresh
// communicator bootstrapped on the split's own store, like a new_group.
c10::intrusive_ptr<c10d::Backend> HicollBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                       const std::vector<int>& ranks,
                                                       const c10::intrusive_ptr<Options>& opts) {
  auto it = std::find(ranks.begin(), ranks.end(), getRank());
  TORCH_CHECK(it != ranks.end(), "hicoll: split called on rank ", getRank(),
              " which is not in the new group");
  Config cfg = cfg_;
  if (opts) {
    cfg.timeout = opts->timeout;
    cfg.group_name = opts->group_name;
  }
  cfg.global_ranks.clear();
  for (int r : ranks) {
    cfg.global_ranks.push_back(static_cast<size_t>(r) < cfg_.global_ranks.size()
                                   ? cfg_.global_ranks[r]
                                   : static_cast<uint64_t>(r));
  }
  // splitGroup hands every split the parent's store: key the bootstrap by the new group.
  // torch names each split uniquely; without a name, the members and a per-parent count.
  std::string key = cfg.group_name;
  if (!key.empty()) {
    auto seen = split_children_.find(key);
    if (seen != split_children_.end()) {
      if (auto child = seen->second.lock()) return child;
    }
  } else {
    for (int r : ranks) key += c10::str(r, ",");
    key += c10::str("#", split_count_++);
  }
  auto split_store = c10::make_intrusive<c10d::PrefixStore>("hicoll_split/" + key, store);
  c10::intrusive_ptr<c10d::Backend> child = c10::make_intrusive<HicollBackend>(
      split_store, static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()), std::move(cfg));
  split_children_.insert_or_assign(key, c10::weak_intrusive_ptr<c10d::Backend>(child));
  return child;
}
#endif

std::chrono::milliseconds HicollBackend::opTimeout(std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? cfg_.timeout : requested;
}

std::optional<std::string> HicollBackend::declineReason(const char* coll,
                                                        const std::vector<at::Tensor>& ts,
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
    case ReduceOp::SUM:
      return std::nullopt;
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
    default:
      return c10::str("ReduceOp ", redOpName(op->op_), " is not a hicoll reduction");
  }
}

void HicollBackend::countHicoll(const char* op) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  hicoll_calls_[op]++;
}

void HicollBackend::countFallback(const char* op, c10::DeviceType device,
                                  const std::string& reason) {
  bool announce = false;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    fallback_calls_[op]++;
    fallback_reasons_[op] = reason;
    announce = log_level_ >= 3 ||
               (log_level_ >= 2 && announced_.insert(std::string(op) + '\0' + reason).second);
  }
  if (announce) {
    std::fprintf(stderr, "hicoll [rank %d] INFO torch: %s on group '%s' runs on the %s fallback: %s\n",
                 getRank(), op, cfg_.group_name.c_str(),
                 device == c10::kCPU ? "gloo" : "nccl", reason.c_str());
  }
}

c10::intrusive_ptr<c10d::Backend> HicollBackend::fallbackBackend(c10::DeviceType device) {
  std::lock_guard<std::mutex> lock(fb_mu_);
  auto it = fallbacks_.find(device);
  if (it != fallbacks_.end()) return it->second;
  TORCH_CHECK(cfg_.fallback_factory, "hicoll: no fallback backend factory for ", deviceName(device));
  auto b = cfg_.fallback_factory(store_, getRank(), getSize(), deviceName(device));
  TORCH_CHECK(b, "hicoll: the fallback factory returned no backend for ", deviceName(device));
  fallbacks_[device] = b;
  return b;
}

void HicollBackend::enqueue(const c10::intrusive_ptr<HicollWork>& work) {
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    TORCH_CHECK(!stopping_, "hicoll: process group '", cfg_.group_name, "' was shut down");
    queue_.push_back(work);
  }
  q_cv_.notify_one();
}

void HicollBackend::workerLoop() {
  for (;;) {
    c10::intrusive_ptr<HicollWork> work;
    std::string broken;
    {
      std::unique_lock<std::mutex> lock(q_mu_);
      q_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      work = queue_.front();
      queue_.pop_front();
      broken = broken_;
      busy_ = true;
    }
    if (!broken.empty()) {
      work->complete(std::make_exception_ptr(c10::DistBackendError(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          "hicoll: communicator failed earlier: " + broken)));
    } else {
      std::lock_guard<std::mutex> call(call_mu_);
      work->execute(false);
    }
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

void HicollBackend::drainQueue() {
  std::unique_lock<std::mutex> lock(q_mu_);
  idle_cv_.wait(lock, [&] { return (queue_.empty() && !busy_) || stopping_; });
}

void HicollBackend::check(hcResult_t res, const char* what, hcStream_t stream) {
  if (res == hcSuccess) return;
  std::string msg = c10::str("hicoll: ", what, " failed on rank ", getRank(), " of ", getSize(),
                             " (group '", cfg_.group_name, "'): ", hcGetErrorString(res), ": ",
                             hcGetLastError(comm_));
  if (res == hcUnsupported || (stream && res == hcInvalidUsage)) throw Declined{msg};
  if (res == hcRemoteError || res == hcTimeout) {
    std::lock_guard<std::mutex> lock(q_mu_);
    broken_ = msg;
    error_ = res == hcTimeout ? c10d::ErrorType::TIMEOUT : c10d::ErrorType::REMOTE_ERROR;
  }
  C10_THROW_ERROR(DistBackendError, msg);
}

HicollBackend::WorkPtr HicollBackend::submit(c10d::OpType type, const char* op,
                                             std::vector<at::Tensor> outputs,
                                             std::chrono::milliseconds timeout,
                                             const std::vector<at::Tensor>& probe,
                                             std::optional<std::string> reason, RunFn run,
                                             FallbackCall fb) {
  const auto device = probe.empty() ? c10::kCPU : probe.front().device().type();
  seq_++;
  if (reason && device != c10::kCPU) {
    // Device calls go straight to NCCL on the caller's thread: it orders them on the
    // caller's current stream.
    countFallback(op, device, *reason);
    return fb(*fallbackBackend(device));
  }
#ifdef HICOLL_PLUGIN_CUDA
  if (device == c10::kCUDA) {
    return runOnStream(type, op, std::move(outputs), timeout, probe, run, fb);
  }
#endif
  if (reason) {
    countFallback(op, device, *reason);
    fallbackBackend(device);  // made here, in issue order on every rank (it is collective)
  } else {
    countHicoll(op);
  }
  // The worker runs with the caller's thread-local state (grad mode, profiler), as gloo does.
  at::ThreadLocalState tls;
  auto fallback = [this, fb, device, op, timeout, tls](const std::string* runtime_reason) {
    at::ThreadLocalStateGuard guard(tls);
    if (runtime_reason) {
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        hicoll_calls_[op]--;
      }
      countFallback(op, device, *runtime_reason);
    }
    auto work = fb(*fallbackBackend(device));
    if (work) work->wait(timeout);
  };
  std::function<void()> hicoll_run;
  if (!reason) {
    hicoll_run = [run = std::move(run), fallback, tls] {
      at::ThreadLocalStateGuard guard(tls);
      at::NoGradGuard no_grad;  // outputs may be leaves that require grad (as in gloo)
      try {
        run(nullptr);
      } catch (const Declined& d) {
        fallback(&d.reason);  // hicoll returned hcUnsupported before touching the buffers
      }
    };
  }
  auto work = c10::make_intrusive<HicollWork>(getRank(), type, nullptr, std::move(outputs),
                                              timeout, seq_.load(), std::move(hicoll_run),
                                              [fallback] { fallback(nullptr); });
  enqueue(work);
  return work;
}

#ifdef HICOLL_PLUGIN_CUDA
// CUDA tensors, NCCL-style: hicoll enqueues the call on the caller's current stream (it starts
// after the work already there, later work waits for it) and the Work completes with an event
// recorded after it. Contiguous copies and copies back are stream-ordered around it too.
HicollBackend::WorkPtr HicollBackend::runOnStream(c10d::OpType type, const char* op,
                                                  std::vector<at::Tensor> outputs,
                                                  std::chrono::milliseconds timeout,
                                                  const std::vector<at::Tensor>& probe,
                                                  const RunFn& run, const FallbackCall& fb) {
  const c10::Device device = probe.front().device();
  // hicoll's device engine binds the communicator to the current device at its first device
  // call (and refuses buffers of another GPU later): make it the tensors' device.
  c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  // Host calls issued before this one run first: every rank calls the communicator in the
  // same order.
  drainQueue();
  std::unique_lock<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    TORCH_CHECK(!stopping_ && comm_, "hicoll: process group '", cfg_.group_name,
                "' was shut down");
    if (!broken_.empty()) {
      C10_THROW_ERROR(DistBackendError, "hicoll: communicator failed earlier: " + broken_);
    }
  }
  try {
    at::NoGradGuard no_grad;  // outputs may be leaves that require grad
    // hicoll reads a NULL stream as "host buffers": the legacy default stream, which torch
    // represents as NULL, has to be named by its non-NULL handle.
    cudaStream_t s = stream.stream();
    run(s ? s : cudaStreamLegacy);
  } catch (const Declined& d) {
    // hcUnsupported (a libhicoll without CUDA) or hcInvalidUsage: NCCL, on this stream.
    call.unlock();
    countFallback(op, device.type(), d.reason);
    return fb(*fallbackBackend(device.type()));
  }
  call.unlock();
  countHicoll(op);
  // The caching allocator must not reuse these buffers on another stream before the call is
  // done (a no-op for blocks allocated on this stream, or not by the allocator).
  const std::vector<at::Tensor>* lists[] = {&probe, &outputs};
  for (const auto* list : lists) {
    for (const auto& t : *list) {
      if (t.defined() && t.has_storage()) {
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
      }
    }
  }
  auto work =
      c10::make_intrusive<HicollCudaWork>(getRank(), type, std::move(outputs), device, seq_.load());
  work->recordOn(stream);
  return work;
}

// ---------------------------------------------------------------------------------------------
HicollCudaWork::HicollCudaWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                               c10::Device device, uint64_t seq)
    : Work(rank, type, nullptr),
      outputs_(std::move(outputs)),
      device_(device),
      seq_(seq),
      event_(cudaEventDisableTiming),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{device})) {}

void HicollCudaWork::recordOn(const c10::cuda::CUDAStream& stream) {
  c10::cuda::CUDAStreamGuard guard(stream);
  event_.record(stream);
  // A CUDA-aware future: it records its own event on the current stream (this one) and makes
  // the streams of whoever waits on it, or runs its callbacks, wait for that event.
  future_->markCompleted(c10::IValue(outputs_));
}

bool HicollCudaWork::isCompleted() { return event_.query(); }

void HicollCudaWork::synchronize() {
  c10::cuda::CUDAGuard guard(device_);
  event_.block(c10::cuda::getCurrentCUDAStream(device_.index()));
}

bool HicollCudaWork::wait(std::chrono::milliseconds timeout) {
  synchronize();  // the caller's current stream waits for the call
  if (timeout != kNoTimeout) {
    // An explicit timeout also bounds a host wait, as ProcessGroupNCCL's blocking wait.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!event_.query()) {
      if (std::chrono::steady_clock::now() > deadline) {
        C10_THROW_ERROR(DistBackendError,
                        c10::str("hicoll: rank ", rank_, " timed out after ", timeout.count(),
                                 " ms waiting for ", c10d::opTypeToString(opType_), " (seq ",
                                 seq_, ") on ", device_));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  return true;
}
#endif

HicollBackend::WorkPtr HicollBackend::forward(c10d::OpType type, const char* op,
                                              const std::vector<at::Tensor>& probe,
                                              std::vector<at::Tensor> outputs,
                                              std::chrono::milliseconds timeout, bool p2p,
                                              FallbackCall fb) {
  const auto device = probe.empty() ? c10::kCPU : probe.front().device().type();
  const std::string reason = "not implemented by hicoll";
  if (p2p || device != c10::kCPU) {
    seq_++;
    countFallback(op, device, reason);
    return fb(*fallbackBackend(device));
  }
  return submit(type, op, std::move(outputs), timeout, probe, reason, nullptr, std::move(fb));
}

// ---------------------------------------------------------------------------------------------
// Engine calls (worker thread).

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
    default:
      throw Declined{c10::str("ReduceOp ", redOpName(op.op_))};
  }
}

void HicollBackend::doAllGather(const at::Tensor& in, const at::Tensor& out, hcStream_t s) {
  // Bytes are bytes: any dtype (float8, complex, bool...) gathers as uint8.
  check(hcAllGather(in.data_ptr(), out.data_ptr(), in.nbytes(), hcUint8, comm_, s), "allgather",
        s);
}

void HicollBackend::doReduceScatter(const at::Tensor& in, const at::Tensor& out,
                                    const ReduceOp& op, hcStream_t s) {
  const at::Tensor rin = realView(in), rout = realView(out);
  withRedOp(op, in.scalar_type(), [&](hcRedOp_t r, hcDataType_t dt) {
    check(hcReduceScatter(rin.data_ptr(), rout.data_ptr(), static_cast<size_t>(rout.numel()), dt, r,
                          comm_, s),
          "reducescatter", s);
  });
}

void HicollBackend::doAllReduce(const at::Tensor& t, const ReduceOp& op, hcStream_t s) {
  const at::Tensor rt = realView(t);
  withRedOp(op, t.scalar_type(), [&](hcRedOp_t r, hcDataType_t dt) {
    check(hcAllReduce(rt.data_ptr(), rt.data_ptr(), static_cast<size_t>(rt.numel()), dt, r, comm_, s),
          "allreduce", s);
  });
}

// ---------------------------------------------------------------------------------------------
// Collectives run by hicoll. Non-contiguous tensors go through a contiguous copy.

namespace {

// Gloo has neither AVG nor PREMUL_SUM: run SUM on it and scale here (CPU fallback only).
bool needsSumEmulation(const c10d::Backend& b, const ReduceOp& op) {
  return b.getBackendName() == "gloo" &&
         (op.op_ == ReduceOp::AVG || op.op_ == ReduceOp::PREMUL_SUM);
}

void scaleAfterSum(const at::Tensor& t, const ReduceOp& op, int size) {
  at::NoGradGuard no_grad;
  if (op.op_ == ReduceOp::AVG) {
    if (at::isFloatingType(t.scalar_type()) || t.is_complex()) {
      t.div_(size);
    } else {
      t.div_(size, "trunc");
    }
  } else {
    t.mul_(premulFactor(op));  // sum(f * x) == f * sum(x) up to rounding
  }
}

// Reduce-scatter on gloo as SUM allreduce of a copy, then this rank's block, scaled. (Gloo's
// own reduce-scatter writes its output after its Work completes, so it cannot be scaled.)
c10::intrusive_ptr<c10d::Work> emulatedReduceScatter(c10d::Backend& b, const at::Tensor& output,
                                                     const at::Tensor& flat_input,
                                                     const ReduceOp& op,
                                                     std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> tmp{flat_input.reshape({-1}).clone()};
  c10d::AllreduceOptions ao;
  ao.reduceOp = ReduceOp(ReduceOp::SUM);
  ao.timeout = timeout;
  auto w = b.allreduce(tmp, ao);
  w->wait(timeout.count() > 0 ? timeout : kNoTimeout);
  const at::Tensor block = tmp[0].narrow(0, b.getRank() * output.numel(), output.numel());
  scaleAfterSum(block, op, b.getSize());
  at::NoGradGuard no_grad;
  output.copy_(block.view(output.sizes()));
  return w;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> HicollBackend::_allgather_base(at::Tensor& output,
                                                               at::Tensor& input,
                                                               const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "hicoll: all_gather_into_tensor: output and input dtypes differ");
  TORCH_CHECK(output.numel() == input.numel() * getSize(),
              "hicoll: all_gather_into_tensor: output has ", output.numel(),
              " elements, expected world size x input = ", input.numel() * getSize());
  auto reason = declineReason("allgather", {input, output}, nullptr);
  auto run = [this, output, input](hcStream_t s) {
    const at::Tensor in = input.contiguous();
    const at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
    doAllGather(in, out, s);
    if (!out.is_same(output)) output.copy_(out);
  };
  auto fb = [output, input, opts](c10d::Backend& b) mutable {
    return b._allgather_base(output, input, opts);
  };
  return submit(OpType::_ALLGATHER_BASE, "_allgather_base", {output}, opTimeout(opts.timeout),
                {input}, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "hicoll: allgather_into_tensor_coalesced: ", outputs.size(), " outputs for ",
              inputs.size(), " inputs");
  std::optional<std::string> reason;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize() &&
                    outputs[i].scalar_type() == inputs[i].scalar_type(),
                "hicoll: allgather_into_tensor_coalesced: output ", i, " does not match input ", i);
    if (!reason) reason = declineReason("allgather", {inputs[i], outputs[i]}, nullptr);
  }
  auto run = [this, outputs, inputs](hcStream_t s) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor in = inputs[i].contiguous();
      const at::Tensor out = outputs[i].is_contiguous()
                                 ? outputs[i]
                                 : at::empty_like(outputs[i], at::MemoryFormat::Contiguous);
      doAllGather(in, out, s);
      if (!out.is_same(outputs[i])) outputs[i].copy_(out);
    }
  };
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable {
    return b.allgather_into_tensor_coalesced(outputs, inputs, opts);
  };
  return submit(OpType::COALESCED, "allgather_into_tensor_coalesced", outputs,
                opTimeout(opts.timeout), inputs, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1,
              "hicoll: allgather takes one input tensor and one output list per process");
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == getSize(), "hicoll: allgather: ",
              outputs[0].size(), " output tensors for a group of ", getSize());
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
    for (size_t r = 0; r < outs.size(); ++r) {
      outs[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(outs[r].sizes()));
    }
  };
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable {
    return b.allgather(outputs, inputs, opts);
  };
  return submit(OpType::ALLGATHER, "allgather", outs, opTimeout(opts.timeout), {input}, reason,
                run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "hicoll: reduce_scatter_tensor: output and input dtypes differ");
  TORCH_CHECK(input.numel() == output.numel() * getSize(),
              "hicoll: reduce_scatter_tensor: input has ", input.numel(),
              " elements, expected world size x output = ", output.numel() * getSize());
  auto reason = declineReason("reducescatter", {input, output}, &opts.reduceOp);
  const int size = getSize();
  auto run = [this, output, input, op = opts.reduceOp](hcStream_t s) {
    const at::Tensor in = input.contiguous();
    const at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
    doReduceScatter(in, out, op, s);
    if (!out.is_same(output)) output.copy_(out);
  };
  auto fb = [output, input, opts, size](c10d::Backend& b) mutable -> WorkPtr {
    if (!needsSumEmulation(b, opts.reduceOp)) return b._reduce_scatter_base(output, input, opts);
    return emulatedReduceScatter(b, output, input, opts.reduceOp, opts.timeout);
  };
  return submit(OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", {output},
                opTimeout(opts.timeout), {input}, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "hicoll: reduce_scatter_tensor_coalesced: ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  std::optional<std::string> reason;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize() &&
                    outputs[i].scalar_type() == inputs[i].scalar_type(),
                "hicoll: reduce_scatter_tensor_coalesced: output ", i, " does not match input ", i);
    if (!reason) reason = declineReason("reducescatter", {inputs[i], outputs[i]}, &opts.reduceOp);
  }
  const int size = getSize();
  auto run = [this, outputs, inputs, op = opts.reduceOp](hcStream_t s) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor in = inputs[i].contiguous();
      const at::Tensor out = outputs[i].is_contiguous()
                                 ? outputs[i]
                                 : at::empty_like(outputs[i], at::MemoryFormat::Contiguous);
      doReduceScatter(in, out, op, s);
      if (!out.is_same(outputs[i])) outputs[i].copy_(out);
    }
  };
  auto fb = [outputs, inputs, opts, size](c10d::Backend& b) mutable -> WorkPtr {
    if (!needsSumEmulation(b, opts.reduceOp)) {
      return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    }
    WorkPtr w;
    for (size_t i = 0; i < outputs.size(); ++i) {
      w = emulatedReduceScatter(b, outputs[i], inputs[i], opts.reduceOp, opts.timeout);
    }
    return w;
  };
  return submit(OpType::COALESCED, "reduce_scatter_tensor_coalesced", outputs,
                opTimeout(opts.timeout), inputs, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
              "hicoll: reduce_scatter takes one output tensor and one input list per process");
  TORCH_CHECK(static_cast<int>(inputs[0].size()) == getSize(), "hicoll: reduce_scatter: ",
              inputs[0].size(), " input tensors for a group of ", getSize());
  const at::Tensor output = outputs[0];
  std::optional<std::string> reason;
  for (const auto& t : inputs[0]) {
    if (t.numel() != output.numel() || t.scalar_type() != output.scalar_type()) {
      reason = "input tensors of different sizes or dtypes";
    }
  }
  if (!reason) reason = declineReason("reducescatter", concat({output}, inputs[0]), &opts.reduceOp);
  const int size = getSize();
  auto ins = inputs[0];
  auto run = [this, output, ins, op = opts.reduceOp](hcStream_t s) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : ins) flat_parts.push_back(t.reshape({-1}));
    const at::Tensor in = at::cat(flat_parts);
    const at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
    doReduceScatter(in, out, op, s);
    if (!out.is_same(output)) output.copy_(out);
  };
  auto fb = [outputs, inputs, opts, size](c10d::Backend& b) mutable -> WorkPtr {
    if (!needsSumEmulation(b, opts.reduceOp)) return b.reduce_scatter(outputs, inputs, opts);
    std::vector<at::Tensor> parts;
    for (const auto& t : inputs[0]) parts.push_back(t.reshape({-1}));
    return emulatedReduceScatter(b, outputs[0], at::cat(parts), opts.reduceOp, opts.timeout);
  };
  return submit(OpType::REDUCE_SCATTER, "reduce_scatter", {output}, opTimeout(opts.timeout),
                {output}, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "hicoll: allreduce of no tensors");
  auto reason = declineReason("allreduce", tensors, &opts.reduceOp);
  const int size = getSize();
  auto run = [this, tensors, op = opts.reduceOp](hcStream_t s) {
    for (const auto& t : tensors) {
      const at::Tensor c = t.contiguous();
      doAllReduce(c, op, s);
      if (!c.is_same(t)) t.copy_(c);
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
  return submit(OpType::ALLREDUCE, "allreduce", tensors, opTimeout(opts.timeout), tensors, reason,
                run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "hicoll: allreduce_coalesced of no tensors");
  auto reason = declineReason("allreduce", tensors, &opts.reduceOp);  // also: one dtype
  const int size = getSize();
  auto run = [this, tensors, op = opts.reduceOp](hcStream_t s) {
    // One call on a flat buffer (one dtype, checked above), then copy back.
    std::vector<at::Tensor> parts;
    for (const auto& t : tensors) parts.push_back(t.reshape({-1}));
    const at::Tensor flat = at::cat(parts);
    doAllReduce(flat, op, s);
    int64_t off = 0;
    for (const auto& t : tensors) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
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
  return submit(OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors,
                opTimeout(opts.timeout), tensors, reason, run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hicoll: broadcast takes one tensor per process");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "hicoll: broadcast root ",
              opts.rootRank, " outside a group of ", getSize());
  auto reason = declineReason("broadcast", tensors, nullptr);
  const at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  auto run = [this, t, root](hcStream_t s) {
    const at::Tensor c = t.contiguous();
    check(hcBroadcast(c.data_ptr(), c.data_ptr(), c.nbytes(), hcUint8, root, comm_, s),
          "broadcast", s);
    if (!c.is_same(t)) t.copy_(c);
  };
  auto fb = [tensors, opts](c10d::Backend& b) mutable { return b.broadcast(tensors, opts); };
  return submit(OpType::BROADCAST, "broadcast", tensors, opTimeout(opts.timeout), tensors, reason,
                run, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::barrier(const c10d::BarrierOptions& opts) {
  // Runs after every call queued before it, so it also orders this rank's earlier work.
  std::optional<std::string> reason;
  if (forced_.count("all")) reason = "HICOLL_FORCE_FALLBACK names all";
  auto run = [this](hcStream_t) { check(hcBarrier(comm_), "barrier"); };
  auto fb = [opts](c10d::Backend& b) mutable { return b.barrier(opts); };
  return submit(OpType::BARRIER, "barrier", {}, opTimeout(opts.timeout), {}, reason, run, fb);
}

// ---------------------------------------------------------------------------------------------
// Not implemented by hicoll: forwarded, announced and counted.

c10::intrusive_ptr<c10d::Work> HicollBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  auto fb = [tensors, opts](c10d::Backend& b) mutable { return b.allreduce_sparse(tensors, opts); };
  return forward(OpType::_ALLREDUCE_SPARSE, "allreduce_sparse", tensors, tensors,
                 opTimeout(opts.timeout), false, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  auto fb = [tensors, opts](c10d::Backend& b) mutable { return b.reduce(tensors, opts); };
  return forward(OpType::REDUCE, "reduce", tensors, tensors, opTimeout(opts.timeout), false, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outs;
  for (auto& l : outputs) outs.insert(outs.end(), l.begin(), l.end());
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable {
    return b.allgather_coalesced(outputs, inputs, opts);
  };
  return forward(OpType::ALLGATHER_COALESCED, "allgather_coalesced", inputs, outs,
                 opTimeout(opts.timeout), false, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::GatherOptions& opts) {
  std::vector<at::Tensor> outs;
  for (auto& l : outputs) outs.insert(outs.end(), l.begin(), l.end());
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable {
    return b.gather(outputs, inputs, opts);
  };
  return forward(OpType::GATHER, "gather", inputs, outs, opTimeout(opts.timeout), false, fb);
}

c10::intrusive_ptr<c10d::Work> HicollBackend::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  auto fb = [outputs, inputs, opts](c10d::Backend& b) mutable {
    return b.scatter(outputs, inputs, opts);
  };
  return forward(OpType::SCATTER, "scatter", outputs, outputs, opTimeout(opts.timeout), false, fb);
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

// ---------------------------------------------------------------------------------------------
std::map<std::string, int64_t> HicollBackend::hicollCounts() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return hicoll_calls_;
}

std::map<std::string, int64_t> HicollBackend::fallbackCounts() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return fallback_calls_;
}

std::map<std::string, std::string> HicollBackend::fallbackReasons() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return fallback_reasons_;
}

hcStats HicollBackend::stats() const {
  hcStats s = HC_STATS_INITIALIZER;
  TORCH_CHECK(comm_, "hicoll: the process group is shut down");
  const hcResult_t res = hcCommGetStats(comm_, &s);
  TORCH_CHECK(res == hcSuccess, "hicoll: hcCommGetStats: ", hcGetErrorString(res));
  return s;
}

}  // namespace hicoll_torch
