// HicollBackend's lifecycle (bootstrap, shutdown, abort, split, shrink), the worker queue that
// runs host calls in issue order, and the routing of each call to hicoll or the fallback.
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
#include <limits>
#include <mutex>

#include "tensor_ops.hpp"

namespace hicoll_torch {
namespace {

// hcConfig_t from the group's options; the strings stay in cfg.
hcConfig_t hcConfigOf(const HicollBackend::Config& cfg) {
  hcConfig_t c = HC_CONFIG_INITIALIZER;
  c.name = cfg.group_name.c_str();
  const std::map<std::string, const char**> text = {{"algo", &c.algo},
                                                    {"force_fallback", &c.forceFallback},
                                                    {"debug", &c.debug},
                                                    {"name", &c.name},
                                                    {"topo_node", &c.topoNode}};
  const std::map<std::string, long long*> ints = {{"timeout_ms", &c.timeoutMs},
                                                  {"chunk_size", &c.chunkBytes},
                                                  {"net_chunk_size", &c.netChunkBytes},
                                                  {"net_window", &c.netWindow},
                                                  {"device_chunk_size", &c.deviceChunkBytes},
                                                  {"allreduce_small_bytes", &c.allreduceSmallBytes},
                                                  {"scratch_bytes", &c.scratchBytes},
                                                  {"sort_bytes", &c.sortBytes},
                                                  {"quant_min_nodes", &c.quantMinNodes}};
  // The group's timeout is the communicator's unless HICOLL_TIMEOUT_MS (or the timeout_ms
  // option, below) says otherwise: a call that waits for a missing rank then fails with
  // hicoll's own error, which names that rank, rather than the Work's bare timeout.
  if (!std::getenv("HICOLL_TIMEOUT_MS"))
    c.timeoutMs = std::clamp<long long>(cfg.timeout.count(), 1, std::numeric_limits<int>::max());
  for (const auto& [k, v] : cfg.text_options) {
    auto it = text.find(k);
    TORCH_CHECK(it != text.end(), "hicoll.torch.Options: unknown option '", k, "'");
    *it->second = v.c_str();
  }
  for (const auto& [k, v] : cfg.int_options) {
    auto it = ints.find(k);
    TORCH_CHECK(it != ints.end(), "hicoll.torch.Options: unknown option '", k, "'");
    *it->second = v;
  }
  return c;
}

int levelOf(const char* v) {
  std::string s = v ? v : "";
  std::transform(s.begin(), s.end(), s.begin(), ::toupper);
  return s == "NONE" ? 0 : s == "INFO" ? 2 : s == "TRACE" ? 3 : 1;
}

// The words of the communicator's HICOLL_FORCE_FALLBACK (libhicoll parsed and normalised it).
std::set<std::string> wordsOf(const char* list) {
  std::set<std::string> out;
  std::string s = list ? list : "", word;
  for (char c : s + ",") {
    if (c == ',') {
      if (!word.empty()) out.insert(word);
      word.clear();
    } else {
      word.push_back(c);
    }
  }
  return out;
}

// Every member adds 1 to one counter of the group's store per construction, so the values
// of one incarnation are incarnation * size + 1 .. (incarnation + 1) * size: no member can
// start the next one before all have joined this one (the bootstrap needs every member).
uint64_t agreeIncarnation(const c10::intrusive_ptr<c10d::Store>& store, int size) {
  const int64_t v = store->add("hicoll/incarnations", 1);
  return static_cast<uint64_t>(v - 1) / static_cast<uint64_t>(size);
}

// The backends alive in this process, for shutdownAll (atexit). Weak: the registry does not
// keep a group alive.
std::mutex& liveMutex() {
  static std::mutex mu;
  return mu;
}
std::vector<c10::weak_intrusive_ptr<HicollBackend>>& liveBackends() {
  static std::vector<c10::weak_intrusive_ptr<HicollBackend>> live;
  return live;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
HicollBackend::HicollBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Config cfg)
    : Backend(rank, size), cfg_(std::move(cfg)) {
  incarnation_ = agreeIncarnation(store, size);
  store_ = c10::make_intrusive<c10d::PrefixStore>(c10::str("hicoll/", incarnation_), store);
  bridge_ = std::make_unique<StoreBridge>(store_);
  const hcConfig_t options = hcConfigOf(cfg_);
  const hcResult_t res = hcCommInitRankStoreConfig(&comm_, size, rank, bridge_->ops(), "comm", &options);
  if (res != hcSuccess) {
    comm_ = nullptr;
    C10_THROW_ERROR(DistBackendError, c10::str("hicoll: communicator creation failed on rank ", rank, " of ", size,
                                               " (group '", cfg_.group_name, "', incarnation ", incarnation_,
                                               "): ", hcGetErrorString(res), ": ", hcGetLastError(nullptr)));
  }
  readConfig();
  start();
}

// What the communicator runs with decides the plugin's logging and forced fallbacks too: one
// parse, libhicoll's.
void HicollBackend::readConfig() {
  hcConfig_t c = HC_CONFIG_INITIALIZER;
  TORCH_CHECK(hcCommGetConfig(comm_, &c) == hcSuccess, "hicoll: hcCommGetConfig: ", hcGetLastError(comm_));
  log_level_ = levelOf(c.debug);
  forced_ = wordsOf(c.forceFallback);
}

HicollBackend::HicollBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Config cfg,
                             hcComm_t comm)
    : Backend(rank, size), store_(store), cfg_(std::move(cfg)), comm_(comm) {
  readConfig();
  start();
}

void HicollBackend::start() {
  // A group across nodes opens its network now (one barrier): a point-to-point call needs the
  // endpoint of every rank, and a rank that is in no call cannot open its own.
  hcStats s = HC_STATS_INITIALIZER;
  if (hcCommGetStats(comm_, &s) == hcSuccess && s.nnodes > 1) check(hcBarrier(comm_), "barrier (opening the network)");
  worker_ = std::thread([this] { workerLoop(); });
}

c10::intrusive_ptr<HicollBackend> HicollBackend::track(c10::intrusive_ptr<HicollBackend> b) {
  std::lock_guard<std::mutex> lock(liveMutex());
  auto& live = liveBackends();
  live.erase(std::remove_if(live.begin(), live.end(), [](const auto& w) { return w.expired(); }), live.end());
  live.emplace_back(b);
  return b;
}

HicollBackend::~HicollBackend() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hicoll torch: shutdown failed: %s\n", e.what());
  }
}

void HicollBackend::shutdownAll() {
  std::vector<c10::intrusive_ptr<HicollBackend>> live;
  {
    std::lock_guard<std::mutex> lock(liveMutex());
    for (auto& w : liveBackends()) {
      if (auto b = w.lock()) live.push_back(std::move(b));
    }
    liveBackends().clear();
  }
  for (auto& b : live) {
    try {
      b->shutdown();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hicoll torch: shutdown of group '%s' at exit failed: %s\n", b->groupName().c_str(),
                   e.what());
    }
  }
}

void HicollBackend::revokeOthers() {
  std::lock_guard<std::mutex> lock(liveMutex());
  for (auto& w : liveBackends()) {
    auto b = w.lock();
    if (b && b.get() != this && b->comm_) hcCommRevoke(b->comm_);
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
    w->complete(std::make_exception_ptr(
        c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, "hicoll: process group aborted")));
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) {
    worker_.join();  // an in-flight call ends within HICOLL_TIMEOUT_MS
  }
  releaseRetired();
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
    bool broken;
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      broken = !broken_.empty();
    }
    // After a remote error or a timeout (for example the parent of a shrink) the peers may be
    // gone: abort rather than wait for them.
    broken ? hcCommAbort(comm_) : hcCommDestroy(comm_);  // destroy drains device calls in flight
    comm_ = nullptr;
  }
}

at::Tensor HicollBackend::allocateTensor(long size, at::TensorOptions options) {
  TORCH_CHECK(size >= 0, "hicoll allocate_tensor: negative size ", size);
  TORCH_CHECK(!options.has_device() || options.device().is_cpu(),
              "hicoll allocate_tensor: node memory is host memory; asked for ", options.device());
  options = options.device(at::kCPU);
  const size_t bytes = static_cast<size_t>(size) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  if (bytes == 0) return at::empty({size}, options);
  void* p = nullptr;
  if (hcMemAlloc(&p, bytes) != hcSuccess) {
    // Node memory only saves copies: without it (no memory to reserve, no descriptors left) the
    // collectives read the tensor from private memory. Said once per process, with the cause.
    static std::once_flag warned;
    const std::string why = hcGetLastError(nullptr);
    std::call_once(warned, [&] {
      TORCH_WARN("hicoll allocate_tensor: no node memory for ", bytes, " bytes (", why,
                 "); using private memory (collectives on it are correct, with one more copy)");
    });
    return at::empty({size}, options);
  }
  return at::from_blob(
      p, {size}, [](void* q) { hcMemFree(q); }, options);
}

void HicollBackend::abort() {
  if (comm_) hcCommRevoke(comm_);  // a call in flight returns now, not at HICOLL_TIMEOUT_MS
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
  TORCH_CHECK(it != ranks.end(), "hicoll: split called on rank ", getRank(), " which is not in the new group");
  Config cfg = cfg_;
  if (opts) {
    cfg.timeout = opts->timeout;
    cfg.group_name = opts->group_name;
  }
  cfg.global_ranks.clear();
  for (int r : ranks) {
    cfg.global_ranks.push_back(static_cast<size_t>(r) < cfg_.global_ranks.size() ? cfg_.global_ranks[r]
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
  c10::intrusive_ptr<c10d::Backend> child = track(c10::make_intrusive<HicollBackend>(
      split_store, static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()), std::move(cfg)));
  split_children_.insert_or_assign(key, c10::weak_intrusive_ptr<c10d::Backend>(child));
  return child;
}
#endif

#if HICOLL_TORCH_HAS_SHRINK
c10::intrusive_ptr<c10d::Backend> HicollBackend::shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                                        const c10::intrusive_ptr<Options>& opts) {
  std::vector<int> excluded(ranks_to_exclude.begin(), ranks_to_exclude.end());
  std::sort(excluded.begin(), excluded.end());
  TORCH_CHECK(!std::binary_search(excluded.begin(), excluded.end(), getRank()), "hicoll: rank ", getRank(),
              " called shrink but is among the excluded ranks");
  // Every call in flight on this group includes the excluded ranks: it cannot complete. Revoke
  // the communicator so the worker's call returns now (not at HICOLL_TIMEOUT_MS), then stop it.
  hcCommRevoke(comm_);
  // Shrinking the default group makes torch destroy every other group right after; revoke them
  // first, or a survivor blocked in one of them (waiting for a peer that came here) would only
  // join the shrink when its call times out.
  if (cfg_.group_name == "0") revokeOthers();
  stopWorker(/*drain=*/false);
  hcComm_t newcomm = nullptr;
  hcResult_t res;
  {
    std::lock_guard<std::mutex> call(call_mu_);
    res = hcCommShrink(comm_, excluded.data(), static_cast<int>(excluded.size()), &newcomm,
                       shrink_flags | HC_SHRINK_ABORT);
  }
  TORCH_CHECK(res == hcSuccess, "hicoll: shrink of group '", cfg_.group_name, "' on rank ", getRank(), " excluding ",
              c10::Join(",", excluded), " failed: ", hcGetErrorString(res), ": ", hcGetLastError(comm_));
  Config cfg = cfg_;
  if (opts) cfg.timeout = opts->timeout;
  cfg.global_ranks.clear();
  int new_rank = 0;
  for (int r = 0; r < getSize(); ++r) {
    if (std::binary_search(excluded.begin(), excluded.end(), r)) continue;
    if (r == getRank()) new_rank = static_cast<int>(cfg.global_ranks.size());
    cfg.global_ranks.push_back(static_cast<size_t>(r) < cfg_.global_ranks.size() ? cfg_.global_ranks[r]
                                                                                 : static_cast<uint64_t>(r));
  }
  // The survivors' fallback rendezvous on keys of their own (no dead rank takes part).
  auto store = c10::make_intrusive<c10d::PrefixStore>(c10::str("shrink/", c10::Join(",", excluded), "/"), store_);
  const int new_size = static_cast<int>(cfg.global_ranks.size());
  return track(c10::make_intrusive<HicollBackend>(store, new_rank, new_size, std::move(cfg), newcomm));
}
#endif

// ---------------------------------------------------------------------------------------------
// Observability.

void HicollBackend::countHicoll(const char* op) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  hicoll_calls_[op]++;
}

void HicollBackend::countFallback(const char* op, c10::DeviceType device, const std::string& reason) {
  bool announce = false;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    fallback_calls_[op]++;
    fallback_reasons_[op] = reason;
    announce = log_level_ >= 3 || (log_level_ >= 2 && announced_.insert(std::string(op) + '\0' + reason).second);
  }
  if (announce) {
    std::fprintf(stderr, "hicoll [rank %d] INFO torch: %s on group '%s' runs on the %s fallback: %s\n", getRank(), op,
                 cfg_.group_name.c_str(), device == c10::kCPU ? "gloo" : "nccl", reason.c_str());
  }
}

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

hcConfig_t HicollBackend::config() const {
  hcConfig_t c = HC_CONFIG_INITIALIZER;
  TORCH_CHECK(comm_, "hicoll: the process group is shut down");
  TORCH_CHECK(hcCommGetConfig(comm_, &c) == hcSuccess, "hicoll: hcCommGetConfig: ", hcGetLastError(comm_));
  return c;
}

hcStats HicollBackend::stats() const {
  hcStats s = HC_STATS_INITIALIZER;
  TORCH_CHECK(comm_, "hicoll: the process group is shut down");
  const hcResult_t res = hcCommGetStats(comm_, &s);
  TORCH_CHECK(res == hcSuccess, "hicoll: hcCommGetStats: ", hcGetErrorString(res));
  return s;
}

// ---------------------------------------------------------------------------------------------
// The queue.

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
  releaseRetired();
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    TORCH_CHECK(!stopping_, "hicoll: process group '", cfg_.group_name, "' was shut down");
    queue_.push_back(work);
  }
  q_cv_.notify_one();
}

void HicollBackend::releaseRetired() {
  std::vector<c10::intrusive_ptr<HicollWork>> done;
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    done.swap(retired_);
  }
  // Dropped here, outside the lock: a tensor's last reference may take the GIL.
}

void HicollBackend::workerLoop() {
  // The worker never drops a Work: a Work holds the caller's tensors, and dropping the last
  // reference to a tensor that has a Python object takes the GIL -- which, on a thread other
  // than the main one during interpreter shutdown, ends the thread (pthread_exit) and so the
  // process (std::terminate). Finished Works go to retired_, dropped by callers' threads.
  // Point-to-point Works stay in `inflight` after their call posted them and are polled between
  // queued calls, and while the queue is empty at a growing interval (spins first: a pipeline's
  // next message is usually microseconds away).
  std::vector<c10::intrusive_ptr<HicollWork>> inflight;
  int idle_polls = 0;
  for (;;) {
    c10::intrusive_ptr<HicollWork> work;
    std::string broken;
    {
      std::unique_lock<std::mutex> lock(q_mu_);
      if (inflight.empty()) {
        q_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      } else if (queue_.empty() && !stopping_ && idle_polls > 64) {
        const auto pause = std::chrono::microseconds(std::min(1000, 10 * (idle_polls - 64)));
        q_cv_.wait_for(lock, pause, [&] { return stopping_ || !queue_.empty(); });
      }
      if (queue_.empty() && stopping_) {
        lock.unlock();
        for (auto& w : inflight) {
          w->complete(std::make_exception_ptr(
              c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                    "hicoll: process group shut down with this send/recv in flight")));
        }
        lock.lock();
        for (auto& w : inflight) retired_.push_back(std::move(w));
        return;
      }
      if (!queue_.empty()) {
        work = std::move(queue_.front());
        queue_.pop_front();
        broken = broken_;
        busy_ = true;
      }
    }
    std::vector<c10::intrusive_ptr<HicollWork>> done;
    const bool ran = static_cast<bool>(work);
    if (ran) {
      if (!broken.empty()) {
        work->complete(std::make_exception_ptr(c10::DistBackendError(
            {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, "hicoll: communicator failed earlier: " + broken)));
      } else {
        std::lock_guard<std::mutex> call(call_mu_);
        work->execute();
      }
      (work->pending() ? inflight : done).push_back(std::move(work));
    }
    if (!inflight.empty()) {
      std::lock_guard<std::mutex> call(call_mu_);
      const size_t before = inflight.size();
      for (size_t i = 0; i < inflight.size();) {
        if (inflight[i]->pollOnce()) {
          done.push_back(std::move(inflight[i]));
          inflight[i] = std::move(inflight.back());
          inflight.pop_back();
        } else {
          ++i;
        }
      }
      idle_polls = inflight.size() < before || ran ? 0 : idle_polls + 1;
    }
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      for (auto& w : done) retired_.push_back(std::move(w));
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

void HicollBackend::drainQueue() {
  std::unique_lock<std::mutex> lock(q_mu_);
  idle_cv_.wait(lock, [&] { return (queue_.empty() && !busy_) || stopping_; });
}

std::chrono::milliseconds HicollBackend::opTimeout(std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? cfg_.timeout : requested;
}

HicollBackend::WorkPtr HicollBackend::submit(c10d::OpType type, const char* op, std::vector<at::Tensor> outputs,
                                             std::chrono::milliseconds timeout, const std::vector<at::Tensor>& probe,
                                             std::optional<std::string> reason, RunFn run, FallbackCall fb) {
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
    return work;
  };
  HicollWork::Step hicoll_run;
  if (!reason) {
    hicoll_run = [run = std::move(run), fallback, tls]() -> WorkPtr {
      at::ThreadLocalStateGuard guard(tls);
      at::NoGradGuard no_grad;  // outputs may be leaves that require grad (as in gloo)
      try {
        run(nullptr);
      } catch (const Declined& d) {
        return fallback(&d.reason);  // hicoll returned hcUnsupported before touching the buffers
      }
      return WorkPtr();
    };
  }
  auto work = c10::make_intrusive<HicollWork>(getRank(), type, std::move(outputs), timeout, seq_.load(),
                                              std::move(hicoll_run), [fallback] { return fallback(nullptr); });
  enqueue(work);
  return work;
}

#ifdef HICOLL_PLUGIN_CUDA
// CUDA tensors, NCCL-style: hicoll enqueues the call on the caller's current stream (it starts
// after the work already there, later work waits for it) and the Work completes with an event
// recorded after it. Contiguous copies and copies back are stream-ordered around it too.
HicollBackend::WorkPtr HicollBackend::runOnStream(c10d::OpType type, const char* op, std::vector<at::Tensor> outputs,
                                                  std::chrono::milliseconds timeout,
                                                  const std::vector<at::Tensor>& probe, const RunFn& run,
                                                  const FallbackCall& fb) {
  const c10::Device device = probe.front().device();
  // hicoll's device engine binds the communicator to the current device at its first device
  // call (and refuses buffers of another GPU later): make it the tensors' device.
  c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  // Host calls issued before this one run first: every rank calls the communicator in the
  // same order.
  drainQueue();
  releaseRetired();
  std::unique_lock<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    TORCH_CHECK(!stopping_ && comm_, "hicoll: process group '", cfg_.group_name, "' was shut down");
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
  auto work = c10::make_intrusive<HicollCudaWork>(getRank(), type, std::move(outputs), device, seq_.load());
  work->recordOn(stream);
  return work;
}
#endif

HicollBackend::WorkPtr HicollBackend::forward(c10d::OpType type, const char* op, const std::vector<at::Tensor>& probe,
                                              std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                                              FallbackCall fb) {
  const auto device = probe.empty() ? c10::kCPU : probe.front().device().type();
  const std::string reason = "not implemented by hicoll";
  if (device != c10::kCPU) {
    seq_++;
    countFallback(op, device, reason);
    return fb(*fallbackBackend(device));
  }
  return submit(type, op, std::move(outputs), timeout, probe, reason, nullptr, std::move(fb));
}

}  // namespace hicoll_torch
