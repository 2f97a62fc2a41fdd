// A communicator's memory for the host algorithms: the scratch and sort buffers in this rank's
// shared-memory segment (readable by the node's ranks, registered with the network), a private
// workspace, and the quantized calls' packed images.
#pragma once

#include <cstddef>
#include <vector>

namespace hicoll {

class Buffers {
 public:
  Buffers() = default;
  ~Buffers();
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  void* sort = nullptr;
  size_t sort_bytes = 0;

  // At least `bytes` of private memory, kept for later calls (grows, never shrinks); valid
  // until the next call of workspace().
  char* workspace(size_t bytes);
  // At least `bytes` of node memory (hcMemAlloc's kind) for the quantized calls' packed images,
  // kept for later calls (grows, never shrinks): local peers read it where it lies. Private
  // memory when node memory cannot be had.
  char* quantBuffer(size_t bytes);
  // Frees what it owns (scratch and sort belong to the shm segment).
  void release();

 private:
  std::vector<char> heap_workspace_;
  void* quant_buf_ = nullptr;  // node memory, or null: then quant_heap_
  std::vector<char> quant_heap_;
  size_t quant_bytes_ = 0;
};

}  // namespace hicoll
