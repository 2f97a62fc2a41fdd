// AllReduce = ReduceScatter + AllGather over blocks of floor(count/W) elements (hierarchical
// or ring); buffers up to HICOLL_ALLREDUCE_SMALL_BYTES, and the last count % W elements, take
// the latency path: one AllGather of every rank's whole buffer, then the same local reduction
// on every rank (bitwise equal).
#include <vector>

#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {

namespace {

// One AllGather of every rank's whole buffer, then the same local reduction on every rank.
void gatherAndReduce(Run& r, const void* send, void* recv, size_t count, bool hier) {
  const int W = r.comm.nranks;
  const size_t bytes = count * r.esize;
  std::vector<char> all(bytes * W);
  hier ? hierAllGather(r, send, all.data(), count) : ringAllGather(r, send, all.data(), count);
  std::vector<const void*> srcs(W);
  for (int i = 0; i < W; ++i) srcs[i] = all.data() + i * bytes;
  const uint64_t mask = W >= 64 ? ~0ull : ((1ull << W) - 1);
  reduceN(r.reduceSpec(mask, true), recv, srcs.data(), W, count);
}

}  // namespace

void allReduce(Run& r, const void* send, void* recv, size_t count, bool hier) {
  hcComm& c = r.comm;
  if (count == 0) return;
  const int W = c.nranks;
  const size_t blk = r.plan->allreduce_block;  // count / W: the plan's host split
  if (r.plan->allreduce_small) {
    gatherAndReduce(r, send, recv, count, hier);
    return;
  }
  // W whole blocks through ReduceScatter + AllGather (in place in recv); the tail of fewer
  // than W elements, if any, through the small path (copying the buffer into a padded one
  // would cost two extra passes over it).
  const size_t main_bytes = blk * W * r.esize;
  char* out = static_cast<char*>(recv);
  char* mine = out + static_cast<size_t>(c.rank) * blk * r.esize;
  if (hier) {
    hierReduceScatter(r, send, mine, blk);
    hierAllGather(r, mine, out, blk);
  } else {
    ringReduceScatter(r, send, mine, blk);
    ringAllGather(r, mine, out, blk);
  }
  if (const size_t tail = count - blk * W)
    gatherAndReduce(r, static_cast<const char*>(send) + main_bytes, out + main_bytes, tail, hier);
}

}  // namespace hicoll
