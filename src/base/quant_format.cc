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
