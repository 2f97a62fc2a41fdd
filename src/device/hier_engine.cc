#include "device/hier_engine.h"

#include "device/decision.h"

#include <algorithm>
#include <chrono>

#include "base/deadline.h"
#include "base/error.h"
#include "base/log.h"

namespace hicoll::dev {
namespace {

using Clock = std::chrono::steady_clock;

// cudaMemcpy2DAsync refuses pitches above the device's limit; stay well below it.
constexpr size_t kMaxPitch = size_t{1} << 30;

size_t roundChunk(size_t q, size_t esize) {
  if (q >= 256) return q - q % 256;
  return q - q % esize;
}

// A buffer cut into parts fixed slots. The slot of a step never depends on the collective, so
// the slot of step s and the one of step s-1 never overlap whatever their chunk sizes.
size_t slotBytes(size_t total, size_t parts) {
  const size_t s = total / parts;
  return s >= 256 ? s - s % 256 : s - s % 8;
}

long elapsedMs(Clock::time_point since) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

}  // namespace

BufferSizes bufferSizes(int local_ranks, int nnodes, size_t chunk, size_t scratch_knob, size_t sort_knob) {
  const size_t D = kDepth, L = static_cast<size_t>(local_ranks), N = static_cast<size_t>(nnodes);
  BufferSizes s;
  s.dsort = std::min(sort_knob, D * L * N * chunk);
  if (N > 1) {
    s.dwork = (D + 1) * N * chunk;
    s.hscratch = std::min(scratch_knob, D * N * chunk);
    s.hsort = std::min(sort_knob, D * N * chunk);
  }
  return s;
}

HierEngine::HierEngine(Resources res, std::unique_ptr<DevStream> stream)
    : res_(std::move(res)), stream_(std::move(stream)) {
  const Topology& t = res_.topo;
  HC_CHECK(t.uniform && t.nranks > 0, hcInternalError, "device path: needs the same number of ranks on every node");
  W_ = t.nranks;
  N_ = t.nnodes;
  n_ = t.node_of[res_.rank];
  l_ = t.local_of[res_.rank];
  L_ = t.localSize(n_);
  HC_CHECK(static_cast<int>(res_.dsort.size()) == L_, hcInternalError, "device path: {} sort buffers for {} local ranks",
           res_.dsort.size(), L_);
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
    Deadline d(res_.timeout_ms);
    Backoff bo;
    while (!stream_->idle() && !d.expired()) bo.pause();
    if (!stream_->idle())
      HC_WARN("device path: the stream still has work {} ms after its counters were released", res_.timeout_ms);
  }
}

// ---- planning -------------------------------------------------------------------------

size_t HierEngine::chunkBytes(Kind k, size_t e) const {
  const size_t L = static_cast<size_t>(L_), N = static_cast<size_t>(N_);
  size_t q = res_.chunk_bytes;
  switch (k) {
    case Kind::AllGather:
      q = std::min(q, dslot_ / N);
      if (N > 1) q = std::min({q, hsslot_, hrslot_ / N});
      break;
    case Kind::ReduceScatter:
      q = std::min(q, dslot_ / (L * N));
      if (N > 1) q = std::min({q, wslot_ / N, hsslot_ / N, hrslot_ / N});
      break;
    case Kind::Broadcast:
      q = std::min(q, dslot_);
      if (N > 1) q = std::min({q, hsslot_, hrslot_});
      break;
  }
  return roundChunk(q, e);
}

size_t HierEngine::chunkFor(const CollArgs& a) const {
  const size_t e = hcTypeSize(a.dtype);
  if (e == 0) return 0;
  switch (a.coll) {
    case hcCollAllGather: return chunkBytes(Kind::AllGather, e);
    case hcCollReduceScatter: return chunkBytes(Kind::ReduceScatter, e);
    case hcCollBroadcast: return chunkBytes(Kind::Broadcast, e);
    case hcCollAllReduce:
      if (smallAllReduce(a)) return chunkBytes(Kind::AllGather, e);
      return std::min(chunkBytes(Kind::AllGather, e), chunkBytes(Kind::ReduceScatter, e));
    default: return 0;
  }
}

bool HierEngine::smallAllReduce(const CollArgs& a) const {
  return allReduceIsSmall(a.count, hcTypeSize(a.dtype), W_, res_.allreduce_small_bytes, deviceCapabilities());
}

std::string HierEngine::unsupported(const CollArgs& a) const {
  const size_t e = hcTypeSize(a.dtype);
  if (e == 0) return fmt::format("datatype {} has no device kernel", static_cast<int>(a.dtype));
  if (a.coll != hcCollAllGather && a.coll != hcCollReduceScatter && a.coll != hcCollAllReduce &&
      a.coll != hcCollBroadcast)
    return fmt::format("{} has no device path", collName(a.coll));
  const bool reduces = a.coll == hcCollReduceScatter ||
                       (a.coll == hcCollAllReduce && !smallAllReduce(a));
  if (reduces && L_ > kMaxReduceInputs)
    return fmt::format("{} ranks per node exceed the {} inputs of the device reduction", L_, kMaxReduceInputs);
  if (reduces && N_ > kMaxReduceInputs)
    return fmt::format("{} nodes exceed the {} inputs of the device reduction", N_, kMaxReduceInputs);
  if (chunkFor(a) == 0)
    return fmt::format("device staging buffers too small for one {}-byte element per chunk ({} nodes x {} local ranks; "
                       "SMDDP_AG_SORT_BUFFER_SIZE_BYTES / SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES)",
                       e, N_, L_);
  return "";
}

void HierEngine::forEachPeerBytes(const CollArgs& a, const std::function<void(int, size_t)>& fn) const {
  const Topology& t = res_.topo;
  const size_t e = hcTypeSize(a.dtype), N = static_cast<size_t>(N_);
  auto hier = [&](size_t b) {  // AllGather and ReduceScatter move the same bytes
    for (int p = 0; p < L_; ++p)
      if (p != l_) fn(t.rankAt(n_, p), N * b);
    for (int m = 0; m < N_; ++m)
      if (m != n_) fn(t.rankAt(m, l_), b);
  };
  switch (a.coll) {
    case hcCollAllGather:
    case hcCollReduceScatter: hier(a.count * e); break;
    case hcCollAllReduce:
      if (smallAllReduce(a)) {
        hier(a.count * e);
      } else {
        const size_t bb = allReduceBlock(a.count, W_, deviceCapabilities()) * e;
        hier(bb);
        hier(bb);
      }
      break;
    case hcCollBroadcast: {
      const int n0 = t.node_of[a.root], l0 = t.local_of[a.root];
      if (l_ != l0) break;
      for (int p = 0; p < L_; ++p)
        if (p != l_) fn(t.rankAt(n_, p), a.count * e);
      if (res_.rank == a.root)
        for (int m = 0; m < N_; ++m)
          if (m != n0) fn(t.rankAt(m, l0), a.count * e);
      break;
    }
    default: break;
  }
}

// ---- emission (caller's thread) -------------------------------------------------------

void HierEngine::waitAtLeast(const FlagRef& f, uint64_t v) {
  if (v > 0) stream_->waitFlag(f, static_cast<uint32_t>(v));
}

void HierEngine::waitFreed(const FlagRef& f, uint64_t step) {
  if (step > kDepth) stream_->waitFlag(f, static_cast<uint32_t>(step - kDepth));
}

void HierEngine::copyPieces(bool to_user, char* user, size_t b, size_t off, char* slot, size_t q, int local,
                            size_t len) {
  const Topology& t = res_.topo;
  const int r0 = t.rankAt(0, local);
  bool strided = N_ > 1;
  const long d = N_ > 1 ? static_cast<long>(t.rankAt(1, local)) - r0 : 0;
  for (int m = 1; m < N_ && strided; ++m) strided = t.rankAt(m, local) == r0 + m * d;
  strided = strided && d > 0 && static_cast<size_t>(d) * b < kMaxPitch && q < kMaxPitch;
  if (strided) {
    char* u = user + static_cast<size_t>(r0) * b + off;
    const size_t upitch = static_cast<size_t>(d) * b;
    if (to_user)
      stream_->copy2d(u, upitch, slot, q, len, static_cast<size_t>(N_));
    else
      stream_->copy2d(slot, q, u, upitch, len, static_cast<size_t>(N_));
    return;
  }
  for (int m = 0; m < N_; ++m) {
    char* u = user + static_cast<size_t>(t.rankAt(m, local)) * b + off;
    char* s = slot + static_cast<size_t>(m) * q;
    to_user ? stream_->copy(u, s, len) : stream_->copy(s, u, len);
  }
}

ReduceJob HierEngine::reduction(const CollArgs& a, bool first_stage, bool last_stage) const {
  ReduceJob j;
  j.dtype = a.dtype;
  switch (a.op.kind) {
    case OpKind::Prod: j.op = num::Op::Prod; break;
    case OpKind::Max: j.op = num::Op::Max; break;
    case OpKind::Min: j.op = num::Op::Min; break;
    default: j.op = num::Op::Sum; break;  // Sum, Avg, PreMulSum
  }
  j.premul = first_stage && a.op.kind == OpKind::PreMulSum;
  j.scalar = a.op.scalar;
  j.divisor = last_stage && a.op.kind == OpKind::Avg ? W_ : 0;
  return j;
}

void HierEngine::emitAllGather(const char* send, char* recv, size_t b, size_t e, Job& job) {
  const size_t q = std::min(chunkBytes(Kind::AllGather, e), b);
  HC_CHECK(q > 0, hcInternalError, "device AllGather: no chunk fits");
  const size_t K = (b + q - 1) / q, N = static_cast<size_t>(N_);
  const uint64_t S0 = S_, X0 = X_;
  const bool net = N_ > 1;
  const Topology& t = res_.topo;
  auto len = [&](size_t c) { return std::min(q, b - c * q); };
  auto slot = [&](int p, uint64_t s) { return res_.dsort[p] + (s % kDepth) * dslot_; };
  auto hs = [&](uint64_t x) { return res_.hscratch + (x % kDepth) * hsslot_; };
  auto hr = [&](uint64_t x) { return res_.hsort + (x % kDepth) * hrslot_; };
  // Own block to hscratch for the network, once the proxy has sent what the slot held.
  auto stage = [&](size_t c) {
    const uint64_t x = X0 + c + 1;
    waitFreed(mine(Counter::Sent), x);
    stream_->copy(hs(x), send + c * q, len(c));
    stream_->writeFlag(mine(Counter::Staged), static_cast<uint32_t>(x));
  };
  if (net)
    for (size_t c = 0; c < std::min<size_t>(kDepth, K); ++c) stage(c);
  for (size_t c = 0; c < K; ++c) {
    const uint64_t s = S0 + c + 1, x = X0 + c + 1;
    for (int p = 0; p < L_; ++p)
      if (p != l_) waitFreed(cons(p), s);
    char* my = slot(l_, s);
    stream_->copy(my + static_cast<size_t>(n_) * q, send + c * q, len(c));
    if (net) {  // the rail peers' blocks of this chunk, received by the proxy into hsort
      waitAtLeast(mine(Counter::Recvd), x);
      if (n_ > 0) stream_->copy(my, hr(x), static_cast<size_t>(n_) * q);
      if (n_ + 1 < N_)
        stream_->copy(my + (n_ + 1) * q, hr(x) + (n_ + 1) * q, (N - static_cast<size_t>(n_) - 1) * q);
      stream_->writeFlag(mine(Counter::H2d), static_cast<uint32_t>(x));
    }
    stream_->writeFlag(pub(l_), static_cast<uint32_t>(s));
    for (int i = 0; i < L_; ++i) {  // every local rank's slot into place, starting with our own
      const int p = (l_ + i) % L_;
      if (p != l_) waitAtLeast(pub(p), s);
      copyPieces(true, recv, b, c * q, slot(p, s), q, p, len(c));
    }
    stream_->writeFlag(cons(l_), static_cast<uint32_t>(s));
    if (net && c + kDepth < K) stage(c + kDepth);
  }
  if (net) {
    for (size_t c = 0; c < K; ++c) {
      NetStep st;
      st.x = X0 + c + 1;
      for (int m = 0; m < N_; ++m) {
        if (m == n_) continue;
        st.sends.push_back({t.rankAt(m, l_), hs(st.x), len(c)});
        st.recvs.push_back({t.rankAt(m, l_), hr(st.x) + static_cast<size_t>(m) * q, len(c)});
      }
      job.steps.push_back(std::move(st));
    }
    X_ += K;
  }
  S_ += K;
}

void HierEngine::emitReduceScatter(const char* send, char* recv, size_t b, const CollArgs& a, Job& job) {
  const size_t e = hcTypeSize(a.dtype);
  const size_t q = std::min(chunkBytes(Kind::ReduceScatter, e), b);
  HC_CHECK(q > 0 && q % e == 0, hcInternalError, "device ReduceScatter: no chunk fits");
  const size_t K = (b + q - 1) / q, N = static_cast<size_t>(N_);
  const uint64_t S0 = S_, X0 = X_;
  const bool net = N_ > 1;
  const Topology& t = res_.topo;
  auto len = [&](size_t c) { return std::min(q, b - c * q); };
  // Slot of owner p for step s: L sub-slots (one per sender), each N pieces (one per node).
  auto slot = [&](int p, uint64_t s) { return res_.dsort[p] + (s % kDepth) * dslot_; };
  auto partial = [&](uint64_t x) { return res_.dwork + (x % kDepth) * wslot_; };
  char* inbox = res_.dwork + kDepth * wslot_;
  auto hs = [&](uint64_t x) { return res_.hscratch + (x % kDepth) * hsslot_; };
  auto hr = [&](uint64_t x) { return res_.hsort + (x % kDepth) * hrslot_; };
  const size_t nq = static_cast<size_t>(n_) * q, rest = (N - static_cast<size_t>(n_) - 1) * q;

  // Intra-node: push our blocks of rail l' into local rank l''s slot, then reduce our slot:
  // the node's partial sums for the N blocks of our rail.
  auto intra = [&](size_t c) {
    const uint64_t s = S0 + c + 1, x = X0 + c + 1;
    for (int i = 1; i <= L_; ++i) {
      const int p = (l_ + i) % L_;
      if (p != l_) waitFreed(cons(p), s);
      copyPieces(false, const_cast<char*>(send), b, c * q, slot(p, s) + static_cast<size_t>(l_) * N * q, q, p, len(c));
    }
    stream_->writeFlag(pub(l_), static_cast<uint32_t>(s));
    for (int p = 0; p < L_; ++p)
      if (p != l_) waitAtLeast(pub(p), s);
    ReduceJob j = reduction(a, true, !net);
    j.nin = L_;
    for (int p = 0; p < L_; ++p) j.in[p] = slot(l_, s) + static_cast<size_t>(p) * N * q;
    if (net) {
      j.out = partial(x);
      j.n = N * q / e;
    } else {
      j.out = recv + c * q;
      j.n = len(c) / e;
    }
    stream_->reduce(j);
    stream_->writeFlag(cons(l_), static_cast<uint32_t>(s));
    if (net) {  // the partials for the other nodes go out through hscratch
      waitFreed(mine(Counter::Sent), x);
      if (n_ > 0) stream_->copy(hs(x), partial(x), nq);
      if (rest) stream_->copy(hs(x) + nq + q, partial(x) + nq + q, rest);
      stream_->writeFlag(mine(Counter::Staged), static_cast<uint32_t>(x));
    }
  };
  // Inter-node: our own partial plus the N-1 partials our rail peers computed for our block.
  auto final_ = [&](size_t c) {
    const uint64_t x = X0 + c + 1;
    waitAtLeast(mine(Counter::Recvd), x);
    if (n_ > 0) stream_->copy(inbox, hr(x), nq);
    if (rest) stream_->copy(inbox + nq + q, hr(x) + nq + q, rest);
    stream_->writeFlag(mine(Counter::H2d), static_cast<uint32_t>(x));
    ReduceJob j = reduction(a, false, true);
    j.nin = 0;
    j.in[j.nin++] = partial(x) + nq;
    for (int m = 0; m < N_; ++m)
      if (m != n_) j.in[j.nin++] = inbox + static_cast<size_t>(m) * q;
    j.out = recv + c * q;
    j.n = len(c) / e;
    stream_->reduce(j);
  };
  // Software pipelining: the network of chunk c overlaps the intra-node work of chunk c+1.
  for (size_t c = 0; c < K; ++c) {
    intra(c);
    if (net && c > 0) final_(c - 1);
  }
  if (net) {
    final_(K - 1);
    for (size_t c = 0; c < K; ++c) {
      NetStep st;
      st.x = X0 + c + 1;
      for (int m = 0; m < N_; ++m) {
        if (m == n_) continue;
        st.sends.push_back({t.rankAt(m, l_), hs(st.x) + static_cast<size_t>(m) * q, len(c)});
        st.recvs.push_back({t.rankAt(m, l_), hr(st.x) + static_cast<size_t>(m) * q, len(c)});
      }
      job.steps.push_back(std::move(st));
    }
    X_ += K;
  }
  S_ += K;
}

void HierEngine::emitBroadcast(const char* send, char* recv, size_t b, int root, Job& job) {
  const Topology& t = res_.topo;
  const int n0 = t.node_of[root], l0 = t.local_of[root];
  const size_t q = std::min(chunkBytes(Kind::Broadcast, 1), b);
  HC_CHECK(q > 0, hcInternalError, "device Broadcast: no chunk fits");
  const size_t K = (b + q - 1) / q;
  const uint64_t S0 = S_, X0 = X_;
  const bool rail = l_ == l0, net = rail && N_ > 1, is_root = res_.rank == root;
  auto len = [&](size_t c) { return std::min(q, b - c * q); };
  auto slot = [&](int p, uint64_t s) { return res_.dsort[p] + (s % kDepth) * dslot_; };
  auto hs = [&](uint64_t x) { return res_.hscratch + (x % kDepth) * hsslot_; };
  auto hr = [&](uint64_t x) { return res_.hsort + (x % kDepth) * hrslot_; };
  for (size_t c = 0; c < K; ++c) {
    const uint64_t s = S0 + c + 1, x = X0 + c + 1;
    if (rail) {  // the root's rail: holds the chunk in its slot for the node
      for (int p = 0; p < L_; ++p)
        if (p != l_) waitFreed(cons(p), s);
      if (is_root) {
        stream_->copy(slot(l_, s), send + c * q, len(c));
        if (net) {
          waitFreed(mine(Counter::Sent), x);
          stream_->copy(hs(x), send + c * q, len(c));
          stream_->writeFlag(mine(Counter::Staged), static_cast<uint32_t>(x));
          stream_->writeFlag(mine(Counter::H2d), static_cast<uint32_t>(x));  // keeps the counter in step
        }
        if (recv != send) stream_->copy(recv + c * q, send + c * q, len(c));
      } else {
        waitAtLeast(mine(Counter::Recvd), x);
        stream_->copy(slot(l_, s), hr(x), len(c));
        stream_->writeFlag(mine(Counter::H2d), static_cast<uint32_t>(x));
        stream_->writeFlag(mine(Counter::Staged), static_cast<uint32_t>(x));  // keeps the counter in step
        stream_->copy(recv + c * q, slot(l_, s), len(c));
      }
      stream_->writeFlag(pub(l_), static_cast<uint32_t>(s));
    } else {
      waitAtLeast(pub(l0), s);
      stream_->copy(recv + c * q, slot(l0, s), len(c));
    }
    stream_->writeFlag(cons(l_), static_cast<uint32_t>(s));
  }
  if (net) {
    for (size_t c = 0; c < K; ++c) {
      NetStep st;
      st.x = X0 + c + 1;
      if (is_root) {
        for (int m = 0; m < N_; ++m)
          if (m != n0) st.sends.push_back({t.rankAt(m, l0), hs(st.x), len(c)});
      } else {
        st.recvs.push_back({root, hr(st.x), len(c)});
      }
      job.steps.push_back(std::move(st));
    }
    X_ += K;
  }
  S_ += K;
}

void HierEngine::emitAllReduce(const CollArgs& a, Job& job) {
  const size_t e = hcTypeSize(a.dtype), total = a.count * e;
  const char* send = static_cast<const char*>(a.send);
  char* recv = static_cast<char*>(a.recv);
  if (smallAllReduce(a)) {
    // Latency path: gather everything, reduce locally (one round of steps).
    char* all = static_cast<char*>(stream_->allocTemp(static_cast<size_t>(W_) * total));
    emitAllGather(send, all, total, e, job);
    ReduceJob j = reduction(a, true, true);
    j.nin = W_;
    for (int r = 0; r < W_; ++r) j.in[r] = all + static_cast<size_t>(r) * total;
    j.out = recv;
    j.n = a.count;
    stream_->reduce(j);
    stream_->freeTemp(all);
    return;
  }
  // ReduceScatter + AllGather on blocks of ceil(count / W), padded when W does not divide.
  const size_t bb = allReduceBlock(a.count, W_, deviceCapabilities()) * e;
  const size_t mine_off = static_cast<size_t>(res_.rank) * bb;
  if (bb * static_cast<size_t>(W_) == total) {
    emitReduceScatter(send, recv + mine_off, bb, a, job);
    emitAllGather(recv + mine_off, recv, bb, e, job);
    return;
  }
  char* pad = static_cast<char*>(stream_->allocTemp(bb * static_cast<size_t>(W_)));
  stream_->copy(pad, send, total);
  emitReduceScatter(pad, pad + mine_off, bb, a, job);
  emitAllGather(pad + mine_off, pad, bb, e, job);
  stream_->copy(recv, pad, total);
  stream_->freeTemp(pad);
}

void HierEngine::enqueue(const CollArgs& a) {
  throwIfFailed();  // the caller decided (dev::decide, which asked unsupported()) that it runs here
  if (a.count == 0) return;
  const size_t e = hcTypeSize(a.dtype);
  Job job;
  job.id = J_ + 1;
  job.what = describe(a);
  stream_->joinFrom(a.stream);  // if this throws, nothing of the collective is enqueued
  try {
    stream_->writeFlag(mine(Counter::Started), static_cast<uint32_t>(job.id));
    switch (a.coll) {
      case hcCollAllGather:
        emitAllGather(static_cast<const char*>(a.send), static_cast<char*>(a.recv), a.count * e, e, job);
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
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

// ---- failure ----------------------------------------------------------------------------

void HierEngine::throwIfFailed() const {
  if (!failed_) return;
  std::lock_guard<std::mutex> lk(err_mu_);
  throw Error(err_code_ == hcSuccess ? hcInternalError : err_code_, fmt::format("device path failed: {}", err_));
}

void HierEngine::releaseCounters() {
  // Far enough ahead of every value any rank of the node can be waiting for.
  constexpr uint64_t kAhead = uint64_t{1} << 24;
  const uint32_t s = static_cast<uint32_t>(S_ + kAhead), x = static_cast<uint32_t>(X_ + kAhead),
                 j = static_cast<uint32_t>(J_ + kAhead);
  for (int p = 0; p < L_; ++p) {
    storeFlag(pub(p), s);
    storeFlag(cons(p), s);
  }
  for (Counter c : {Counter::Staged, Counter::Sent, Counter::Recvd, Counter::H2d}) storeFlag(mine(c), x);
  storeFlag(mine(Counter::Started), j);
  storeFlag(mine(Counter::Finished), j);
}

bool HierEngine::nodeAborted(std::string* who) const {
  const uint32_t v = loadFlag(res_.flags.abortWord());
  if (v == 0) return false;
  if (who) *who = fmt::format("rank {}", static_cast<long>(v) - 1);
  return true;
}

void HierEngine::abort(hcResult_t code, const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(err_mu_);
    if (failed_) return;
    err_code_ = code;
    err_ = why;
    failed_ = true;
  }
  HC_WARN("device path: {}", why);
  // Tell the node first, then unblock the streams: a peer whose collective completes because
  // of the release finds the abort word set and reports an error instead of a result.
  uint32_t expected = 0;
  __atomic_compare_exchange_n(res_.flags.abortWord().host, &expected, static_cast<uint32_t>(res_.rank + 1), false,
                              __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  releaseCounters();
  cv_.notify_all();  // the proxy aborts the network (it owns the transport)
  done_cv_.notify_all();
}

// ---- proxy thread ------------------------------------------------------------------------

void HierEngine::proxyMain() {
  ScopedLogRank log_rank(res_.rank);
  bool net_aborted = false;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || (failed_ && !net_aborted); });
      if (failed_ && !net_aborted) {
        net_aborted = true;
        if (res_.net) {
          try {
            res_.net->abort();
          } catch (const std::exception& e) {
            HC_WARN("device path: aborting the network: {}", e.what());
          }
        }
      }
      if (stop_) return;
      if (queue_.empty()) continue;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!failed_) {
      try {
        runJob(job);
      } catch (const Error& e) {
        abort(e.code(), e.what());
      } catch (const std::exception& e) {
        abort(hcInternalError, fmt::format("{}: {}", job.what, e.what()));
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      completed_ = job.id;
    }
    done_cv_.notify_all();
  }
}

void HierEngine::waitStream(const Job& job, Counter c, uint64_t v, const char* what) {
  const FlagRef f = mine(c);
  const auto since = Clock::now();
  Backoff bo;
  std::string who;
  while (!reached(loadFlag(f), static_cast<uint32_t>(v))) {
    if (stop_ || failed_) return;
    if (nodeAborted(&who))
      HC_THROW(hcRemoteError, "{}: {} of this node failed while this rank waited for {}", job.what, who, what);
    if (elapsedMs(since) > res_.timeout_ms)
      HC_THROW(hcTimeout, "{}: rank {} waited {} ms for {} (HICOLL_TIMEOUT_MS); a peer of the node is stuck or gone",
               job.what, res_.rank, res_.timeout_ms, what);
    bo.pause();
  }
}

void HierEngine::runJob(const Job& job) {
  // The stream reaches the collective after the user's earlier work, which may take any time:
  // this wait alone is unbounded (stop and failure end it). Everything after it is bounded.
  {
    Backoff bo;
    std::string who;
    while (!reached(loadFlag(mine(Counter::Started)), static_cast<uint32_t>(job.id))) {
      if (stop_ || failed_) return;
      if (nodeAborted(&who)) HC_THROW(hcRemoteError, "{}: {} of this node failed", job.what, who);
      bo.pause();
    }
  }
  const size_t K = job.steps.size();
  if (K > 0) {
    Transport& t = *res_.net;
    std::vector<size_t> left_r(K), left_s(K);
    struct Pending {
      ReqId id;
      size_t step;
      bool recv;
      int peer;
    };
    std::vector<Pending> pending;
    size_t post_r = 0, post_s = 0, done_r = 0, done_s = 0;
    const uint64_t tag_base = (job.id & 0xffffffffull) << 24;
    auto last = Clock::now();
    Backoff bo;
    std::string who;
    while (done_r < K || done_s < K) {
      bool moved = false;
      // Receive into an hsort slot once the stream has copied out what it held.
      while (post_r < K) {
        const uint64_t x = job.steps[post_r].x;
        if (x > kDepth && !reached(loadFlag(mine(Counter::H2d)), static_cast<uint32_t>(x - kDepth))) break;
        for (const Xfer& r : job.steps[post_r].recvs)
          pending.push_back({t.irecv(r.peer, r.buf, r.len, tag_base | (post_r & 0xffffff)), post_r, true, r.peer});
        left_r[post_r] = job.steps[post_r].recvs.size();
        ++post_r;
        moved = true;
      }
      // Send from an hscratch slot once the stream has staged it.
      while (post_s < K) {
        if (!reached(loadFlag(mine(Counter::Staged)), static_cast<uint32_t>(job.steps[post_s].x))) break;
        for (const Xfer& s : job.steps[post_s].sends)
          pending.push_back({t.isend(s.peer, s.buf, s.len, tag_base | (post_s & 0xffffff)), post_s, false, s.peer});
        left_s[post_s] = job.steps[post_s].sends.size();
        ++post_s;
        moved = true;
      }
      if (completeEach(pending, [&](const Pending& p) { return t.test(p.id); },
                       [&](const Pending& p) { --(p.recv ? left_r : left_s)[p.step]; }) > 0)
        moved = true;
      for (; done_r < post_r && left_r[done_r] == 0; ++done_r)
        storeFlag(mine(Counter::Recvd), static_cast<uint32_t>(job.steps[done_r].x));
      for (; done_s < post_s && left_s[done_s] == 0; ++done_s)
        storeFlag(mine(Counter::Sent), static_cast<uint32_t>(job.steps[done_s].x));
      if (moved) {
        last = Clock::now();
        bo.reset();
        continue;
      }
      if (stop_ || failed_) return;
      if (nodeAborted(&who))
        HC_THROW(hcRemoteError, "{}: {} of this node failed during the inter-node exchange", job.what, who);
      if (elapsedMs(last) > res_.timeout_ms) {
        std::string peers;
        for (const Pending& p : pending) peers += fmt::format(" {}{}", p.recv ? "recv<-" : "send->", p.peer);
        HC_THROW(hcTimeout,
                 "{}: rank {} made no network progress for {} ms (HICOLL_TIMEOUT_MS) at step {}/{} (posted recv {} "
                 "send {}; pending:{})",
                 job.what, res_.rank, res_.timeout_ms, std::min(done_r, done_s), K, post_r, post_s,
                 peers.empty() ? " none, waiting for the stream" : peers);
      }
      bo.pause();
    }
  }
  waitStream(job, Counter::Finished, job.id, "its stream to finish the collective");
  std::string who;
  if (nodeAborted(&who)) HC_THROW(hcRemoteError, "{}: {} of this node failed", job.what, who);
}

void HierEngine::drain() {
  const uint64_t target = J_;
  uint64_t seen = completed_;
  auto last = Clock::now();
  // The proxy's waits are bounded by the timeout and name what they waited for; this bound
  // is the backstop for a stream that never reaches the collective at all.
  const long backstop_ms = 2 * res_.timeout_ms + 1000;
  std::unique_lock<std::mutex> lk(mu_);
  while (completed_ < target && !failed_) {
    done_cv_.wait_for(lk, std::chrono::milliseconds(20));
    if (completed_ != seen) {
      seen = completed_;
      last = Clock::now();
    } else if (elapsedMs(last) > backstop_ms) {
      lk.unlock();
      abort(hcTimeout, fmt::format("rank {}: device collectives {}..{} made no progress in {} ms (2 x HICOLL_TIMEOUT_MS); "
                                   "its stream never reached them",
                                   res_.rank, seen + 1, target, backstop_ms));
      break;
    }
  }
  if (lk.owns_lock()) lk.unlock();
  throwIfFailed();
}

}  // namespace hicoll::dev
