// The device engine's schedules (caller's thread): the copies, reductions and counter waits
// each collective puts on the stream, and the network steps it leaves to the proxy.
#include "device/hier_engine.h"

#include <algorithm>

#include "base/error.h"
#include "base/quant_format.h"
#include "device/decision.h"

namespace hicoll::dev {
namespace {

// cudaMemcpy2DAsync refuses pitches above the device's limit; stay well below it.
constexpr size_t kMaxPitch = size_t{1} << 30;

}  // namespace

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
    if (to_user) stream_->copy2d(u, upitch, slot, q, len, static_cast<size_t>(N_));
    else stream_->copy2d(slot, q, u, upitch, len, static_cast<size_t>(N_));
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
    case OpKind::Band: j.op = num::Op::Band; break;
    case OpKind::Bor: j.op = num::Op::Bor; break;
    case OpKind::Bxor: j.op = num::Op::Bxor; break;
    default: j.op = num::Op::Sum; break;  // Sum, Avg, PreMulSum
  }
  j.premul = first_stage && a.op.kind == OpKind::PreMulSum;
  j.scalar = a.op.scalar;
  j.divisor = last_stage && a.op.kind == OpKind::Avg ? W_ : 0;
  return j;
}

void HierEngine::emitQuantizedAllGather(const CollArgs& a, Job& job) {
  const size_t block = a.quant.block, img = quant::packedBytes(a.count, block), e = typeSize(a.dtype);
  char* images = static_cast<char*>(stream_->allocTemp(static_cast<size_t>(W_) * img));
  char* own = images + static_cast<size_t>(res_.rank) * img;
  stream_->quantize({a.dtype, block, a.count, a.send, own});
  emitAllGather(own, images, img, 1, job);
  for (int r = 0; r < W_; ++r)
    stream_->dequantize({a.dtype, block, a.count, images + static_cast<size_t>(r) * img,
                         static_cast<char*>(a.recv) + static_cast<size_t>(r) * a.count * e});
  stream_->freeTemp(images);
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
      if (n_ + 1 < N_) stream_->copy(my + (n_ + 1) * q, hr(x) + (n_ + 1) * q, (N - static_cast<size_t>(n_) - 1) * q);
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
  const size_t e = typeSize(a.dtype);
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
  // hcReduceScatterQuantized: the partials for other nodes cross as images (quantized into
  // device memory, then staged: the stream is serial, so one buffer serves every chunk), node
  // m's at m * ib in the slots (ib, a whole chunk's image, is a multiple of 8 and below q, so
  // the kernels' scales stay aligned); the final sum adds them in fp32 (sumQuantized).
  const size_t qb = wireBlock(a), ib = qb ? quant::packedBytes(q / e, qb) : 0;
  auto wire = [&](size_t c) { return qb ? quant::packedBytes(len(c) / e, qb) : len(c); };
  auto img = [&](int m) { return static_cast<size_t>(m) * ib; };
  char* images = qb ? static_cast<char*>(stream_->allocTemp(N * ib)) : nullptr;

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
      if (qb) {
        for (int m = 0; m < N_; ++m) {
          if (m == n_) continue;
          stream_->quantize({a.dtype, qb, len(c) / e, partial(x) + static_cast<size_t>(m) * q, images + img(m)});
          stream_->copy(hs(x) + img(m), images + img(m), wire(c));
        }
      } else {
        if (n_ > 0) stream_->copy(hs(x), partial(x), nq);
        if (rest) stream_->copy(hs(x) + nq + q, partial(x) + nq + q, rest);
      }
      stream_->writeFlag(mine(Counter::Staged), static_cast<uint32_t>(x));
    }
  };
  // Inter-node: our own partial plus the N-1 partials our rail peers computed for our block.
  auto final_ = [&](size_t c) {
    const uint64_t x = X0 + c + 1;
    waitAtLeast(mine(Counter::Recvd), x);
    if (qb) {
      for (int m = 0; m < N_; ++m)
        if (m != n_) stream_->copy(inbox + img(m), hr(x) + img(m), wire(c));
    } else {
      if (n_ > 0) stream_->copy(inbox, hr(x), nq);
      if (rest) stream_->copy(inbox + nq + q, hr(x) + nq + q, rest);
    }
    stream_->writeFlag(mine(Counter::H2d), static_cast<uint32_t>(x));
    if (qb) {
      QuantSumJob j;
      j.dtype = a.dtype;
      j.block = qb;
      j.count = len(c) / e;
      j.own = partial(x) + nq;
      for (int m = 0; m < N_; ++m)
        if (m != n_) j.images[j.nimages++] = inbox + img(m);
      j.out = recv + c * q;
      j.divisor = reduction(a, false, true).divisor;
      stream_->sumQuantized(j);
      return;
    }
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
        const size_t at = qb ? img(m) : static_cast<size_t>(m) * q;
        st.sends.push_back({t.rankAt(m, l_), hs(st.x) + at, wire(c)});
        st.recvs.push_back({t.rankAt(m, l_), hr(st.x) + at, wire(c)});
      }
      job.steps.push_back(std::move(st));
    }
    X_ += K;
  }
  S_ += K;
  if (images) stream_->freeTemp(images);
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
  const size_t e = typeSize(a.dtype), total = a.count * e;
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
  const size_t bb = plan(a).allreduce_block * e;
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

}  // namespace hicoll::dev
