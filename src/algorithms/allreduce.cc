// AllReduce = ReduceScatter + AllGather over blocks of floor(count/W) elements (hierarchical
// or ring); buffers up to HICOLL_ALLREDUCE_SMALL_BYTES, and the last count % W elements, take
// the latency path: one AllGather of every rank's whole buffer (on one node: every rank's
// buffer staged in its segment), then the same local reduction on every rank (bitwise equal).
#include <cstring>
#include <vector>

#include "algorithms/node_small.h"
#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {

namespace {

// One node: each rank stages its buffer in its segment, in the half of the scratch buffer
// this phase's parity owns (hierAllGather's eager rule: no peer can still be reading it), and
// every rank sums all the staged copies, in rank order, straight into recv: one copy in and
// one pass of sums, no gathered buffer, no system call. Returns false where it does not apply.
bool sumOnNode(Run& r, const void* send, void* recv, size_t count) {
  const Identity& id = r.id;
  const size_t bytes = count * r.esize, half = r.buf.scratch_bytes / 2;
  if (id.topo.nnodes != 1 || !stagesAllReduce(bytes, half)) return false;
  r.beginPhase();
  const Staged stage(r.shm, r.seq, half, bytes, /*one_node=*/true);
  stageAllReduce(stage, send, bytes);
  r.post(send, hcCollAllReduce);
  r.waitAllPosted();
  r.countLocalBytes(sumAllReduce(stage, id.topo, r.reduceSpec(0, true), send, recv, count, r.esize));
  r.finishNode(/*peers_read_only_segment=*/true);
  return true;
}

// One AllGather of every rank's whole buffer, then the same local reduction on every rank.
void gatherAndReduce(Run& r, const void* send, void* recv, size_t count, bool hier) {
  if (hier && sumOnNode(r, send, recv, count)) return;
  const int W = r.id.nranks;
  const size_t bytes = count * r.esize;
  // The communicator's workspace: a vector per call was zero-filled and faulted in every time.
  char* all = r.buf.workspace(bytes * W);
  hier ? hierAllGather(r, send, all, count) : ringAllGather(r, send, all, count);
  std::vector<const void*> srcs(W);
  for (int i = 0; i < W; ++i) srcs[i] = all + i * bytes;
  const uint64_t mask = W >= 64 ? ~0ull : ((1ull << W) - 1);
  reduceN(r.reduceSpec(mask, true), recv, srcs.data(), W, count);
}

}  // namespace

void allReduce(Run& r, const void* send, void* recv, size_t count, bool hier) {
  const Identity& id = r.id;
  if (count == 0) return;
  const int W = id.nranks;
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
  char* mine = out + static_cast<size_t>(id.rank) * blk * r.esize;
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
