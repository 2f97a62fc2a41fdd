#include "algorithms/run.h"

#include <algorithm>

#include "core/error.h"

namespace hicoll {

Run::Run(hcComm& c, const CollArgs& args)
    : comm(c), a(args), deadline(c.timeoutMs()), esize(hcTypeSize(args.dtype)), shm(*c.shm) {}

ReduceSpec Run::reduceSpec(uint64_t premul_mask, bool final_step) const {
  ReduceSpec s;
  s.dtype = a.dtype;
  s.kind = a.op.kind;
  s.scalar = a.op.scalar;
  s.premul_mask = premul_mask;
  s.avg_divisor = final_step && a.op.kind == OpKind::Avg ? comm.nranks : 0;
  return s;
}

void Run::post(const void* addr0, size_t count, int phase_kind) {
  Board::Post& b = shm.board(shm.localIndex()).post[seq & 1];
  info_[0] = static_cast<uint64_t>(phase_kind);
  info_[1] = static_cast<uint64_t>(a.dtype);
  info_[2] = count;
  info_[3] = static_cast<uint64_t>(a.op.kind);
  for (int i = 0; i < 4; ++i) b.info[i] = info_[i];
  b.addr[0] = reinterpret_cast<uint64_t>(addr0);
  b.posted.store(seq, std::memory_order_release);
}

void Run::waitPosted(int local) {
  Board::Post& b = shm.board(local).post[seq & 1];
  shm.waitFor([&] { return b.posted.load(std::memory_order_acquire) >= seq; }, deadline,
              "waiting for a local peer to start the collective");
  HC_CHECK(b.posted.load() == seq, hcInternalError, "shm: rank {} is ahead of this phase", shm.commRank(local));
  if (b.info[0] != info_[0] || b.info[1] != info_[1] || b.info[2] != info_[2] || b.info[3] != info_[3])
    HC_THROW(hcInvalidUsage,
             "{}: rank {} called a different collective: its phase {} / {} / count {} / op {} vs this rank's "
             "phase {} / {} / count {} / op {}",
             describe(a), shm.commRank(local), b.info[0], dtypeName(static_cast<hcDataType_t>(b.info[1])), b.info[2],
             b.info[3], info_[0], dtypeName(a.dtype), info_[2], info_[3]);
}

void Run::publish(int stream, uint64_t chunks) {
  shm.board(shm.localIndex()).ready[seq & 1][stream].v.store((seq << 24) | chunks, std::memory_order_release);
}

size_t Run::chunkBytes() const {
  int64_t c = comm.cfg.num(Knob::ChunkBytes);
  if (comm.topo.nnodes > 1) c = std::min(c, comm.cfg.num(Knob::NetChunkBytes));
  return static_cast<size_t>(std::max<int64_t>(c, 4096));
}

size_t Run::netWindow() const {
  return static_cast<size_t>(std::max<int64_t>(comm.cfg.num(Knob::NetWindow), 1));
}

uint64_t Run::readyOf(int local, int stream) {
  uint64_t v = shm.board(local).ready[seq & 1][stream].v.load(std::memory_order_acquire);
  return (v >> 24) == (seq & ((1ull << 40) - 1)) ? (v & 0xffffff) : 0;
}

void Run::waitPeersDone() {
  for (int l = 0; l < shm.localSize(); ++l) {
    if (l == shm.localIndex()) continue;
    Board& b = shm.board(l);
    shm.waitFor([&] { return b.done.load(std::memory_order_acquire) >= seq; }, deadline,
                "waiting for local peers to finish reading");
  }
}

void Run::finishNode(bool peers_read_only_segment) {
  shm.board(shm.localIndex()).done.store(seq, std::memory_order_release);
  if (!peers_read_only_segment) waitPeersDone();
}

void Run::send(Pending& p, int peer, const void* buf, size_t len, uint64_t tag, size_t key) {
  Transport& t = comm.transportTo(peer);
  p.push_back({&t, t.isend(peer, buf, len, tag), key});
  comm.countBytes(a.coll, peer, len);
}

void Run::recv(Pending& p, int peer, void* buf, size_t len, uint64_t tag, size_t key) {
  Transport& t = comm.transportTo(peer);
  p.push_back({&t, t.irecv(peer, buf, len, tag), key});
}

void Run::checkDeadline(const char* what) {
  if (deadline.expired()) HC_THROW(hcTimeout, "{}: timed out after {} ms {}", describe(a), comm.timeoutMs(), what);
}

void Run::idle(bool moved, Backoff& backoff, const char* what) {
  if (moved) {
    backoff.reset();
    return;
  }
  shm.checkPeers();
  if (comm.ofi) comm.ofi->checkFailureNotices();
  checkDeadline(what);
  backoff.pause();
}

void Run::waitAll(Pending& p, const char* what) {
  Backoff backoff;
  while (!p.empty()) idle(poll(p) > 0, backoff, what);
}

}  // namespace hicoll
