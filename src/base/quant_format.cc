#include "base/quant_format.h"

#include <algorithm>

#include "base/error.h"

namespace hicoll::quant {

size_t numBlocks(size_t count, size_t block) {
  HC_CHECK(block >= 1 && block <= kMaxBlock, hcInvalidArgument, "quantize: block {} out of range", block);
  return count / block + (count % block != 0);
}

size_t packedBytes(size_t count, size_t block) {
  const size_t raw = numBlocks(count, block) * sizeof(float) + count;
  return (raw + 7) / 8 * 8;
}

size_t chunkedImageBytes(size_t b, size_t chunk, size_t esize, size_t block) {
  chunk = std::min(chunk, b);
  if (chunk == 0 || esize == 0) return 0;
  const size_t K = (b + chunk - 1) / chunk, last = b - (K - 1) * chunk;
  const size_t full = packedBytes(chunk / esize, block), tail = packedBytes(last / esize, block);
  if (full >= chunk || tail > last) return 0;
  return (K - 1) * full + tail;
}

size_t pieceElems(size_t count, size_t block) {
  const size_t pieces = std::clamp<size_t>(packedBytes(count, block) / kMinPieceImage, 1, kMaxPieces);
  const size_t blocks = numBlocks(count, block);
  return (blocks + pieces - 1) / pieces * block;
}

size_t numPieces(size_t count, size_t block) {
  const size_t piece = pieceElems(count, block);
  return count == 0 ? 1 : (count + piece - 1) / piece;
}

}  // namespace hicoll::quant
