// Memory the ranks of a node can map (hcMemAlloc): a named POSIX shared-memory object per
// allocation, so a local peer reads a buffer that lives here with a plain memcpy (no
// process_vm_readv per chunk, no staging through the segment). Process-wide, not per
// communicator: a tensor may outlive the group that allocated it.
//
// The name stays linked while the allocation lives (a peer maps it when it first sees it in a
// post) and carries the owner's pid, so a later allocation in any process removes the names of
// owners that died. Freed allocations are kept for reuse up to HICOLL_MEM_CACHE_BYTES: a
// training step allocates the same buffers every time, and a peer's mapping of a kept one
// stays valid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hicoll {

// What a post says about the allocation around a buffer (id 0: not node memory).
struct NodeMemRef {
  uint64_t id[2] = {0, 0};  // the random part of its name
  uint64_t base = 0;        // its first byte, in the owner's address space
  uint64_t size = 0;
  bool valid() const { return id[0] != 0 || id[1] != 0; }
};

void* nodeMemAlloc(size_t bytes);  // throws hcSystemError when /dev/shm is full
void nodeMemFree(void* p);         // throws hcInvalidArgument when p is no allocation's start
// The live allocation holding [p, p + 1), or an invalid ref.
NodeMemRef nodeMemFind(const void* p);
// The name of an allocation of process pid.
std::string nodeMemName(int pid, const NodeMemRef& ref);

}  // namespace hicoll
