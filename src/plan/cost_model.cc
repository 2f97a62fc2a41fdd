#include "plan/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/quant_format.h"

namespace hicoll {

const char* algoName(Algo a) {
  return a == Algo::Hier ? "hier" : "ring";
}

double Prediction::total() const {
  return latency + std::max({link, cpu, window}) + fill + after;
}

const char* Prediction::bound() const {
  const double bulk = std::max({link, cpu, window});
  if (after > bulk && after > latency) return "after";
  if (latency >= bulk) return "latency";
  if (bulk == link) return "link";
  return bulk == cpu ? "cpu" : "window";
}

std::string Prediction::terms() const {
  return fmt::format(
      "{:.1f} us = latency {:.1f} + max(link {:.1f}, cpu {:.1f}, window {:.1f}) + fill {:.1f} + after {:.1f}",
      total() * 1e6, latency * 1e6, link * 1e6, cpu * 1e6, window * 1e6, fill * 1e6, after * 1e6);
}

namespace {

struct Ctx {
  const MachineFigures& m;
  const Shape& s;
  size_t N, L, W;
  double share;  // CPU work stretches when the host's ranks outnumber its cores
};

size_t chunks(size_t b, size_t chunk) {
  return b == 0 ? 0 : (b + chunk - 1) / std::max<size_t>(chunk, 1);
}

// Inter-node CPU work of one rank: bytes out and in, and the messages they take.
double netCpu(const Ctx& c, double bytes_each_way, double messages) {
  return 2 * bytes_each_way * c.m.net_cpu_s_per_B + 2 * messages * c.m.net_msg_s;
}

// Hierarchical AllGather of a b-byte block per rank: every rail peer's block over the link in
// one hop (to the sort buffer), then every block of the node copied into rank order.
Prediction hierAllGather(const Ctx& c, size_t b, bool in_place) {
  Prediction p;
  const size_t C = std::min(b, c.s.chunk), K = chunks(b, C);
  p.latency = c.m.call_s + (c.L > 1 ? 2 * c.m.shm_alpha_s : 0) + (c.N > 1 ? c.m.net_alpha_s : 0);
  const double copies = static_cast<double>((c.W - 1) * b + (in_place ? 0 : b));
  p.cpu = copies / c.m.copy_Bps;
  if (c.N > 1) {
    const double out = static_cast<double>((c.N - 1) * b);  // this rank, each way
    p.link = out * static_cast<double>(c.L) / c.m.net_Bps;
    p.cpu += netCpu(c, out, static_cast<double>((c.N - 1) * K));
    p.window = static_cast<double>(K) / static_cast<double>(c.s.window) * 2 * c.m.net_alpha_s;
    // The drain: the last chunk's received blocks copied into rank order (the network stack's
    // work overlaps the transfer).
    p.fill = static_cast<double>(C * (c.N - 1) * c.L) / c.m.copy_Bps * c.share;
  }
  p.cpu *= c.share;
  return p;
}

// Hierarchical ReduceScatter: each rank sums its rail's blocks over the node (reading the
// peers' inputs), sends the N-1 partials to their owners' rail peers, sums the N it receives.
// wire: bytes that cross per byte of partial (below 1 when the partials cross quantized).
Prediction hierReduceScatter(const Ctx& c, size_t b, double wire = 1) {
  Prediction p;
  const size_t C = std::min(b, c.s.chunk), K = chunks(b, C);
  p.latency = c.m.call_s + (c.L > 1 ? 2 * c.m.shm_alpha_s : 0) + (c.N > 1 ? c.m.net_alpha_s : 0);
  const double B = static_cast<double>(b);
  if (c.N == 1) {  // pushed through scratch: L-1 copies out, a sum of L inputs
    p.cpu = (static_cast<double>(c.L - 1) * B) / c.m.copy_Bps + static_cast<double>(c.L) * B / c.m.reduce_Bps;
  } else {
    const double out = static_cast<double>(c.N - 1) * B * wire;
    p.cpu = static_cast<double>(c.N * c.L) * B / c.m.reduce_Bps  // the rail's sums over the node
            + static_cast<double>(c.N) * B / c.m.reduce_Bps      // the owner's sum of N partials
            + out / c.m.copy_Bps                                 // partials staged for the network
            + netCpu(c, out, static_cast<double>((c.N - 1) * K));
    p.link = out * static_cast<double>(c.L) / c.m.net_Bps;
    p.window = static_cast<double>(K) / static_cast<double>(c.s.window) * 2 * c.m.net_alpha_s;
    // The start (the first chunk summed over the node) and the drain (the owner's last sum).
    p.fill = (static_cast<double>(c.N * c.L + c.N) * static_cast<double>(C) / c.m.reduce_Bps) * c.share;
  }
  p.cpu *= c.share;
  return p;
}

// The flat ring: W-1 steps to the next rank, chunks pipelined along the chain. Across nodes
// one rank per node sends over the link (contiguous ranks), and every block crosses it.
Prediction ring(const Ctx& c, size_t b, bool in_place, bool sums) {
  Prediction p;
  const size_t C = std::min(b, c.s.chunk), K = chunks(b, C), steps = c.W - 1;
  const double B = static_cast<double>(b), hops = static_cast<double>(steps);
  // A block's way round: N of the W hops cross nodes.
  const double hop =
      c.N > 1 ? (static_cast<double>(c.N) * c.m.net_alpha_s + static_cast<double>(c.W - c.N) * c.m.shm_alpha_s) /
                    static_cast<double>(c.W)
              : c.m.shm_alpha_s;
  p.latency = c.m.call_s + (c.L > 1 ? c.m.shm_alpha_s : 0) + hops * hop;
  double own = hops * B / c.m.copy_Bps + (in_place || sums ? 0 : B / c.m.copy_Bps);  // every rank's
  if (sums) own += hops * 2 * B / c.m.reduce_Bps;
  p.cpu = own * c.share;
  if (c.N > 1) {
    const double cross =
        static_cast<double>(std::clamp<size_t>(static_cast<size_t>(std::max(1, c.s.ring_cross)), 1, c.L));
    p.link = hops * B * static_cast<double>(std::max(1, c.s.ring_cross)) / c.m.net_Bps;
    // Only the ranks whose ring neighbours are on other nodes do network work: a node's
    // `cross` hops out and as many in, one direction each on the ranks at the ends of a run of
    // contiguous ranks, both on a rank alone on its node (or all ranks, interleaved). The busiest
    // rank's work, or the host's work over its cores when ranks outnumber them.
    const double one_way = netCpu(c, hops * B, hops * static_cast<double>(K)) / 2;
    const double busiest = own + (cross >= static_cast<double>(c.L) ? 2 : 1) * one_way;
    p.cpu = std::max(busiest, c.share * (own + 2 * cross * one_way / static_cast<double>(c.L)));
    p.window = hops * static_cast<double>(K) / static_cast<double>(c.s.window) * 2 * c.m.net_alpha_s;
  }
  // Every link works on every step at once, so the chain adds no bulk of its own (its hops'
  // latencies are in latency); the drain is the last chunk's copy (and sum).
  p.fill = static_cast<double>(C) * (1 / c.m.copy_Bps + (sums ? 2 / c.m.reduce_Bps : 0)) * c.share;
  return p;
}

// The pairwise AllToAll of a b-byte block per pair: each rank's own block and its local
// peers' are copied once; the blocks for other nodes' ranks cross the link straight, the node's
// L ranks sharing it, in chunks with a few in flight per peer.
Prediction pairwise(const Ctx& c, size_t b) {
  Prediction p;
  const size_t C = std::min(b, c.s.chunk), K = chunks(b, C);
  p.latency = c.m.call_s + (c.L > 1 ? 2 * c.m.shm_alpha_s : 0) + (c.N > 1 ? c.m.net_alpha_s : 0);
  const double B = static_cast<double>(b);
  p.cpu = static_cast<double>(c.L) * B / c.m.copy_Bps;
  if (c.N > 1) {
    const double blocks = static_cast<double>((c.N - 1) * c.L);  // to (and from) other nodes
    p.link = blocks * B * static_cast<double>(c.L) / c.m.net_Bps;
    p.cpu += netCpu(c, blocks * B, blocks * static_cast<double>(K));
    const double in_flight = static_cast<double>(c.s.window * std::min<size_t>(c.W - 1, 4));
    p.window = blocks * static_cast<double>(K) / in_flight * 2 * c.m.net_alpha_s;
    p.fill = static_cast<double>(C) / c.m.copy_Bps * c.share;
  }
  p.cpu *= c.share;
  return p;
}

// Phases in sequence: the second's whole time comes after the first.
Prediction then(Prediction a, const Prediction& b) {
  a.after += b.total();
  return a;
}

Prediction gatherAndSum(const Ctx& c, Algo algo, size_t bytes) {
  const double B = static_cast<double>(bytes);
  if (algo == Algo::Hier && c.N == 1 && bytes <= c.s.scratch / 2) {  // staged, summed in place
    Prediction p;
    p.latency = c.m.call_s + (c.L > 1 ? c.m.shm_alpha_s : 0);
    p.cpu = (B / c.m.copy_Bps + static_cast<double>(c.L) * B / c.m.reduce_Bps) * c.share;
    return p;
  }
  Prediction p = algo == Algo::Hier ? hierAllGather(c, bytes, false) : ring(c, bytes, false, false);
  p.after += static_cast<double>(c.W) * B / c.m.reduce_Bps * c.share;  // the sum, after the gather
  return p;
}

Ctx context(const MachineFigures& m, const Shape& s) {
  const size_t N = static_cast<size_t>(std::max(1, s.nodes)), L = static_cast<size_t>(std::max(1, s.local));
  return Ctx{m, s, N, L, N * L, std::max(1.0, static_cast<double>(s.host_ranks) / std::max(1, s.cores))};
}

}  // namespace

Prediction predict(const MachineFigures& m, const Shape& s, hcColl_t coll, Algo algo, size_t bytes, bool in_place,
                   bool allreduce_small) {
  const Ctx c = context(m, s);
  const size_t N = c.N, L = c.L;
  const size_t b = bytes / c.W;  // per-rank block
  switch (coll) {
    case hcCollAllGather: return algo == Algo::Hier ? hierAllGather(c, b, in_place) : ring(c, b, in_place, false);
    case hcCollReduceScatter: return algo == Algo::Hier ? hierReduceScatter(c, b) : ring(c, b, false, true);
    case hcCollAllToAll: return pairwise(c, b);  // its one path, whatever algo
    case hcCollAllReduce: {
      if (allreduce_small) return gatherAndSum(c, algo, bytes);
      const Prediction rs = algo == Algo::Hier ? hierReduceScatter(c, b) : ring(c, b, false, true);
      const Prediction ag = algo == Algo::Hier ? hierAllGather(c, b, true) : ring(c, b, true, false);
      return then(rs, ag);
    }
    default: {
      Prediction p;
      p.latency = m.call_s + (N > 1 ? m.net_alpha_s : 0) + (L > 1 ? 2 * m.shm_alpha_s : 0);
      return p;
    }
  }
}

Prediction predictQuantized(const MachineFigures& m, const Shape& s, hcColl_t coll, Algo algo, size_t bytes,
                            bool in_place, size_t elem, size_t block) {
  const Ctx c = context(m, s);
  const size_t e = std::max<size_t>(elem, 1), n = bytes / c.W / e;  // elements per rank
  const double B = static_cast<double>(n * e), image = static_cast<double>(quant::packedBytes(n, block));
  if (coll == hcCollAllGather) {
    // The images' gather is in place in the image buffer; the user's buffers take only the
    // dequantized output (the own block too, in place or not).
    (void)in_place;
    const size_t P = quant::numPieces(n, block);
    const size_t piece_image = quant::packedBytes(std::min(n, quant::pieceElems(n, block)), block);
    Prediction p = predict(m, s, coll, algo, static_cast<size_t>(image) * c.W, true);
    const Prediction one = predict(m, s, coll, algo, piece_image * c.W, true);
    p.latency += static_cast<double>(P - 1) * one.latency;  // each piece is a call of its own
    const double compute = (B + static_cast<double>(c.W) * B) / m.quant_Bps * c.share;
    if (P == 1) {
      p.after += compute;
    } else {
      p.cpu += compute;
      p.fill += 2 * compute / static_cast<double>(P);  // the first piece's codes, the last one's values
    }
    return p;
  }
  if (coll == hcCollReduceScatter && algo == Algo::Hier && c.N > 1 && image < B) {
    Prediction p = hierReduceScatter(c, n * e, image / B);
    // Each of the N-1 partials sent is quantized, each received one dequantized to fp32.
    p.cpu += static_cast<double>(c.N - 1) * (B + static_cast<double>(n) * 4) / m.quant_Bps * c.share;
    return p;
  }
  return predict(m, s, coll, algo, bytes, in_place);
}

size_t modelWindow(const MachineFigures& m, const Shape& s, size_t floor) {
  if (s.nodes < 2) return floor;
  // Each rank exchanges with N-1 rail peers, the node's L ranks at once: that many flows share
  // the link, and each needs its share of the bandwidth-delay product in flight.
  const double flows = static_cast<double>(s.local) * (s.nodes - 1);
  const double bdp = 2 * m.net_alpha_s * m.net_Bps / flows;
  const size_t w = static_cast<size_t>(std::ceil(bdp / static_cast<double>(std::max<size_t>(s.chunk, 1)))) + 1;
  return std::clamp(w, floor, size_t{1024});
}

Chunking modelChunking(const MachineFigures& m, Shape s, size_t cap, bool window_free,
                       const std::function<Prediction(const Shape&)>& time_at) {
  const size_t window_floor = s.window;
  Chunking best;
  for (size_t chunk = std::max<size_t>(s.chunk, 1);; chunk *= 2) {
    s.chunk = chunk;
    s.window = window_free ? modelWindow(m, s, window_floor) : window_floor;
    const Prediction p = time_at(s);
    if (best.chunk == 0 || p.total() < (1 - kChunkGain) * best.predicted.total()) best = Chunking{chunk, s.window, p};
    if (chunk > cap / 2) break;
  }
  return best;
}

}  // namespace hicoll
