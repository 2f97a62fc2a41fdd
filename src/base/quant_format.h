// The sizes of the quantized collectives' packed image (the format is described in
// algorithms/quantize.h): here, below the plan, so that the plan's buffer rules, the cost
// model and the quantizer count the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hicoll::quant {

constexpr size_t kDefaultBlock = 256;
constexpr size_t kMaxBlock = size_t{1} << 24;

// Blocks of count elements (throws hcInvalidArgument for a block of 0 or above kMaxBlock).
size_t numBlocks(size_t count, size_t block);
// Bytes of the packed image of count elements: one fp32 scale per block, one int8 code per
// element, zeros to a multiple of 8 (0 for count 0).
size_t packedBytes(size_t count, size_t block);

// hcReduceScatterQuantized's partials of a b-byte block (elements of esize bytes), cut into
// chunks of chunk bytes and each chunk quantized on its own: the bytes of all the chunks'
// images, or 0 when they cross exact because a chunk's image would not be smaller than the
// chunk (the last, shorter one: not larger). The host and device paths decide with it alike.
size_t chunkedImageBytes(size_t b, size_t chunk, size_t esize, size_t block);

// hcAllGatherQuantized cuts a rank's block into pieces of whole quantization blocks, each
// image at least kMinPieceImage bytes and at most kMaxPieces of them, gathered one after the
// other while the caller quantizes the next and dequantizes the last.
constexpr size_t kMinPieceImage = size_t{1} << 19;
constexpr size_t kMaxPieces = 16;
// Elements per piece (a multiple of block; the last piece may be shorter), and their number.
size_t pieceElems(size_t count, size_t block);
size_t numPieces(size_t count, size_t block);

}  // namespace hicoll::quant
