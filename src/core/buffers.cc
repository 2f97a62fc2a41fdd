#include "core/buffers.h"

#include "base/error.h"
#include "base/log.h"
#include "transport/shm/node_memory.h"

namespace hicoll {

Buffers::~Buffers() {
  try {
    release();
  } catch (...) {
  }
}

void Buffers::release() {
  std::vector<char>().swap(heap_workspace_);
  if (quant_buf_) nodeMemFree(quant_buf_);
  quant_buf_ = nullptr;
  quant_bytes_ = 0;
  std::vector<char>().swap(quant_heap_);
}

char* Buffers::workspace(size_t bytes) {
  if (heap_workspace_.size() < bytes) {
    heap_workspace_ = std::vector<char>();  // the old contents are not kept: free first
    heap_workspace_.resize(bytes);
  }
  return heap_workspace_.data();
}

char* Buffers::quantBuffer(size_t bytes) {
  if (quant_bytes_ >= bytes) return static_cast<char*>(quant_buf_ ? quant_buf_ : quant_heap_.data());
  release();
  try {
    quant_buf_ = nodeMemAlloc(bytes);
  } catch (const Error& e) {
    // Private memory works too (peers then read it with single-copy reads or through scratch).
    HC_WARN("quantized calls: no node memory for {} bytes ({}); using private memory", bytes, e.what());
    quant_heap_.resize(bytes);
  }
  quant_bytes_ = bytes;
  return static_cast<char*>(quant_buf_ ? quant_buf_ : quant_heap_.data());
}

}  // namespace hicoll
