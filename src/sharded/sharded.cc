// The sharded-parameter layer: groups, gather/free of units, gradient reduction, the step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#include "sharded/convert.h"
#include "sharded/internal.h"

namespace hicoll::sharded {

// ---- memory accounting -------------------------------------------------------------------

void MemTracker::add(Cat c, long long delta) {
  std::lock_guard<std::mutex> lk(mu_);
  cur_[static_cast<int>(c)] += delta;
  const size_t state = cur_[0] + cur_[1] + cur_[2];
  const size_t transient = cur_[static_cast<int>(Cat::Transient)];
  state_peak_ = std::max(state_peak_, state);
  transient_peak_ = std::max(transient_peak_, transient);
  total_peak_ = std::max(total_peak_, state + transient);
}

void MemTracker::fill(Stats& s) const {
  std::lock_guard<std::mutex> lk(mu_);
  s.param_bytes = cur_[static_cast<int>(Cat::Param)];
  s.grad_bytes = cur_[static_cast<int>(Cat::Grad)];
  s.optim_bytes = cur_[static_cast<int>(Cat::Optim)];
  s.state_bytes_peak = state_peak_;
  s.transient_bytes_peak = transient_peak_;
  s.total_bytes_peak = total_peak_;
}

Buffer::Buffer(MemTracker& t, Cat c, size_t bytes) : bytes_(bytes), tracker_(&t), cat_(c) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;
  ptr_ = std::aligned_alloc(64, rounded);
  if (!ptr_) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(ptr_, 0, rounded);
  tracker_->add(cat_, static_cast<long long>(bytes_));
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    tracker_ = o.tracker_;
    cat_ = o.cat_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (ptr_) {
    std::free(ptr_);
    tracker_->add(cat_, -static_cast<long long>(bytes_));
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

// ---- helpers -----------------------------------------------------------------------------

namespace {

// A queued task may wait behind one slow collective: twice the engine's timeout, and a margin.
long defaultWaitMs(hcComm_t world) {
  hcConfig_t cfg = HC_CONFIG_INITIALIZER;
  const long engine_ms = hcCommGetConfig(world, &cfg) == hcSuccess ? static_cast<long>(cfg.timeoutMs) : 120000;
  return 2 * engine_ms + 10000;
}

// algo: HICOLL_ALGO for the new communicator (nullptr: the parent's).
CommPtr split(hcComm_t parent, int color, int key, const char* group, int rank, const char* algo = nullptr) {
  hcComm_t c = nullptr;
  hcConfig_t cfg = HC_CONFIG_INITIALIZER;
  cfg.algo = algo;
  cfg.name = group;
  const hcResult_t r = hcCommSplitConfig(parent, color, key, &c, &cfg);
  if (r != hcSuccess)
    throw Error(std::string("hcCommSplit for the ") + group + " group (color " + std::to_string(color) + ", key " +
                std::to_string(key) + ") failed on rank " + std::to_string(rank) + ": " + hcGetErrorString(r) + ": " +
                hcGetLastError(parent));
  return CommPtr(c);
}

void expectShape(hcComm_t c, int size, int rank, const char* group) {
  int n = -1, r = -1;
  if (hcCommCount(c, &n) != hcSuccess || hcCommUserRank(c, &r) != hcSuccess || n != size || r != rank)
    throw Error(std::string("the ") + group + " communicator has rank " + std::to_string(r) + " of " +
                std::to_string(n) + ", expected rank " + std::to_string(rank) + " of " + std::to_string(size));
}

}  // namespace

void ShardedParams::Impl::call(const std::function<hcResult_t()>& coll, hcComm_t comm) {
  const auto t0 = std::chrono::steady_clock::now();
  const hcResult_t r = coll();
  busy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  // The queue prefixes the task's description (collective, unit, count, group, rank).
  if (r != hcSuccess) throw std::runtime_error(std::string(hcGetErrorString(r)) + ": " + hcGetLastError(comm));
}

std::string ShardedParams::Impl::describe(const char* coll, int unit, size_t count, const char* group) const {
  std::string s = std::string(coll);
  if (unit >= 0) s += " of unit '" + plans[unit].name + "'";
  return s + " (" + std::to_string(count) + " elements) over the " + group + " group on rank " + std::to_string(rank) +
         " of " + std::to_string(world);
}

void ShardedParams::Impl::allReduceDoubles(double* data, size_t n, hcRedOp_t op, hcComm_t comm, const char* group) {
  // The comm thread writes into its own copy so a timed-out wait cannot leave it writing
  // into the caller's memory.
  auto buf = std::make_shared<std::vector<double>>(data, data + n);
  const std::string what = describe("AllReduce(fp64)", -1, n, group);
  auto t = queue->submit(what, [this, buf, op, comm] {
    call([&] { return hcAllReduce(buf->data(), buf->data(), buf->size(), hcFloat64, op, comm, nullptr); }, comm);
    ++n_ar;
  });
  queue->wait(t);
  std::copy(buf->begin(), buf->end(), data);
}

void ShardedParams::Impl::agreeOrThrow(const std::string& local_error, const std::string& what) {
  double failed = local_error.empty() ? 0.0 : rank + 1.0;
  if (world > 1) allReduceDoubles(&failed, 1, hcMax, dp.get(), "data-parallel");
  if (!local_error.empty()) throw Error(what + " failed on rank " + std::to_string(rank) + ": " + local_error);
  if (failed != 0)
    throw Error(what + " failed on rank " + std::to_string(static_cast<int>(failed) - 1) +
                " (its own error names the cause)");
}

void ShardedParams::Impl::checkUnit(int u) const {
  if (u < 0 || u >= static_cast<int>(units.size()))
    throw Error("unit index " + std::to_string(u) + " is outside [0, " + std::to_string(units.size()) + ")");
}

void ShardedParams::Impl::refreshCompute() {
  if (fp32()) return;
  for (size_t u = 0; u < units.size(); ++u)
    fromFloat(opt.compute_dtype, units[u].master.f32(), units[u].compute.data(), plans[u].shard.shard);
  fromFloat(opt.compute_dtype, p_master.f32(), p_compute.data(), pnumel);
}

void ShardedParams::Impl::zeroGrads() {
  for (size_t u = 0; u < units.size(); ++u)
    if (units[u].grad_acc) std::memset(units[u].grad_acc.data(), 0, units[u].grad_acc.size());
  if (p_grad_acc) std::memset(p_grad_acc.data(), 0, p_grad_acc.size());
}

// ---- construction ------------------------------------------------------------------------

ShardedParams::ShardedParams(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardedParams::~ShardedParams() = default;

std::unique_ptr<ShardedParams> ShardedParams::create(hcComm_t world, std::vector<UnitSpec> units, const Options& opt) {
  if (!world) throw Error("create(): the world communicator is null");
  auto im = std::make_unique<Impl>();
  if (hcCommCount(world, &im->world) != hcSuccess || hcCommUserRank(world, &im->rank) != hcSuccess)
    throw Error(std::string("create(): cannot query the world communicator: ") + hcGetLastError(world));
  validate(opt, im->world);
  im->opt = opt;
  if (im->opt.wait_timeout_ms == 0) im->opt.wait_timeout_ms = defaultWaitMs(world);
  im->degree = opt.sharded_data_parallel_degree;
  im->prank = im->rank % im->degree;
  im->rrank = im->rank / im->degree;
  im->nrepl = im->world / im->degree;

  std::set<std::string> unit_names;
  for (const UnitSpec& u : units) {
    if (!unit_names.insert(u.name).second) throw Error("two units are named '" + u.name + "'");
    std::set<std::string> names;
    for (const ParamSpec& p : u.params)
      if (!names.insert(p.name).second) throw Error("unit '" + u.name + "' has two parameters named '" + p.name + "'");
  }
  im->specs = std::move(units);
  im->plans = planUnits(im->specs, opt.sdp_param_persistence_threshold, im->degree, im->prank, opt.shard_alignment);
  if (im->degree > 1)
    for (const UnitPlan& p : im->plans)
      if (p.shard.padded > opt.sdp_max_live_parameters)
        throw Error("unit '" + p.name + "' gathers " + std::to_string(p.shard.padded) +
                    " elements, more than sdp_max_live_parameters=" + std::to_string(opt.sdp_max_live_parameters) +
                    "; split it or raise the cap");

  // Partition groups are blocks of `degree` consecutive ranks (MiCS: with block-ordered nodes
  // they stay inside a node when the degree allows); replication groups take one rank of each.
  im->dp = split(world, 0, im->rank, "data-parallel", im->rank);
  im->part = split(im->dp.get(), im->rrank, im->prank, "partition", im->rank);
  if (!opt.sdp_hierarchical_allgather && im->degree > 1)
    im->part_ag = split(im->dp.get(), im->rrank, im->prank, "partition (ring AllGather)", im->rank, "ring");
  im->repl = split(im->dp.get(), im->prank, im->rrank, "replication", im->rank);
  expectShape(im->dp.get(), im->world, im->rank, "data-parallel");
  expectShape(im->part.get(), im->degree, im->prank, "partition");
  expectShape(im->repl.get(), im->nrepl, im->rrank, "replication");

  MemTracker& m = im->mem;
  const size_t es = im->esize();
  im->units.resize(im->plans.size());
  for (size_t u = 0; u < im->plans.size(); ++u) {
    const size_t n = im->plans[u].shard.shard;
    UnitState& s = im->units[u];
    s.master = Buffer(m, Cat::Param, n * 4);
    if (!im->fp32()) s.compute = Buffer(m, Cat::Param, n * es);
    s.exp_avg = Buffer(m, Cat::Optim, n * 4);
    s.exp_avg_sq = Buffer(m, Cat::Optim, n * 4);
    s.grad_acc = Buffer(m, Cat::Grad, n * 4);
    im->pnumel += im->plans[u].persistent_numel;
  }
  const size_t pn = im->pnumel;
  im->p_master = Buffer(m, Cat::Param, pn * 4);
  if (!im->fp32()) im->p_compute = Buffer(m, Cat::Param, pn * es);
  im->p_avg = Buffer(m, Cat::Optim, pn * 4);
  im->p_avg_sq = Buffer(m, Cat::Optim, pn * 4);
  im->p_grad_acc = Buffer(m, Cat::Grad, pn * 4);
  im->p_grad = Buffer(m, Cat::Grad, pn * es);
  im->loss_scale = opt.compute_dtype == DType::Float16 ? opt.initial_loss_scale : 1.0;
  im->queue = std::make_unique<CommQueue>(im->opt.wait_timeout_ms);
  return std::unique_ptr<ShardedParams>(new ShardedParams(std::move(im)));
}

int ShardedParams::rank() const {
  return impl_->rank;
}
int ShardedParams::worldSize() const {
  return impl_->world;
}
int ShardedParams::degree() const {
  return impl_->degree;
}
int ShardedParams::partitionRank() const {
  return impl_->prank;
}
int ShardedParams::replicationRank() const {
  return impl_->rrank;
}
int ShardedParams::numUnits() const {
  return static_cast<int>(impl_->plans.size());
}
const Options& ShardedParams::options() const {
  return impl_->opt;
}
double ShardedParams::lossScale() const {
  return impl_->loss_scale;
}

const UnitPlan& ShardedParams::plan(int u) const {
  impl_->checkUnit(u);
  return impl_->plans[u];
}

const UnitSpec& ShardedParams::spec(int u) const {
  impl_->checkUnit(u);
  return impl_->specs[u];
}

void ShardedParams::initialize(const Initializer& init) {
  Impl& im = *impl_;
  im.queue->waitAll();
  for (size_t u = 0; u < im.plans.size(); ++u) {
    if (im.units[u].live != UnitState::Live::Free)
      throw Error("initialize(): unit '" + im.plans[u].name + "' is gathered; reshard it first");
    const UnitPlan& plan = im.plans[u];
    for (size_t p = 0; p < plan.params.size(); ++p) {
      const ParamPlacement& pl = plan.params[p];
      std::vector<float> full(pl.numel);
      init(static_cast<int>(u), static_cast<int>(p), full.data(), pl.numel);
      if (pl.persistent) {
        std::copy(full.begin(), full.end(), im.p_master.f32() + pl.offset);
        continue;
      }
      const ShardInfo::Overlap ov = plan.shard.overlap(pl.offset, pl.offset + pl.numel);
      if (ov.count) std::memcpy(im.units[u].master.f32() + ov.local, full.data() + (ov.flat - pl.offset), ov.count * 4);
    }
    std::memset(im.units[u].exp_avg.data(), 0, im.units[u].exp_avg.size());
    std::memset(im.units[u].exp_avg_sq.data(), 0, im.units[u].exp_avg_sq.size());
  }
  if (im.p_avg) std::memset(im.p_avg.data(), 0, im.p_avg.size());
  if (im.p_avg_sq) std::memset(im.p_avg_sq.data(), 0, im.p_avg_sq.size());
  im.zeroGrads();
  im.adam_step = 0;
  im.good_steps = 0;
  im.micro = 0;
  im.synced = false;
  im.loss_scale = im.opt.compute_dtype == DType::Float16 ? im.opt.initial_loss_scale : 1.0;
  im.refreshCompute();
}

// ---- unshard / reshard -------------------------------------------------------------------

namespace {

void issueGather(ShardedParams::Impl& im, int u) {
  UnitState& s = im.units[u];
  const ShardInfo& sh = im.plans[u].shard;
  s.full = Buffer(im.mem, Cat::Transient, sh.padded * im.esize());
  im.live_elems += sh.padded;
  im.live_peak = std::max(im.live_peak, im.live_elems);
  const void* send = im.computeShard(u);
  void* recv = s.full.data();
  const size_t n = sh.shard;
  const hcDataType_t dt = toHc(im.opt.compute_dtype);
  hcComm_t comm = im.agComm();
  const std::string what =
      im.describe(im.opt.sdp_quantized_allgather ? "AllGather(int8)" : "AllGather", u, n, "partition");
  ShardedParams::Impl* p = &im;
  hcQuant q = HC_QUANT_INITIALIZER;
  q.block = im.opt.sdp_quant_block;
  const bool quantized = im.opt.sdp_quantized_allgather;
  s.gather = im.queue->submit(what, [p, send, recv, n, dt, comm, q, quantized] {
    p->call(
        [&] {
          return quantized ? hcAllGatherQuantized(send, recv, n, dt, &q, comm, nullptr)
                           : hcAllGather(send, recv, n, dt, comm, nullptr);
        },
        comm);
    ++p->n_ag;
  });
  s.live = UnitState::Live::Gathering;
}

}  // namespace

void ShardedParams::prefetch(int u) {
  Impl& im = *impl_;
  im.checkUnit(u);
  if (im.degree == 1 || im.units[u].live != UnitState::Live::Free) return;
  if (im.live_elems + im.plans[u].shard.padded > im.opt.sdp_max_live_parameters) {
    ++im.prefetches_paused;  // unshard() gathers it once earlier units are freed
    return;
  }
  ++im.prefetches;
  issueGather(im, u);
}

void ShardedParams::unshard(int u) {
  Impl& im = *impl_;
  im.checkUnit(u);
  if (im.degree == 1) return;  // the shard is the whole unit
  UnitState& s = im.units[u];
  if (s.live == UnitState::Live::Free) {
    if (im.live_elems + im.plans[u].shard.padded > im.opt.sdp_max_live_parameters) {
      std::string live;
      for (size_t i = 0; i < im.units.size(); ++i)
        if (im.units[i].live != UnitState::Live::Free) live += " '" + im.plans[i].name + "'";
      throw Error("unshard('" + im.plans[u].name + "'): " + std::to_string(im.live_elems) +
                  " elements are gathered (units" + live + ") and " + std::to_string(im.plans[u].shard.padded) +
                  " more would exceed " + "sdp_max_live_parameters=" + std::to_string(im.opt.sdp_max_live_parameters) +
                  "; reshard units after use");
    }
    issueGather(im, u);
  }
  if (s.live == UnitState::Live::Gathering) {
    im.queue->wait(s.gather);
    s.gather.reset();
    s.live = UnitState::Live::Live;
  }
}

const void* ShardedParams::param(int u, int p) const {
  const Impl& im = *impl_;
  im.checkUnit(u);
  const UnitPlan& plan = im.plans[u];
  if (p < 0 || p >= static_cast<int>(plan.params.size()))
    throw Error("unit '" + plan.name + "' has no parameter " + std::to_string(p));
  const ParamPlacement& pl = plan.params[p];
  const size_t off = pl.offset * im.esize();
  if (pl.persistent) return static_cast<const char*>(im.persistentCompute()) + off;
  if (im.degree == 1) return static_cast<const char*>(im.computeShard(u)) + off;
  if (im.units[u].live != UnitState::Live::Live)
    throw Error("param('" + plan.name + "', '" + im.specs[u].params[p].name +
                "'): the unit is not gathered; call unshard() first");
  return im.units[u].full.bytes() + off;
}

void ShardedParams::reshard(int u) {
  Impl& im = *impl_;
  im.checkUnit(u);
  UnitState& s = im.units[u];
  if (im.degree == 1 || s.live == UnitState::Live::Free) return;
  if (s.live == UnitState::Live::Gathering) im.queue->wait(s.gather);  // it writes into `full`
  s.gather.reset();
  s.full.reset();
  im.live_elems -= im.plans[u].shard.padded;
  s.live = UnitState::Live::Free;
}

// ---- gradients ---------------------------------------------------------------------------

void* ShardedParams::grad(int u, int p) {
  Impl& im = *impl_;
  im.checkUnit(u);
  const UnitPlan& plan = im.plans[u];
  if (p < 0 || p >= static_cast<int>(plan.params.size()))
    throw Error("unit '" + plan.name + "' has no parameter " + std::to_string(p));
  const ParamPlacement& pl = plan.params[p];
  const size_t off = pl.offset * im.esize();
  if (pl.persistent) return im.p_grad.bytes() + off;
  UnitState& s = im.units[u];
  if (!s.full_grad) s.full_grad = std::make_shared<Buffer>(im.mem, Cat::Transient, plan.shard.padded * im.esize());
  return s.full_grad->bytes() + off;
}

void ShardedParams::reduceGrad(int u) {
  Impl& im = *impl_;
  im.checkUnit(u);
  UnitState& s = im.units[u];
  const UnitPlan& plan = im.plans[u];
  if (s.reduced_in_micro++ > 0) throw Error("reduceGrad('" + plan.name + "') called twice in one micro-batch");
  const DType dt = im.opt.compute_dtype;
  const size_t es = im.esize();
  // Local gradients are means over this rank's samples; the step wants the mean over the
  // global batch and all micro-batches, unscaled.
  const float scale =
      static_cast<float>(1.0 / (static_cast<double>(im.world) * im.opt.gradient_accumulation_steps * im.loss_scale));

  // Persistent parameters: accumulate locally, all-reduced once at the boundary.
  if (plan.persistent_numel) {
    char* g = im.p_grad.bytes() + plan.persistent_begin * es;
    accumulate(dt, g, scale, im.p_grad_acc.f32() + plan.persistent_begin, plan.persistent_numel);
    std::memset(g, 0, plan.persistent_numel * es);
  }

  const ShardInfo& sh = plan.shard;
  if (sh.shard == 0) {
    s.full_grad.reset();
    return;
  }
  if (!s.full_grad)  // this rank wrote no gradient: it still takes part with zeros
    s.full_grad = std::make_shared<Buffer>(im.mem, Cat::Transient, sh.padded * es);
  if (im.degree == 1) {
    accumulate(dt, s.full_grad->data(), scale, s.grad_acc.f32(), sh.shard);
    s.full_grad.reset();
    return;
  }
  std::shared_ptr<Buffer> fg = std::move(s.full_grad);
  const std::vector<ShardInfo::Bucket> buckets = sh.buckets(im.opt.sdp_reduce_bucket_size);
  float* acc = s.grad_acc.f32();
  hcComm_t comm = im.part.get();
  const bool quantized = im.opt.sdp_quantized_reducescatter;
  const std::string what = im.describe(quantized ? "ReduceScatter(int8)" : "ReduceScatter", u, sh.shard, "partition");
  Impl* p = &im;
  hcQuant q = HC_QUANT_INITIALIZER;
  q.block = im.opt.sdp_quant_block;
  im.queue->submit(what, [p, fg, buckets, acc, scale, dt, es, comm, sh, quantized, q] {
    const size_t maxc = buckets.front().count;
    Buffer recv(p->mem, Cat::Transient, maxc * es);
    Buffer pack;
    if (buckets.size() > 1) pack = Buffer(p->mem, Cat::Transient, sh.degree * maxc * es);
    for (const ShardInfo::Bucket& b : buckets) {
      const void* send = fg->data();
      if (buckets.size() > 1) {
        // Column b of every rank's shard, side by side: rank j receives the sum of block j.
        for (int j = 0; j < sh.degree; ++j)
          std::memcpy(pack.bytes() + j * b.count * es, fg->bytes() + (sh.begin(j) + b.local) * es, b.count * es);
        send = pack.data();
      }
      p->call(
          [&] {
            return quantized ? hcReduceScatterQuantized(send, recv.data(), b.count, toHc(dt), hcSum, &q, comm, nullptr)
                             : hcReduceScatter(send, recv.data(), b.count, toHc(dt), hcSum, comm, nullptr);
          },
          comm);
      ++p->n_rs;
      accumulate(dt, recv.data(), scale, acc + b.local, b.count);
    }
  });
}

void ShardedParams::finishMicroStep() {
  Impl& im = *impl_;
  if (im.synced) throw Error("finishMicroStep(): gradients were already synchronized; call step() first");
  for (size_t u = 0; u < im.units.size(); ++u)
    if (im.units[u].reduced_in_micro != 1)
      throw Error("finishMicroStep(): reduceGrad('" + im.plans[u].name +
                  "') was not called in this micro-batch (call it once per unit, in the same "
                  "order on every rank)");
  if (im.micro >= im.opt.gradient_accumulation_steps)
    throw Error("finishMicroStep(): more micro-batches than gradient_accumulation_steps=" +
                std::to_string(im.opt.gradient_accumulation_steps) + " before step()");
  im.queue->waitAll();
  for (UnitState& s : im.units) s.reduced_in_micro = 0;
  ++im.micro;
}

void ShardedParams::synchronizeGradients() {
  Impl& im = *impl_;
  const Options& o = im.opt;
  if (im.synced) return;
  if (im.micro != o.gradient_accumulation_steps)
    throw Error(
        "synchronizeGradients()/step(): " + std::to_string(im.micro) +
        " micro-batches finished, but gradient_accumulation_steps=" + std::to_string(o.gradient_accumulation_steps));
  for (size_t u = 0; u < im.units.size(); ++u)
    if (im.units[u].live != UnitState::Live::Free)
      throw Error("step(): unit '" + im.plans[u].name +
                  "' is still gathered; reshard every "
                  "unit before step()");
  im.queue->waitAll();

  // MiCS's second hop, once per accumulation boundary: the partition groups' shards are
  // summed across the replication group; persistent gradients across everyone.
  auto allReduceFloats = [&](float* data, size_t n, hcComm_t comm, const char* group, int unit) {
    for (size_t off = 0; off < n; off += o.sdp_reduce_bucket_size) {
      const size_t c = std::min(o.sdp_reduce_bucket_size, n - off);
      float* d = data + off;
      const std::string what = im.describe("AllReduce", unit, c, group);
      Impl* p = &im;
      im.queue->submit(what, [p, d, c, comm] {
        p->call([&] { return hcAllReduce(d, d, c, hcFloat32, hcSum, comm, nullptr); }, comm);
        ++p->n_ar;
      });
    }
  };
  if (im.nrepl > 1)
    for (size_t u = 0; u < im.units.size(); ++u)
      allReduceFloats(im.units[u].grad_acc.f32(), im.plans[u].shard.shard, im.repl.get(), "replication",
                      static_cast<int>(u));
  if (im.world > 1 && im.pnumel) allReduceFloats(im.p_grad_acc.f32(), im.pnumel, im.dp.get(), "data-parallel", -1);
  im.queue->waitAll();
  im.synced = true;
}

StepResult ShardedParams::step(double lr) {
  Impl& im = *impl_;
  const Options& o = im.opt;
  synchronizeGradients();
  im.synced = false;

  // Global L2 norm. Every partition group holds the same shards, so the data-parallel sum
  // counts each element nrepl times; one AllReduce gives every rank the same value.
  double sharded_sq = 0;
  for (size_t u = 0; u < im.units.size(); ++u)
    sharded_sq += sumSquares(im.units[u].grad_acc.f32(), im.plans[u].shard.shard);
  if (im.world > 1) {
    im.allReduceDoubles(&sharded_sq, 1, hcSum, im.dp.get(), "data-parallel");
    sharded_sq /= im.nrepl;
  }
  const double norm = std::sqrt(sharded_sq + sumSquares(im.p_grad_acc.f32(), im.pnumel));

  StepResult res;
  res.grad_norm = norm;
  ++im.steps;
  im.micro = 0;
  if (!std::isfinite(norm)) {  // fp16 overflow (or a diverged run): skip, back off the scale
    ++im.skipped;
    res.skipped = true;
    if (o.compute_dtype == DType::Float16) {
      im.loss_scale = std::max(o.min_loss_scale, im.loss_scale / 2);
      im.good_steps = 0;
    }
    im.zeroGrads();
    res.loss_scale = im.loss_scale;
    return res;
  }
  if (o.sdp_gradient_clipping > 0) {
    const double c = o.sdp_gradient_clipping / (norm + 1e-6);  // torch's clip_grad_norm_
    if (c < 1) res.clip_coef = c;
  }

  ++im.adam_step;
  AdamWStep st{lr,
               o.beta1,
               o.beta2,
               o.eps,
               0.0,
               1.0 - std::pow(o.beta1, static_cast<double>(im.adam_step)),
               1.0 - std::pow(o.beta2, static_cast<double>(im.adam_step)),
               static_cast<float>(res.clip_coef)};
  for (size_t u = 0; u < im.units.size(); ++u) {
    const UnitPlan& plan = im.plans[u];
    UnitState& s = im.units[u];
    for (size_t p = 0; p < plan.params.size(); ++p) {
      const ParamPlacement& pl = plan.params[p];
      st.weight_decay = im.specs[u].params[p].weight_decay ? o.weight_decay : 0.0;
      if (pl.persistent) {
        const size_t i = pl.offset;
        adamw(st, im.p_master.f32() + i, im.p_avg.f32() + i, im.p_avg_sq.f32() + i, im.p_grad_acc.f32() + i, pl.numel);
        continue;
      }
      const ShardInfo::Overlap ov = plan.shard.overlap(pl.offset, pl.offset + pl.numel);
      if (ov.count)  // padding is never updated: its gradient and moments stay zero
        adamw(st, s.master.f32() + ov.local, s.exp_avg.f32() + ov.local, s.exp_avg_sq.f32() + ov.local,
              s.grad_acc.f32() + ov.local, ov.count);
    }
  }
  if (o.compute_dtype == DType::Float16 && ++im.good_steps >= o.loss_scale_window) {
    im.loss_scale *= 2;
    im.good_steps = 0;
  }
  im.refreshCompute();
  im.zeroGrads();
  res.loss_scale = im.loss_scale;
  return res;
}

void ShardedParams::allReduceSum(double* data, size_t count) {
  if (impl_->world > 1) impl_->allReduceDoubles(data, count, hcSum, impl_->dp.get(), "data-parallel");
}

std::vector<float> ShardedParams::Impl::gatherParam(int u, int p, const float* shard_src, const float* persistent_src) {
  checkUnit(u);
  const UnitPlan& plan = plans[u];
  if (p < 0 || p >= static_cast<int>(plan.params.size()))
    throw Error("unit '" + plan.name + "' has no parameter " + std::to_string(p));
  const ParamPlacement& pl = plan.params[p];
  if (pl.persistent) return std::vector<float>(persistent_src + pl.offset, persistent_src + pl.offset + pl.numel);
  if (degree == 1) return std::vector<float>(shard_src + pl.offset, shard_src + pl.offset + pl.numel);
  auto full = std::make_shared<Buffer>(mem, Cat::Transient, plan.shard.padded * 4);
  const size_t n = plan.shard.shard;
  hcComm_t comm = part.get();
  const std::string what = describe("AllGather(fp32)", u, n, "partition");
  Impl* ip = this;
  auto t = queue->submit(what, [ip, full, shard_src, n, comm] {
    ip->call([&] { return hcAllGather(shard_src, full->data(), n, hcFloat32, comm, nullptr); }, comm);
    ++ip->n_ag;
  });
  queue->wait(t);
  return std::vector<float>(full->f32() + pl.offset, full->f32() + pl.offset + pl.numel);
}

std::vector<float> ShardedParams::gatherMaster(int u, int p) {
  Impl& im = *impl_;
  im.checkUnit(u);
  return im.gatherParam(u, p, im.units[u].master.f32(), im.p_master.f32());
}

std::vector<float> ShardedParams::gatherGrad(int u, int p) {
  Impl& im = *impl_;
  im.checkUnit(u);
  if (!im.synced)
    throw Error(
        "gatherGrad(): call synchronizeGradients() first (gradients are complete only "
        "at the accumulation boundary)");
  return im.gatherParam(u, p, im.units[u].grad_acc.f32(), im.p_grad_acc.f32());
}

hcComm_t ShardedParams::communicator(Group g) const {
  switch (g) {
    case Group::DataParallel: return impl_->dp.get();
    case Group::Partition: return impl_->part.get();
    case Group::PartitionAllGather: return impl_->agComm();
    case Group::Replication: return impl_->repl.get();
  }
  return nullptr;
}

Stats ShardedParams::stats() const {
  const Impl& im = *impl_;
  Stats s;
  im.mem.fill(s);
  s.live_params_peak = im.live_peak;
  s.prefetches = im.prefetches;
  s.prefetches_paused = im.prefetches_paused;
  s.allgathers = im.n_ag;
  s.reducescatters = im.n_rs;
  s.allreduces = im.n_ar;
  s.comm_busy_s = im.busy_ns.load() * 1e-9;
  s.comm_wait_s = im.queue->waitSeconds();
  s.steps = im.steps;
  s.skipped_steps = im.skipped;
  return s;
}

}  // namespace hicoll::sharded
