// Hierarchical ReduceScatter (README.md, "How it works"), the mirror image of the AllGather:
// (1) intra-node by rail: local index l sums, over its node, the blocks owned by ranks (m, l)
//     for every node m, reading the peers' inputs directly (one copy, CMA); on one node the
//     ranks push through their scratch buffers instead (pushReduceScatter);
// (2) inter-node: each partial goes to its owner's rail peer, which sums the N partials.
// Pipelined in chunks. Partials bound for other nodes are staged in a ring of chunk slots in
// the scratch buffer (any scratch size works: chunks shrink to fit); partials received land in
// the sort buffer (slot per node), so the rule is sort >= nodes x block.
#include <algorithm>
#include <cstring>

#include "algorithms/node_small.h"
#include "algorithms/quantize.h"
#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {

namespace {

// One node, every input in node memory (hcMemAlloc): each owner sums its block of every
// peer's input where it lies, in chunks (one pass over the data, no staging).
void sumInNodeMemory(Run& r, const char* in, char* out, size_t count) {
  const Identity& id = r.id;
  const size_t b = count * r.esize;
  const int L = r.shm.localSize(), me = r.shm.localIndex(), n = id.node();
  const size_t mine = static_cast<size_t>(id.topo.rankAt(n, me)) * b;
  std::vector<const char*> base(L);
  for (int l = 0; l < L; ++l) base[l] = l == me ? in : r.mappedPosted(l, 0, b * static_cast<size_t>(id.nranks));
  const uint64_t all_inputs = L >= 64 ? ~0ull : ((1ull << L) - 1);
  ReduceSpec spec = r.reduceSpec(all_inputs, true);
  spec.stream_dst = b >= (8u << 20) && out != in + mine;
  const size_t C = std::max(r.esize, std::min(b, r.chunkBytes()) / r.esize * r.esize);
  std::vector<const void*> srcs(L);
  for (size_t off = 0; off < b; off += C) {
    const size_t len = std::min(C, b - off);
    for (int l = 0; l < L; ++l) srcs[l] = base[l] + mine + off;
    reduceN(spec, out + off, srcs.data(), L, len / r.esize);
    r.checkDeadline("in the intra-node ReduceScatter");
  }
  for (int l = 0; l < L; ++l)
    if (l != me) r.countBytes(id.topo.rankAt(n, l), b);
  r.stats.countNodeMemory(r.a.coll, b * static_cast<size_t>(L - 1));
  r.finishNode();  // peers read this rank's input until they are done
}

// One node: every rank copies the chunks it holds of the others' blocks into slots of its
// scratch buffer, and each owner sums its peers' slots with its own input straight from the
// shared segment. A memcpy pushes faster than a CMA read pulls (perf/results/copybw.txt).
// Streams on the board: 0 = chunks staged, 1 = chunks summed (a slot is free again once every
// owner summed the chunk that used it).
void pushReduceScatter(Run& r, const char* in, char* out, size_t count) {
  const Identity& id = r.id;
  const size_t b = count * r.esize;
  const int L = r.shm.localSize(), me = r.shm.localIndex(), n = id.node();
  auto blockOf = [&](int local) { return static_cast<size_t>(id.topo.rankAt(n, local)) * b; };
  // Small blocks are staged before the post, in the scratch half this phase's parity owns (the
  // AllGather's eager rule, transport/shm/board.h): every peer's blocks are readable once it
  // posted, so the call is one exchange of posts and no wait at its end.
  const Staged stage(r.shm, r.seq, r.buf.scratch_bytes / 2, static_cast<size_t>(L) * b, /*one_node=*/true);
  const bool early = stagesReduceScatter(b, L, stage.half, r.cfg);
  if (early) stageReduceScatter(stage, id.topo, in, b);
  r.post(in, hcCollReduceScatter);
  r.waitAllPosted();
  if (r.allPostedNodeMemory()) return sumInNodeMemory(r, in, out, count);
  if (early) {
    r.countLocalBytes(sumReduceScatter(stage, id.topo, r.reduceSpec(0, true), in, out, count, r.esize));
    return r.finishNode(/*peers_read_only_segment=*/true);
  }
  constexpr size_t kDepth = 4;  // chunks of slots per owner
  size_t C = std::min({b, r.chunkBytes(), r.buf.scratch_bytes / (kDepth * L)});
  C = std::max(r.esize, C / r.esize * r.esize);
  const size_t K = (b + C - 1) / C;
  auto chunkLen = [&](size_t k) { return std::min(C, b - k * C); };
  auto slot = [&](int holder, size_t k, int owner) {
    return r.shm.scratch(holder) + ((k % kDepth) * L + static_cast<size_t>(owner)) * C;
  };
  const uint64_t all_inputs = L >= 64 ? ~0ull : ((1ull << L) - 1);
  ReduceSpec spec = r.reduceSpec(all_inputs, true);
  // A large out-of-place output skips the caches (no read for ownership: ~8% at 32 MiB); in place
  // its lines were just read as a source and are cached, where streaming measured slower.
  spec.stream_dst = b >= (8u << 20) && out != in + blockOf(me);
  std::vector<const void*> srcs(L);
  size_t staged = 0, summed = 0;
  r.waitUntil("in the intra-node ReduceScatter", [&] {
    if (!(summed < K || staged < K)) return Progress::Done;
    bool moved = false;
    bool slots_free = staged < K;
    for (int l = 0; slots_free && staged >= kDepth && l < L; ++l)
      slots_free = l == me || r.readyOf(l, 1) > staged - kDepth;
    if (slots_free) {
      for (int m = 0; m < L; ++m)
        if (m != me) std::memcpy(slot(me, staged, m), in + blockOf(m) + staged * C, chunkLen(staged));
      r.publish(0, ++staged);
      moved = true;
    }
    bool ready = summed < K;
    for (int l = 0; ready && l < L; ++l) ready = l == me || r.readyOf(l, 0) > summed;
    if (ready) {
      const size_t k = summed;
      for (int l = 0; l < L; ++l) {
        srcs[l] = l == me ? static_cast<const void*>(in + blockOf(me) + k * C) : slot(l, k, me);
        if (l != me) r.countBytes(id.topo.rankAt(n, l), chunkLen(k));
      }
      reduceN(spec, out + k * C, srcs.data(), L, chunkLen(k) / r.esize);
      r.publish(1, ++summed);
      moved = true;
    }
    return moved ? Progress::Moved : Progress::Idle;
  });
  r.finishNode();
}

// One phase across nodes: bytes [off, off + len) of every block (b bytes each) of this rank's
// input; out: this rank's block. The sort buffer holds a slot of len per node. Returns whether
// the partials crossed nodes quantized.
bool reducePiece(Run& r, const char* in, char* out, size_t b, size_t off, size_t len) {
  const Identity& id = r.id;
  r.beginPhase();
  const Topology& t = id.topo;
  const int N = t.nnodes, L = r.shm.localSize(), n = id.node(), me = r.shm.localIndex();
  out += off;
  // Chunks are whole elements.
  size_t C = std::min({len, r.chunkBytes(), r.buf.scratch_bytes});
  C = std::max(r.esize, C / r.esize * r.esize);
  const size_t K = (len + C - 1) / C;
  auto chunkLen = [&](size_t k) { return std::min(C, len - k * C); };
  // hcReduceScatterQuantized: the partials cross nodes as int8 images (each no larger than its
  // chunk, so it lands where the chunk would); the node's own sums stay exact. Chunks too
  // small for an image to be smaller go exact (every rank decides alike from the call).
  const size_t qblock = r.a.quant.exact ? 0 : r.a.quant.block;
  auto imageLen = [&](size_t k) { return quant::packedBytes(chunkLen(k) / r.esize, qblock); };
  const bool quantized = qblock && quant::chunkedImageBytes(len, C, r.esize, qblock) != 0;
  auto wireLen = [&](size_t k) { return quantized ? imageLen(k) : chunkLen(k); };
  std::vector<char> image(quantized ? quant::packedBytes(C / r.esize, qblock) : 0);

  r.post(in, hcCollReduceScatter);
  r.waitAllPosted();
  std::vector<const char*> peer_in(L), mapped(L);
  for (int l = 0; l < L; ++l) {
    peer_in[l] = r.postedAddr(l);
    // A peer's input in node memory (hcMemAlloc) is summed where it is, without a copy.
    if (l != me) mapped[l] = r.mappedPosted(l, 0, b * static_cast<size_t>(id.nranks));
  }
  // Other peers' chunks are copied here (one copy, CMA) and summed from cache.
  std::vector<char> tmp(C * L);
  std::vector<const void*> srcs(L);
  const uint64_t all_inputs = L >= 64 ? ~0ull : ((1ull << L) - 1);

  // Sum over the node of chunk k of the block owned by rank `owner` into dst.
  auto nodePartial = [&](int owner, size_t k, void* dst, bool final_step) {
    const size_t at = static_cast<size_t>(owner) * b + off + k * C, n_bytes = chunkLen(k);
    for (int l = 0; l < L; ++l) {
      if (l == me) {
        srcs[l] = in + at;
      } else if (mapped[l]) {
        srcs[l] = mapped[l] + at;
        r.countBytes(t.rankAt(n, l), n_bytes);
        r.stats.countNodeMemory(r.a.coll, n_bytes);
      } else {
        r.shm.read(l, peer_in[l] + at, tmp.data() + l * C, n_bytes);
        r.countBytes(t.rankAt(n, l), n_bytes);
        srcs[l] = tmp.data() + l * C;
      }
    }
    reduceN(r.reduceSpec(all_inputs, final_step), dst, srcs.data(), L, n_bytes / r.esize);
  };

  // Receive every other node's partial of my block, chunk by chunk, into sort slot m.
  char* my_sort = r.shm.sort(me);
  Run::Pending recvs;  // keyed by chunk
  std::vector<size_t> chunk_left(K, N - 1);
  for (size_t k = 0; k < K; ++k)
    for (int m = 0; m < N; ++m) {
      if (m == n) continue;
      r.recv(recvs, t.rankAt(m, me), my_sort + m * len + k * C, wireLen(k), r.tag(1, static_cast<unsigned>(k)), k);
    }
  // Outgoing partials: a ring of chunk slots in scratch, each free again once its send completes.
  const size_t slots = std::clamp<size_t>(r.buf.scratch_bytes / C, 1, 64);
  Run::Pending sends;  // keyed by scratch slot
  std::vector<bool> slot_busy(slots, false);
  size_t next_slot = 0;
  std::vector<bool> own_done(K, false);
  size_t work_k = 0;
  int work_m = 0;  // next partial to compute: chunk work_k for node work_m (own node last)
  size_t finals = 0;
  // As in the AllGather: partials go out at most netWindow() chunks ahead of what this rank
  // has received from its rail peers.
  const size_t window = r.netWindow();
  size_t received_prefix = 0;
  r.waitUntil("in the hierarchical ReduceScatter", [&] {
    if (!(finals < K || work_k < K || !sends.empty())) return Progress::Done;
    bool moved = false;
    moved |= r.poll(sends, [&](size_t slot) { slot_busy[slot] = false; }) > 0;
    moved |= r.poll(recvs, [&](size_t k) { --chunk_left[k]; }) > 0;
    while (received_prefix < K && chunk_left[received_prefix] == 0) ++received_prefix;
    // Next partial, in chunk order; one waits for a free scratch slot if it must travel.
    if (work_k < K && (work_m == n || (!slot_busy[next_slot] && work_k < received_prefix + window))) {
      if (work_m == n) {
        nodePartial(id.rank, work_k, out + work_k * C, false);
        own_done[work_k] = true;
      } else {
        char* slot = r.shm.scratch(me) + next_slot * C;
        int owner = t.rankAt(work_m, me);
        nodePartial(owner, work_k, slot, false);
        if (quantized) {  // the image replaces the partial in its slot
          quant::quantize(slot, chunkLen(work_k) / r.esize, r.a.dtype, qblock, image.data());
          std::memcpy(slot, image.data(), imageLen(work_k));
        }
        r.send(sends, owner, slot, wireLen(work_k), r.tag(1, static_cast<unsigned>(work_k)), next_slot);
        slot_busy[next_slot] = true;
        next_slot = (next_slot + 1) % slots;
      }
      moved = true;
      if (++work_m == N) {
        work_m = 0;
        ++work_k;
      }
    }
    // Final sums, in chunk order, once all partials of a chunk are here.
    while (finals < K && own_done[finals] && chunk_left[finals] == 0) {
      const size_t k = finals++;
      if (quantized) {
        std::vector<const void*> images;
        for (int m = 0; m < N; ++m)
          if (m != n) images.push_back(my_sort + m * len + k * C);
        // This node's partial plus the others' images, summed in fp32, rounded once.
        quant::sumImages(out + k * C, images.data(), images.size(), chunkLen(k) / r.esize, r.a.dtype, qblock,
                         r.a.op.kind == OpKind::Avg ? id.nranks : 0, out + k * C);
      } else {
        std::vector<const void*> parts{out + k * C};
        for (int m = 0; m < N; ++m)
          if (m != n) parts.push_back(my_sort + m * len + k * C);
        reduceN(r.reduceSpec(0, true), out + k * C, parts.data(), N, chunkLen(k) / r.esize);
      }
      moved = true;
    }
    return moved ? Progress::Moved : Progress::Idle;
  });
  r.finishNode();
  return quantized;
}

}  // namespace

void hierReduceScatter(Run& r, const void* send, void* recv, size_t count) {
  const size_t b = count * r.esize;
  if (b == 0) return;
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  const int N = r.id.topo.nnodes;
  if (N == 1) {
    r.beginPhase();
    return pushReduceScatter(r, in, out, count);
  }
  HC_CHECK(r.shm.directRead(), hcInternalError, "hierarchical ReduceScatter needs direct intra-node reads");
  // Every rank cuts alike: the knobs agree across ranks and the count is the call's. Pieces
  // run one after the other (the next one's partials land in the same sort slots).
  const size_t cap = pieceCapBytes(hcCollReduceScatter, b, N, r.cfg, true);
  const Pieces pieces = splitBlock(count, r.esize, cap);
  HC_CHECK(pieces.count > 0, hcInternalError, "ReduceScatter block of {} bytes: no piece fits {} bytes", b, cap);
  bool quantized = false;
  for (size_t p = 0; p < pieces.count; ++p)
    quantized |= reducePiece(r, in, out, b, p * pieces.elems * r.esize, pieces.lenOf(p, count) * r.esize);
  if (quantized) r.stats.countQuantized(hcCollReduceScatter);
}

}  // namespace hicoll
