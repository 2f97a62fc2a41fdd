// The flat ring AllGather (HICOLL_ALGO=ring, and the host fallback): W-1 steps over
// point-to-point messages, each neighbour reached by its own transport (shm on the node, ofi
// across nodes). Every block crosses every node boundary on its way round: (W-1)/W of the
// output per node.
#include <cstring>

#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {

void ringAllGather(Run& r, const void* send, void* recv, size_t count) {
  hcComm& c = r.comm;
  const size_t b = count * r.esize;
  if (b == 0) return;
  r.beginPhase();
  const int W = c.nranks, me = c.rank;
  char* out = static_cast<char*>(recv);
  r.post(nullptr, hcCollAllGather);  // the node agrees on the call before data moves
  r.waitAllPosted();
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

}  // namespace hicoll
