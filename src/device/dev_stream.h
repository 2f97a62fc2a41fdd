// What the device path asks of a GPU stream, as an interface: the hierarchical engine
// (hier_engine.h) is written against it, the CUDA backend (cuda_stream.cc) implements it
// with one CUDA call per operation, and the tests implement it with a host thread per stream
// so that the whole protocol (chunks, flags, proxy) runs without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/numeric.h"
#include "hicoll/hicoll.h"

namespace hicoll::dev {

// A 32-bit counter in host memory that both the CPU and the stream can reach.
struct FlagRef {
  volatile uint32_t* host = nullptr;
  uint64_t dev = 0;  // the address the stream uses (registered host memory); 0 for host streams
};

// Counters compare cyclically, like cuStreamWaitValue32's GEQ: (int32_t)(*flag - v) >= 0.
inline bool reached(uint32_t flag, uint32_t v) {
  return static_cast<int32_t>(flag - v) >= 0;
}
inline uint32_t loadFlag(const FlagRef& f) {
  return __atomic_load_n(f.host, __ATOMIC_ACQUIRE);
}
inline void storeFlag(const FlagRef& f, uint32_t v) {
  __atomic_store_n(f.host, v, __ATOMIC_RELEASE);
}

constexpr int kMaxReduceInputs = 64;

// out[i] = fin(op over j of pre(in[j][i])) for i < n. pre multiplies by scalar (pre-multiplied
// sum); fin divides by divisor when divisor > 0 (hcAvg). out may equal an input.
struct ReduceJob {
  hcDataType_t dtype = hcFloat32;
  num::Op op = num::Op::Sum;
  int nin = 0;
  const void* in[kMaxReduceInputs] = {};
  void* out = nullptr;
  size_t n = 0;
  bool premul = false;
  double scalar = 1.0;
  int divisor = 0;
};

// Block quantization (algorithms/quantize.h has the format): quantize writes the packed image
// of count elements of dtype at src to image; dequantize writes them back from image to out.
struct QuantJob {
  hcDataType_t dtype = hcFloat32;
  size_t block = 0;  // elements per scale
  size_t count = 0;
  const void* in = nullptr;  // elements (quantize) or an image (dequantize)
  void* out = nullptr;       // an image (quantize) or elements (dequantize)
};

// The final sum of a quantized ReduceScatter (algorithms/quantize.h's sumImages): out = (own +
// each image dequantized to fp32, in order) / divisor (divisor > 0), in fp32, rounded once to
// dtype. out may equal own.
struct QuantSumJob {
  hcDataType_t dtype = hcFloat32;
  size_t block = 0;
  size_t count = 0;
  const void* own = nullptr;
  int nimages = 0;
  const void* images[kMaxReduceInputs] = {};
  void* out = nullptr;
  int divisor = 0;
};

class DevStream {
 public:
  virtual ~DevStream() = default;
  // Later operations start after what is already enqueued on user (a cudaStream_t).
  virtual void joinFrom(void* user) = 0;
  // Later work on user waits for the operations enqueued so far.
  virtual void joinTo(void* user) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // height rows of width bytes; rows start dpitch / spitch bytes apart.
  virtual void copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) = 0;
  // The store is ordered after every earlier operation's writes (a system-scope fence).
  virtual void writeFlag(const FlagRef& f, uint32_t value) = 0;
  // Later operations wait until reached(*f, value).
  virtual void waitFlag(const FlagRef& f, uint32_t value) = 0;
  virtual void reduce(const ReduceJob& job) = 0;
  virtual void quantize(const QuantJob& job) = 0;
  virtual void dequantize(const QuantJob& job) = 0;
  virtual void sumQuantized(const QuantSumJob& job) = 0;
  // Stream-ordered scratch memory: usable by operations enqueued before freeTemp(p).
  virtual void* allocTemp(size_t bytes) = 0;
  virtual void freeTemp(void* p) = 0;
  // True when every enqueued operation has completed.
  virtual bool idle() = 0;
};

// The host reference of ReduceJob (tests, and the host stream).
void hostReduce(const ReduceJob& job);

}  // namespace hicoll::dev
