// The flat ring (HICOLL_ALGO=ring, and the host fallback): W-1 steps over point-to-point
// messages, each neighbour reached by its own transport (shm on the node, ofi across nodes).
// Every block crosses every node boundary on its way round: (W-1)/W of the output per node.
#include <cstring>
#include <vector>

#include "algorithms/run.h"
#include "core/error.h"

namespace hicoll {

void ringAllGather(Run& r, const void* send, void* recv, size_t count) {
  hcComm& c = r.comm;
  const size_t b = count * r.esize;
  if (b == 0) return;
  r.beginPhase();
  const int W = c.nranks, me = c.rank;
  char* out = static_cast<char*>(recv);
  if (static_cast<const char*>(send) != out + static_cast<size_t>(me) * b)
    std::memcpy(out + static_cast<size_t>(me) * b, send, b);
  const int next = (me + 1) % W, prev = (me + W - 1) % W;
  for (int s = 0; s < W - 1; ++s) {
    const int send_block = (me - s + W) % W, recv_block = (me - s - 1 + 2 * W) % W;
    Run::Pending p;
    r.recv(p, prev, out + static_cast<size_t>(recv_block) * b, b, r.tag(2, s));
    r.send(p, next, out + static_cast<size_t>(send_block) * b, b, r.tag(2, s));
    r.waitAll(p, "in the ring AllGather");
  }
}

void ringReduceScatter(Run& r, const void* send, void* recv, size_t count) {
  hcComm& c = r.comm;
  const size_t b = count * r.esize;
  if (b == 0) return;
  r.beginPhase();
  const int W = c.nranks, me = c.rank;
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  if (W == 1) {
    const void* src = in;
    reduceN(r.reduceSpec(1, true), out, &src, 1, count);
    return;
  }
  const int next = (me + 1) % W, prev = (me + W - 1) % W;
  // acc[s % 2] holds the partial sent at step s; rx receives the neighbour's.
  std::vector<char> acc0(b), acc1(b), rx(b);
  char* acc[2] = {acc0.data(), acc1.data()};
  auto block = [&](int i) { return in + static_cast<size_t>((i % W + W) % W) * b; };
  {
    const void* src = block(me - 1);
    reduceN(r.reduceSpec(1, false), acc[0], &src, 1, count);  // scale my input (premul)
  }
  for (int s = 0; s < W - 1; ++s) {
    Run::Pending p;
    r.recv(p, prev, rx.data(), b, r.tag(3, s));
    r.send(p, next, acc[s % 2], b, r.tag(3, s));
    r.waitAll(p, "in the ring ReduceScatter");
    // The received partial covers block me-s-2; add my input's share of it.
    const bool last = s == W - 2;
    const void* srcs[2] = {block(me - s - 2), rx.data()};
    reduceN(r.reduceSpec(1, last), last ? static_cast<void*>(out) : acc[(s + 1) % 2], srcs, 2, count);
  }
}

void chainBroadcast(Run& r, const void* send, void* recv, size_t count, int root) {
  hcComm& c = r.comm;
  const size_t bytes = count * r.esize;
  if (bytes == 0) return;
  r.beginPhase();
  const int W = c.nranks, me = c.rank;
  char* out = static_cast<char*>(recv);
  if (me == root && send != recv) std::memcpy(out, send, bytes);
  if (W == 1) return;
  // A chain from the root in ring order, pipelined in chunks.
  const int pos = (me - root + W) % W;
  const int next = (me + 1) % W, prev = (me + W - 1) % W;
  const size_t C = std::min<size_t>(bytes, std::max<int64_t>(c.cfg.num(Knob::ChunkBytes), 4096));
  const size_t K = (bytes + C - 1) / C;
  Run::Pending sends;
  for (size_t k = 0; k < K; ++k) {
    const size_t len = std::min(C, bytes - k * C);
    if (pos > 0) {
      Run::Pending p;
      r.recv(p, prev, out + k * C, len, r.tag(4, static_cast<unsigned>(k)));
      r.waitAll(p, "in the chain Broadcast");
    }
    if (pos < W - 1) r.send(sends, next, out + k * C, len, r.tag(4, static_cast<unsigned>(k)));
    r.poll(sends);
  }
  r.waitAll(sends, "in the chain Broadcast");
}

}  // namespace hicoll
