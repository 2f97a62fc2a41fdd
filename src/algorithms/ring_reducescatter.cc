// The flat ring ReduceScatter (HICOLL_ALGO=ring, and the host fallback), pipelined in chunks
// so that summing overlaps the transfers.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {

void ringReduceScatter(Run& r, const void* send, void* recv, size_t count) {
  const Identity& id = r.id;
  const size_t b = count * r.esize;
  if (b == 0) return;
  r.beginPhase();
  const int W = id.nranks, me = id.rank;
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  r.post(nullptr, hcCollReduceScatter);
  r.waitAllPosted();
  if (W == 1) {
    const void* src = in;
    reduceN(r.reduceSpec(1, true), out, &src, 1, count);
    return;
  }
  const int next = (me + 1) % W, prev = (me + W - 1) % W;
  const size_t steps = static_cast<size_t>(W - 1);
  // Pipelined in chunks, so summing overlaps the transfers: chunk k's partial of step s leaves
  // as soon as it is summed. Chunks go in groups of up to kGroup, a group's steps in lockstep;
  // each chunk of a group has a slot (received partial, partials sent at even and odd steps)
  // in a workspace the communicator keeps (fresh pages would cost their faults every call).
  // Every rank posts sends and receives in one fixed order of items (group, step, chunk), as
  // the shm transport requires, and each item waits only on earlier ones: no deadlock.
  constexpr size_t kGroup = 8;
  size_t C = std::min(b, r.chunkBytes());
  C = std::max({r.esize, C / r.esize * r.esize, (b >> 20) / r.esize * r.esize + r.esize});  // tags: <= 2^20 chunks
  const size_t K = (b + C - 1) / C, A = std::min(K, kGroup), M = K * steps;
  auto len = [&](size_t k) { return std::min(C, b - k * C); };
  auto block = [&](size_t i, size_t k) {
    return in + (i + static_cast<size_t>(W)) % static_cast<size_t>(W) * b + k * C;
  };
  char* ws = r.buf.workspace(3 * A * C);
  auto rx = [&](size_t slot) { return ws + slot * 3 * C; };
  auto acc = [&](size_t slot, size_t s) { return ws + (slot * 3 + 1 + s % 2) * C; };
  struct Item {
    size_t s, k, slot, group_size, group_start;  // group_start: index of the group's first item
  };
  auto item = [&](size_t n) {
    const size_t g = n / (A * steps), first = g * A, size = std::min(A, K - first), in_group = n - g * A * steps;
    const size_t k = first + in_group % size;
    return Item{in_group / size, k, k % A, size, g * A * steps};
  };
  // The partial of step s covers block me-s-1; a rank adds its input's share of the one it
  // receives at step s (block me-s-2). PreMulSum scales the input before the first send.
  const bool scale_first = r.a.op.kind == OpKind::PreMulSum;
  const size_t me_w = static_cast<size_t>(me) + static_cast<size_t>(W) * steps;  // keeps indices >= 0
  auto tag = [&](const Item& it) { return r.tag(static_cast<unsigned>(it.s), static_cast<unsigned>(it.k)); };
  // Per slot: receive posted and not yet summed; sends in flight from acc[0] / acc[1].
  std::vector<uint8_t> rx_busy(A, 0), recv_done(A, 0), acc_busy(A * 2, 0);
  Run::Pending reqs;  // key: slot * 4 + (0 receive | 1 send of the input | 2 + parity send of acc)
  size_t posted_recv = 0, posted_send = 0, summed = 0;
  r.waitUntil("in the ring ReduceScatter", [&] {
    if (!(summed < M || posted_send < M || !reqs.empty())) return Progress::Done;
    bool moved = r.poll(reqs, [&](size_t key) {
      const size_t slot = key / 4;
      if (key % 4 == 0) recv_done[slot] = 1;
      if (key % 4 >= 2) acc_busy[slot * 2 + key % 2] = 0;
    }) > 0;
    while (posted_recv < M) {
      const Item it = item(posted_recv);
      if (rx_busy[it.slot]) break;
      rx_busy[it.slot] = 1;
      r.recv(reqs, prev, rx(it.slot), len(it.k), tag(it), it.slot * 4);
      ++posted_recv;
      moved = true;
    }
    // At most two groups of sends ahead of the sums (on two ranks every send is of the input).
    while (posted_send < M && posted_send < summed + 2 * A) {
      const Item it = item(posted_send);
      const void* src = nullptr;
      size_t key = it.slot * 4 + 2 + it.s % 2;
      if (it.s == 0 && !scale_first) {
        src = block(me_w - 1, it.k);
        key = it.slot * 4 + 1;
      } else if (it.s == 0) {
        // The slot's previous chunk (a group back) may still sum into acc[0].
        if (summed < it.group_start || acc_busy[it.slot * 2]) break;
        const void* mine = block(me_w - 1, it.k);
        reduceN(r.reduceSpec(1, false), acc(it.slot, 0), &mine, 1, len(it.k) / r.esize);
        src = acc(it.slot, 0);
      } else if (summed > posted_send - it.group_size) {  // this chunk's step s-1 is summed
        src = acc(it.slot, it.s);
      } else {
        break;
      }
      if (key % 4 >= 2) acc_busy[it.slot * 2 + it.s % 2] = 1;
      r.send(reqs, next, src, len(it.k), tag(it), key);
      ++posted_send;
      moved = true;
    }
    while (summed < M) {
      const Item it = item(summed);
      const bool final_step = it.s + 1 == steps;
      if (!recv_done[it.slot] || (!final_step && acc_busy[it.slot * 2 + (it.s + 1) % 2])) break;
      const void* srcs[2] = {block(me_w - it.s - 2, it.k), rx(it.slot)};
      void* dst = final_step ? static_cast<void*>(out + it.k * C) : acc(it.slot, it.s + 1);
      reduceN(r.reduceSpec(1, final_step), dst, srcs, 2, len(it.k) / r.esize);
      recv_done[it.slot] = rx_busy[it.slot] = 0;
      ++summed;
      moved = true;
    }
    return moved ? Progress::Moved : Progress::Idle;
  });
}

}  // namespace hicoll
