// Copies that bypass the caches. A copy much larger than the caches (a node-memory
// AllGather's blocks) writes its destination with non-temporal stores: its lines are not read
// first and the rest of the cache stays. glibc's memcpy switches to such stores itself only
// above glibc.cpu.x86_non_temporal_threshold, which follows the cache size the machine
// reports (on VMs, often far more than the core has): measured in perf/results/2026-12-04-copy.md.
#pragma once

#include <cstddef>

namespace hicoll {

// memcpy with non-temporal stores; ends with a store fence, so a release store after it
// publishes the bytes.
void copyStreaming(void* dst, const void* src, size_t n);

}  // namespace hicoll
