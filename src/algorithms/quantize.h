// Block quantization for the quantized collectives: int8, symmetric, one fp32 scale per block.
//
// A rank's `count` elements of dtype (fp32, bf16 or fp16) become a packed image:
//   [nblocks x float absmax][count x int8 codes][zero bytes to a multiple of 8]
// with nblocks = ceil(count / block). Code q of element x in a block of absmax a is
// round-to-nearest-even(x * 127 / a), in [-127, 127]; it dequantizes to q * a / 127, rounded
// once to the output dtype. So |dequant(quant(x)) - x| <= a / 254 plus the output dtype's
// rounding.
//
// The block's absmax itself is stored (not a / 127): it is an input value, exact in fp32 for
// every input dtype, so denormal and huge blocks keep the bound (a / 127 would underflow).
// fp32 rather than fp16 scales: fp16 cannot hold an fp32 or bf16 block's range; the cost is 4
// bytes per block (1.6 % at the default block of 256).
//
// Non-finite inputs: absmax is taken over the block's finite elements; a NaN or +-Inf element
// gets the code -128 (symmetric codes never use it) and dequantizes to NaN. A block of zeros
// (or of non-finite elements only) has absmax 0 and dequantizes to zeros (and NaNs).
//
// Deterministic: the same image dequantizes to the same bits on every rank, so replicas that
// dequantize a gathered image (their own block included) hold identical outputs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/quant_format.h"
#include "hicoll/hicoll.h"

namespace hicoll::quant {

constexpr int8_t kNonFinite = -128;

// Whether dtype can be quantized (fp32, bf16, fp16).
bool quantizable(hcDataType_t dtype);

// Writes the packed image of src (count elements of dtype) to dst (packedBytes(count, block)
// bytes, 4-byte aligned). src and dst must not overlap.
void quantize(const void* src, size_t count, hcDataType_t dtype, size_t block, void* dst);
// Reads a packed image of count elements and writes count elements of dtype to dst.
void dequantize(const void* src, size_t count, hcDataType_t dtype, size_t block, void* dst);
// The final sum of a quantized ReduceScatter: out[i] = (own[i] + the nimages images, each
// dequantized to fp32, added in order) / divisor (when divisor > 0), in fp32, rounded once to
// dtype. own and out are count elements of dtype and may be the same; the images hold count
// elements each. The device kernel (device/quant_kernels.cu) computes the same bits.
void sumImages(const void* own, const void* const* images, size_t nimages, size_t count, hcDataType_t dtype,
               size_t block, int divisor, void* out);

}  // namespace hicoll::quant
