// Copies that bypass the caches, and prefetches. A copy much larger than the caches (a
// node-memory AllGather's blocks) writes its destination with non-temporal stores: its lines
// are not read first and the rest of the cache stays. glibc's memcpy switches to such stores
// itself only above glibc.cpu.x86_non_temporal_threshold, which follows the cache size the
// machine reports (on VMs, often far more than the core has): perf/results/2026-12-04-copy.md.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hicoll {

// Starts fetching [p, p + len) into this core's cache (lines another core is writing: the
// fetch overlaps with the wait for them). Always inline: a call to a function that only
// prefetches has no effect the compiler must keep, and GCC drops such calls.
[[gnu::always_inline]] inline void prefetchLines(const void* p, size_t len) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (uintptr_t a = at & ~uintptr_t{63}; a < at + len; a += 64) __builtin_prefetch(reinterpret_cast<const void*>(a));
}

// memcpy with non-temporal stores; ends with a store fence, so a release store after it
// publishes the bytes.
void copyStreaming(void* dst, const void* src, size_t n);

}  // namespace hicoll
