// The DeviceEngine of CUDA builds: per call, the decision table picks the hierarchical device
// path (HierEngine on a CudaStream) or the NCCL fallback; at creation (collective, at the
// first call with a stream) it allocates the sort/staging buffers, maps the node's sort
// buffers with CUDA IPC, shares the node's counter segment and, with several nodes, opens its
// own libfabric endpoint for the proxy thread. Every rank takes part in every bootstrap step
// whatever happened locally, and all ranks learn every rank's outcome, so either all ranks
// have the hierarchical path or all fall back.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "base/error.h"
#include "base/log.h"
#include "core/device.h"
#include "device/cuda_check.h"
#include "device/cuda_ipc.h"
#include "device/cuda_stream.h"
#include "device/decision.h"
#include "device/fi_hmem.h"
#include "device/hier_engine.h"
#include "fallback/nccl/nccl_fallback.h"
#include "transport/ofi/ofi_transport.h"
#include "transport/shm/segment.h"

namespace hicoll {
namespace {

struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() {
    if (p && cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
  }
};
struct PinnedBuffer {
  void* p = nullptr;
  ~PinnedBuffer() {
    if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
  }
};
struct HostRegistration {
  void* p = nullptr;
  ~HostRegistration() {
    if (p && cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
  }
};

// One rank's outcome of a setup step, exchanged with every rank.
struct SetupRecord {
  int32_t ok;
  int32_t pid;
  int32_t device;
  int32_t pad;
  char handle[kIpcHandleBytes];  // its sort buffer
  ShmHandle segment;             // the node's counter segment (local index 0 creates it)
  char pad2[72];
  char error[208];
};
static_assert(sizeof(SetupRecord) == 384, "SetupRecord is a wire struct");

void setError(SetupRecord& r, const std::exception& e) {
  r.ok = 0;
  std::snprintf(r.error, sizeof r.error, "%s", e.what());
}

std::string firstFailure(const std::vector<SetupRecord>& all) {
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].ok) return fmt::format("rank {}: {}", r, all[r].error);
  return "";
}

size_t roundUp(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

class CudaDeviceEngine final : public DeviceEngine {
 public:
  explicit CudaDeviceEngine(const DeviceParts& parts);
  ~CudaDeviceEngine() override;
  void enqueue(const CollArgs& a) override;
  void drain() override {
    if (hier_) hier_->drain();
  }
  void enqueueP2p(const DeviceP2p& p) override;
  void endGroup() override { nccl_->endGroup(); }

 private:
  void setup();
  void dropResources();
  void setupLocal(SetupRecord& mine, const dev::BufferSizes& sz);
  void setupNode(const std::vector<SetupRecord>& all, SetupRecord& mine);
  // what(): the call, for messages (formatted only on an error).
  void checkBuffer(const void* p, const char* which, const std::function<std::string()>& what) const;
  nccl::Fallback& fallback();

  DeviceParts p_;
  int device_ = -1;
  dev::StreamMemOps ops_;
  dev::EngineStatus status_;
  dev::BufferSizes sizes_;
  dev::FlagLayout flags_;
  std::vector<char*> dsort_ptrs_;
  // Declaration order is teardown order reversed: the engine goes first, the memory last.
  DeviceBuffer dsort_, dwork_;
  PinnedBuffer hscratch_, hsort_;
  ShmSegment seg_;
  HostRegistration seg_reg_;
  std::unique_ptr<IpcMappings> ipc_;
  std::unique_ptr<Transport> net_;
  std::unique_ptr<dev::HierEngine> hier_;
  std::unique_ptr<nccl::Fallback> nccl_;
};

CudaDeviceEngine::CudaDeviceEngine(const DeviceParts& parts) : p_(parts) {
  ScopedLogRank log_rank(p_.id.rank);
  cudaError_t e = cudaGetDevice(&device_);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    device_ = -1;
  }
  nccl::BootstrapOps ops;
  ops.allgather = [this](const void* mine, void* all, size_t len) { p_.bootstrap.allgather(mine, all, len); };
  ops.broadcast = [this](void* data, size_t len, int root) { p_.bootstrap.broadcast(data, len, root); };
  nccl_ = std::make_unique<nccl::Fallback>(p_.plan.cfg.str(Knob::NcclLib), p_.id.rank, p_.id.nranks, std::move(ops));
  setup();
  if (status_.hier_ok)
    HC_INFO("device path ready on GPU {}: {} node(s) x {} local rank(s), CUDA IPC within the node, chunks of {} bytes",
            device_, p_.id.topo.nnodes, p_.id.topo.localSize(p_.id.node()), p_.plan.cfg.num(Knob::DeviceChunkBytes));
  else HC_INFO("device path: no hierarchical path ({}); device collectives fall back to NCCL", status_.why_not);
}

CudaDeviceEngine::~CudaDeviceEngine() {
  if (p_.health.failed()) {  // hcCommAbort: do not wait for peers
    if (hier_) hier_->abort(hcRemoteError, "the communicator was aborted");
    if (nccl_) nccl_->abort();
  }
  nccl_.reset();
  hier_.reset();
}

void CudaDeviceEngine::setupLocal(SetupRecord& mine, const dev::BufferSizes& sz) {
  HC_CHECK(device_ >= 0, hcSystemError, "no current CUDA device");
  dev::DeviceGuard g(device_);
  std::string why = ops_.load();
  HC_CHECK(why.empty(), hcUnsupported, "{}", why);
  HC_CUDA(cudaMalloc(&dsort_.p, sz.dsort));
  if (sz.dwork) HC_CUDA(cudaMalloc(&dwork_.p, sz.dwork));
  if (sz.hscratch) HC_CUDA(cudaHostAlloc(&hscratch_.p, sz.hscratch, cudaHostAllocPortable));
  if (sz.hsort) HC_CUDA(cudaHostAlloc(&hsort_.p, sz.hsort, cudaHostAllocPortable));
  IpcHandle h = ipcExport(dsort_.p);
  std::memcpy(mine.handle, h.data(), h.size());
  if (p_.id.localRank() == 0) {
    seg_ = ShmSegment::create(roundUp(dev::FlagLayout::bytes(p_.id.topo.localSize(p_.id.node())), 4096),
                              "device counter segment", /*reserve=*/true);
    mine.segment = seg_.handle();
  }
  mine.ok = 1;
}

void CudaDeviceEngine::setupNode(const std::vector<SetupRecord>& all, SetupRecord& mine) {
  dev::DeviceGuard g(device_);
  const Topology& t = p_.id.topo;
  const int n = p_.id.node(), L = t.localSize(n), l = p_.id.localRank();
  const size_t seg_bytes = roundUp(dev::FlagLayout::bytes(L), 4096);
  if (l != 0) {
    const ShmHandle& h = all[t.rankAt(n, 0)].segment;
    HC_CHECK(h.size == seg_bytes, hcInternalError, "device counter segment of {} bytes, expected {}", h.size,
             seg_bytes);
    seg_ = ShmSegment::open(h, "device counter segment");
  }
  HC_CUDA(cudaHostRegister(seg_.base(), seg_.size(), cudaHostRegisterMapped | cudaHostRegisterPortable));
  seg_reg_.p = seg_.base();
  void* dev = nullptr;
  HC_CUDA(cudaHostGetDevicePointer(&dev, seg_.base(), 0));
  flags_.host = static_cast<volatile uint32_t*>(seg_.base());
  flags_.dev = reinterpret_cast<uint64_t>(dev);
  flags_.local_ranks = L;
  ipc_ = std::make_unique<IpcMappings>();
  dsort_ptrs_.assign(static_cast<size_t>(L), nullptr);
  for (int p = 0; p < L; ++p) {
    if (p == l) {
      dsort_ptrs_[p] = static_cast<char*>(dsort_.p);
      continue;
    }
    IpcHandle h;
    std::memcpy(h.data(), all[t.rankAt(n, p)].handle, h.size());
    dsort_ptrs_[p] = static_cast<char*>(ipc_->open(h));
  }
  // A stream must be able to write and wait on the counters; probe this rank's own line and
  // put it back to zero before anything uses it.
  const dev::FlagRef probe = flags_.at(l, dev::Counter::Finished);
  std::string why = dev::probeStreamMemOps(ops_, probe.host, probe.dev, p_.plan.timeoutMs());
  dev::storeFlag(probe, 0);
  HC_CHECK(why.empty(), hcUnsupported, "{}", why);
  mine.ok = 1;
}

void CudaDeviceEngine::setup() {
  const Topology& t = p_.id.topo;
  if (!t.uniform) {
    status_.why_not = "uneven ranks per node";
    return;
  }
  const int N = t.nnodes, L = t.localSize(p_.id.node());
  const size_t chunk = static_cast<size_t>(p_.plan.cfg.num(Knob::DeviceChunkBytes));
  sizes_ = dev::bufferSizes(L, N, chunk, p_.plan.scratchBytes(), p_.plan.sortBytes());
  const size_t W = static_cast<size_t>(p_.id.nranks);

  // 1. Local resources, the sort buffer's IPC handle, the node segment's name.
  SetupRecord mine{};
  mine.pid = static_cast<int32_t>(getpid());
  mine.device = device_;
  try {
    setupLocal(mine, sizes_);
  } catch (const std::exception& e) {
    setError(mine, e);
  }
  std::vector<SetupRecord> all(W);
  p_.bootstrap.allgather(&mine, all.data(), sizeof mine);
  std::string why = firstFailure(all);
  for (int n = 0; n < N && why.empty(); ++n)
    for (int a = 0; a < L && why.empty(); ++a)
      for (int b = a + 1; b < L && why.empty(); ++b)
        if (all[t.rankAt(n, a)].pid == all[t.rankAt(n, b)].pid)
          why = fmt::format("ranks {} and {} of node {} share a process (CUDA IPC needs one process per rank)",
                            t.rankAt(n, a), t.rankAt(n, b), t.labels[n]);
  if (!why.empty()) {
    status_.why_not = why;
    dropResources();
    return;
  }
  // 2. Map the node's segment and the local peers' sort buffers; probe stream memory ops.
  SetupRecord mine2{};
  try {
    setupNode(all, mine2);
  } catch (const std::exception& e) {
    setError(mine2, e);
  }
  std::vector<SetupRecord> all2(W);
  p_.bootstrap.allgather(&mine2, all2.data(), sizeof mine2);
  if (p_.id.localRank() == 0) seg_.closeFd();  // every local rank has mapped it by now
  why = firstFailure(all2);
  if (!why.empty()) {
    status_.why_not = why;
    dropResources();
    return;
  }
  // 3. The proxy's own endpoint to the other nodes (collective; owned by the proxy thread,
  // so the host path's transports are never shared between threads).
  if (N > 1) {
    OfiOptions oo;
    oo.provider = p_.plan.cfg.str(Knob::OfiProvider);
    oo.iface = p_.plan.cfg.str(Knob::OfiIface);
    if (oo.iface.empty() && t.single_host) oo.iface = "lo";
    oo.timeout_ms = p_.plan.timeoutMs();
    net_ = makeOfiTransport(p_.bootstrap, oo);
    net_->registerRegion(hscratch_.p, sizes_.hscratch);
    net_->registerRegion(hsort_.p, sizes_.hsort);
    dev::HmemProbe hp = dev::probeFiHmem(oo.provider, device_, dsort_.p, std::min<size_t>(sizes_.dsort, 65536));
    HC_INFO("device path: inter-node data is staged through pinned host memory{}: {}",
            hp.cuda_registration ? " (direct FI_HMEM sends are not implemented)" : "", hp.detail);
  }
  dev::Resources r;
  r.rank = p_.id.rank;
  r.topo = t;
  r.dsort = dsort_ptrs_;
  r.dsort_bytes = sizes_.dsort;
  r.dwork = static_cast<char*>(dwork_.p);
  r.dwork_bytes = sizes_.dwork;
  r.hscratch = static_cast<char*>(hscratch_.p);
  r.hscratch_bytes = sizes_.hscratch;
  r.hsort = static_cast<char*>(hsort_.p);
  r.hsort_bytes = sizes_.hsort;
  r.flags = flags_;
  r.net = net_.get();
  r.chunk_bytes = chunk;
  r.plan = p_.plan;
  r.timeout_ms = p_.plan.timeoutMs();
  hier_ = std::make_unique<dev::HierEngine>(std::move(r), std::make_unique<dev::CudaStream>(device_, ops_));
  status_.hier_ok = true;
}

// After a failed setup nothing of the hierarchical path is kept (the sort buffer alone is
// SMDDP_AG_SORT_BUFFER_SIZE_BYTES of GPU memory).
void CudaDeviceEngine::dropResources() {
  ipc_.reset();
  dsort_ptrs_.clear();
  if (seg_reg_.p && cudaHostUnregister(seg_reg_.p) != cudaSuccess) (void)cudaGetLastError();
  seg_reg_.p = nullptr;
  seg_ = ShmSegment();
  flags_ = dev::FlagLayout();
  for (DeviceBuffer* b : {&dsort_, &dwork_})
    if (b->p && cudaFree(std::exchange(b->p, nullptr)) != cudaSuccess) (void)cudaGetLastError();
  for (PinnedBuffer* b : {&hscratch_, &hsort_})
    if (b->p && cudaFreeHost(std::exchange(b->p, nullptr)) != cudaSuccess) (void)cudaGetLastError();
}

void CudaDeviceEngine::checkBuffer(const void* p, const char* which, const std::function<std::string()>& what) const {
  cudaPointerAttributes at{};
  cudaError_t e = cudaPointerGetAttributes(&at, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    HC_THROW(hcInvalidArgument, "{}: {} {} is not CUDA memory ({})", what(), which, p, cudaGetErrorString(e));
  }
  HC_CHECK(at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged, hcInvalidArgument,
           "{}: {} {} is host memory but a stream was given (device buffers go with a stream)", what(), which, p);
  HC_CHECK(at.type == cudaMemoryTypeManaged || at.device == device_, hcInvalidUsage,
           "{}: {} {} is on GPU {} but this communicator's device path runs on GPU {} (the current device at its "
           "first device call)",
           what(), which, p, at.device, device_);
}

nccl::Fallback& CudaDeviceEngine::fallback() {
  return *nccl_;
}

void CudaDeviceEngine::enqueue(const CollArgs& a) {
  ScopedLogRank log_rank(p_.id.rank);
  HC_CHECK(device_ >= 0, hcSystemError, "{}: no usable CUDA device", describe(a));
  dev::DeviceGuard g(device_);
  const auto what = [&a] { return describe(a); };
  if (a.coll != hcCollBroadcast || p_.id.rank == a.root) checkBuffer(a.send, "sendbuff", what);
  checkBuffer(a.recv, "recvbuff", what);

  CollArgs run = a;  // a quantized call that does not quantize runs exact, described as itself
  if (a.quant.block) {
    const std::string why = dev::exactInstead(p_.id, p_.plan, a);
    if (!why.empty()) {
      HC_INFO("{} runs exact: {}", describe(a), why);
      run.quant.packed = run.quant.exact = true;
    }
  }
  const dev::DeviceChoice d = dev::decide(p_.id, p_.plan, dev::planArgs(run), status_, hier_.get());
  if (d.fallback) {
    HC_CHECK(!isBitwise(a.op.kind), hcUnsupported,
             "{}: NCCL has no {} reduction and this call would run on the NCCL fallback ({})", describe(a),
             opName(a.op.kind), d.reason);
    HC_INFO("fallback: {} runs{} on NCCL: {}", describe(a), dev::quantizes(run) ? " exact" : "", d.reason);
    p_.stats.countCall(a.coll, hcPathFallback, d.reason);
    fallback().run(a);  // NCCL has no quantized form: the exact collective
    return;
  }
  HC_TRACE("{}: device hierarchical path", describe(a));
  p_.stats.countCall(a.coll, hcPathHierarchical);
  hier_->forEachPeerBytes(run, [this, &a](int peer, size_t bytes) { p_.stats.countBytes(a.coll, peer, bytes); });
  hier_->enqueue(run);
  if (hier_->wireBlock(run)) p_.stats.countQuantized(a.coll);
}

void CudaDeviceEngine::enqueueP2p(const DeviceP2p& p) {
  ScopedLogRank log_rank(p_.id.rank);
  const auto what = [&p] {
    return fmt::format("{} of {} x {} {} rank {}", p.send ? "hcSend" : "hcRecv", p.count, dtypeName(p.dtype),
                       p.send ? "to" : "from", p.peer);
  };
  HC_CHECK(device_ >= 0, hcSystemError, "{}: no usable CUDA device", what());
  dev::DeviceGuard g(device_);
  if (p.count) checkBuffer(p.buf, p.send ? "sendbuff" : "recvbuff", what);
  HC_TRACE("{}: on NCCL (the device path has no point-to-point of its own)", what());
  fallback().sendRecv(p.send, p.buf, p.count, p.dtype, p.peer, p.stream, p.grouped);
  p_.stats.countP2p(p.send, p.count * typeSize(p.dtype));
}

}  // namespace

std::unique_ptr<DeviceEngine> makeDeviceEngine(const DeviceParts& parts) {
  return std::make_unique<CudaDeviceEngine>(parts);
}

namespace {
// Whether this process sees a CUDA device: -1 until asked (racing first asks agree).
std::atomic<int> g_any_device{-1};

[[gnu::noinline]] int countDevices() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  g_any_device.store(ok ? 1 : 0, std::memory_order_relaxed);
  return ok ? 1 : 0;
}

bool anyDevice() {
  const int v = g_any_device.load(std::memory_order_relaxed);
  return (v < 0 ? countDevices() : v) != 0;
}

[[gnu::noinline]] bool queryDevicePointer(const void* ptr) {
  cudaPointerAttributes at{};
  if (cudaPointerGetAttributes(&at, ptr) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver, no device, or not a CUDA pointer
    return false;
  }
  return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}
}  // namespace

bool isDevicePointer(const void* ptr) {
  // Without a device (or a driver) nothing is a device pointer: skip the query, which every
  // host collective would otherwise pay twice per call (and the query's frame with it).
  return ptr && anyDevice() && queryDevicePointer(ptr);
}

}  // namespace hicoll
