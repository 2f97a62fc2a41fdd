// The quantized collectives: each rank's block is quantized once where it lives, the exact
// collective moves the packed images (int8 codes and scales) on every level, and every image is
// dequantized on every rank, its own included, so that all replicas hold the same bits.
//
// A large block is cut into pieces of whole quantization blocks, each gathered by its own
// exact call on a helper thread, so that this thread quantizes the next pieces and
// dequantizes the last one while the links carry the current one (the compute would
// otherwise add to the link time). Piece boundaries fall on block boundaries: the images of
// the pieces hold the same scales and codes as one image of the whole block.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "algorithms/host.h"
#include "algorithms/quantize.h"
#include "base/error.h"
#include "base/log.h"
#include "core/comm.h"
#include "plan/plan.h"

namespace hicoll {
namespace {

// HICOLL_DEBUG=INFO: whether the call quantizes, why and the model's time, once per shape.
void logQuantChoice(hcComm& c, const CollArgs& a, const QuantPlan& q) {
  if (logLevel() < LogLevel::kInfo || !q.modelled) return;
  const uint64_t key = (a.count << 12) ^ (static_cast<uint64_t>(a.dtype) << 4) ^ a.coll ^ (uint64_t{1} << 63);
  if (c.plan.model_logged.size() >= 256 || !c.plan.model_logged.insert(key).second) return;
  HC_INFO("{} {}{}{}, predicted {} ({}-bound)", describe(a), q.quantize ? "quantizes" : "runs exact",
          q.why.empty() ? "" : ": ", q.why, q.predicted.terms(), q.predicted.bound());
}

}  // namespace

void runQuantized(hcComm& c, const CollArgs& a) {
  HC_CHECK(a.coll == hcCollAllGather || a.coll == hcCollReduceScatter, hcInternalError, "{}: no quantized form",
           describe(a));
  const QuantPlan q = planQuantized(c.id, c.plan, a, hostCapabilities(c));
  logQuantChoice(c, a, q);
  if (!q.quantize || a.coll == hcCollReduceScatter) {
    // The ReduceScatter quantizes inside the hierarchical path (its inter-node hop); a call
    // that does not quantize runs exact, still described as the quantized call (so a peer
    // calling otherwise is caught).
    CollArgs run = a;
    run.quant.packed = true;
    run.quant.exact = !q.quantize;
    if (run.quant.exact) HC_TRACE("{}: {}", describe(a), q.why);
    return runHostCollective(c, run);
  }
  const size_t block = a.quant.block, W = static_cast<size_t>(c.id.nranks), R = static_cast<size_t>(c.id.rank);
  const size_t e = typeSize(a.dtype), piece = quant::pieceElems(a.count, block);
  const size_t pieces = quant::numPieces(a.count, block);
  // Piece p of rank j: elements [p * piece, + len(p)) of its block; its image at image(p, j).
  std::vector<size_t> off(pieces + 1, 0);  // bytes of the images of pieces < p, per rank
  auto len = [&](size_t p) { return std::min(piece, a.count - p * piece); };
  for (size_t p = 0; p < pieces; ++p) off[p + 1] = off[p] + quant::packedBytes(len(p), block);
  char* images = c.buf.quantBuffer(W * off[pieces]);
  auto image = [&](size_t p, size_t j) { return images + W * off[p] + j * (off[p + 1] - off[p]); };
  const char* src = static_cast<const char*>(a.send);
  char* dst = static_cast<char*>(a.recv);
  // HICOLL_DEBUG=TRACE: when each piece was quantized, gathered and dequantized, in ms from
  // the call's start (one line per call, for perf/quant_timeline.py).
  const bool trace = logLevel() >= LogLevel::kTrace;
  const auto t0 = std::chrono::steady_clock::now();
  auto ms = [&] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<double> quantized_at(pieces), gather_from(pieces), gather_to(pieces), dequantized_at(pieces);
  auto quantizePiece = [&](size_t p) {
    quant::quantize(src + p * piece * e, len(p), a.dtype, block, image(p, R));
    if (trace) quantized_at[p] = ms();
  };
  auto dequantizePiece = [&](size_t p) {
    for (size_t j = 0; j < W; ++j)
      quant::dequantize(image(p, j), len(p), a.dtype, block, dst + (j * a.count + p * piece) * e);
    if (trace) dequantized_at[p] = ms();
  };
  // Piece p is its own call, numbered a.call + p (every rank cuts alike).
  c.links.nextCall(pieces - 1);
  auto gather = [&](size_t p) {
    CollArgs wire = a;
    wire.send = image(p, R);
    wire.recv = image(p, 0);
    wire.dtype = hcUint8;
    wire.count = off[p + 1] - off[p];
    wire.call = a.call + p;
    wire.quant.packed = true;
    if (trace) gather_from[p] = ms();
    runHostCollective(c, wire);
    if (trace) gather_to[p] = ms();
  };

  if (pieces == 1) {
    quantizePiece(0);
    gather(0);
    dequantizePiece(0);
  } else {
    std::mutex mu;
    std::condition_variable cv;
    size_t quantized = 0, gathered = 0;
    std::exception_ptr failure;
    std::thread mover([&] {
      ScopedLogRank lr(c.id.rank, c.id.log_level, c.id.name.c_str());
      try {
        for (size_t p = 0; p < pieces; ++p) {
          {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait(lk, [&] { return quantized > p; });
          }
          gather(p);
          std::lock_guard<std::mutex> lk(mu);
          gathered = p + 1;
          cv.notify_all();
        }
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        failure = std::current_exception();
        cv.notify_all();
      }
    });
    // Every piece of this rank's block is quantized before any output is written (in place,
    // the block lies inside recv).
    for (size_t p = 0; p < pieces; ++p) {
      quantizePiece(p);
      std::lock_guard<std::mutex> lk(mu);
      quantized = p + 1;
      cv.notify_all();
    }
    for (size_t p = 0; p < pieces; ++p) {
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return gathered > p || failure; });
        if (gathered <= p) break;
      }
      dequantizePiece(p);
    }
    mover.join();
    if (failure) std::rethrow_exception(failure);
  }
  if (trace) {
    std::string line;
    for (size_t p = 0; p < pieces; ++p)
      line += fmt::format("{}p{} q {:.2f} g {:.2f}-{:.2f} d {:.2f}", p ? "; " : "", p, quantized_at[p], gather_from[p],
                          gather_to[p], dequantized_at[p]);
    HC_TRACE("{}: timeline (ms) {}", describe(a), line);
  }
  c.stats.countQuantized(a.coll, q.modelled ? q.predicted.total() : 0);
}

}  // namespace hicoll
