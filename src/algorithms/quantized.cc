// The quantized collectives: each rank's block is quantized once where it lives, the exact
// collective moves the packed images (int8 codes and scales) on every level, and every image is
// dequantized on every rank, its own included, so that all replicas hold the same bits.
#include "algorithms/host.h"
#include "algorithms/quantize.h"
#include "base/error.h"
#include "core/comm.h"

namespace hicoll {

void runQuantized(hcComm& c, const CollArgs& a) {
  HC_CHECK(a.coll == hcCollAllGather, hcInternalError, "{}: no quantized form", describe(a));
  const size_t block = a.quant.block, W = static_cast<size_t>(c.nranks), R = static_cast<size_t>(c.rank);
  const size_t P = quant::packedBytes(a.count, block), e = hcTypeSize(a.dtype);
  char* images = c.quantBuffer(W * P);
  quant::quantize(a.send, a.count, a.dtype, block, images + R * P);
  CollArgs wire = a;
  wire.send = images + R * P;
  wire.recv = images;
  wire.dtype = hcUint8;
  wire.count = P;
  wire.quant.packed = true;
  runHostCollective(c, wire);
  for (size_t j = 0; j < W; ++j)
    quant::dequantize(images + j * P, a.count, a.dtype, block, static_cast<char*>(a.recv) + j * a.count * e);
  c.countQuantized(a.coll);
}

}  // namespace hicoll
