// AllReduce = ReduceScatter + AllGather over blocks of ceil(count/W) elements (hierarchical
// or ring); buffers up to HICOLL_ALLREDUCE_SMALL_BYTES take the latency path: one AllGather
// of every rank's whole buffer, then the same local reduction on every rank (bitwise equal).
#include <cstring>
#include <vector>

#include "algorithms/run.h"
#include "core/error.h"

namespace hicoll {

void allReduce(Run& r, const void* send, void* recv, size_t count, bool hier) {
  hcComm& c = r.comm;
  if (count == 0) return;
  const int W = c.nranks;
  const size_t bytes = count * r.esize;
  if (bytes <= static_cast<size_t>(c.cfg.num(Knob::AllReduceSmallBytes)) || W == 1) {
    std::vector<char> all(bytes * W);
    if (hier) {
      hierAllGather(r, send, all.data(), count);
    } else {
      ringAllGather(r, send, all.data(), count);
    }
    std::vector<const void*> srcs(W);
    for (int i = 0; i < W; ++i) srcs[i] = all.data() + i * bytes;
    uint64_t mask = W >= 64 ? ~0ull : ((1ull << W) - 1);
    reduceN(r.reduceSpec(mask, true), recv, srcs.data(), W, count);
    return;
  }
  const size_t blk = (count + W - 1) / W;
  const size_t blk_bytes = blk * r.esize;
  const bool padded = blk * W != count;
  // Padding: work in a buffer of W whole blocks; the tail past count is zero.
  std::vector<char> pad_in, pad_out;
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  if (padded) {
    pad_in.assign(blk_bytes * W, 0);
    std::memcpy(pad_in.data(), send, bytes);
    pad_out.resize(blk_bytes * W);
    in = pad_in.data();
    out = pad_out.data();
  }
  char* mine = out + static_cast<size_t>(c.rank) * blk_bytes;
  if (hier) {
    hierReduceScatter(r, in, mine, blk);
    hierAllGather(r, mine, out, blk);
  } else {
    ringReduceScatter(r, in, mine, blk);
    ringAllGather(r, mine, out, blk);
  }
  if (padded) std::memcpy(recv, out, bytes);
}

}  // namespace hicoll
