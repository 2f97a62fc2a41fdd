// Memory the ranks of a node can map (hcMemAlloc): one anonymous shared segment per allocation
// (segment.h), its pages reserved when it is allocated, so a local peer reads a buffer that
// lives here with a plain memcpy (no process_vm_readv per chunk, no staging through the
// segment). Process-wide, not per communicator: a tensor may outlive the group that allocated it.
//
// A peer maps an allocation when it first sees it in a post, through the descriptor this
// process keeps open while the allocation lives; nothing has a name, so a kill leaves nothing
// behind. Freed allocations are kept for reuse up to HICOLL_MEM_CACHE_BYTES (a training step
// allocates the same buffers every time, and a peer's mapping of a kept one stays valid); the
// ones released for good are told to the peers through every free log this process publishes
// (one per shm transport, in its segment), and the peers unmap them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace hicoll {

// What a post says about the allocation around a buffer (id 0: not node memory).
struct NodeMemRef {
  uint64_t id = 0;    // random, never 0: tells this allocation from a later one on its inode
  uint64_t ino = 0;   // the segment's inode, fd its descriptor in the owner
  uint64_t base = 0;  // its first byte, in the owner's address space
  uint64_t size = 0;
  int32_t fd = -1;
  int32_t pad = 0;
  bool valid() const { return id != 0; }
};

// The allocations a process released for good, as its local peers read them: a ring of ids.
struct NodeMemFreeLog {
  static constexpr uint64_t kSlots = 64;
  std::atomic<uint64_t> count{0};  // ids written so far; id i is in slot i % kSlots
  std::atomic<uint64_t> id[kSlots] = {};
};

void* nodeMemAlloc(size_t bytes);  // throws hcSystemError when the memory is not there
void nodeMemFree(void* p);         // throws hcInvalidArgument when p is no allocation's start
// The live allocation holding [p, p + 1), or an invalid ref.
NodeMemRef nodeMemFind(const void* p);
// Frees are written to log from now on, until unpublished (a transport's lifetime).
void nodeMemPublishFrees(NodeMemFreeLog* log);
void nodeMemUnpublishFrees(NodeMemFreeLog* log);

}  // namespace hicoll
