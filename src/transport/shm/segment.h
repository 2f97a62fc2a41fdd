// Memory the ranks of a node share: one anonymous file (memfd) per segment. It has no name
// anywhere (nothing to leave in /dev/shm after a kill, and a container's small /dev/shm does not
// bound it); it lives while a process maps it or holds its descriptor. A peer opens the owner's
// file through /proc/<pid>/fd/<fd> -- allowed exactly when it may read the owner's /proc entries
// (same user, same PID namespace) -- and checks it by inode and size. Ranks that are threads of
// one process share one mapping of a segment (the last to let go unmaps it): the same memory at
// the same address, so its atomics are the same objects to the compiler and to ThreadSanitizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace hicoll {

// Where a peer finds a segment (a wire struct: ranks exchange it).
struct ShmHandle {
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t ino = 0;
  uint64_t size = 0;
  bool valid() const { return ino != 0; }
};
static_assert(sizeof(ShmHandle) == 24, "ShmHandle is exchanged between ranks");

class ShmSegment {
 public:
  ShmSegment() = default;
  // A new segment of size bytes. reserve: every page is allocated now, so a machine or a
  // container without the memory fails here with hcSystemError naming the sizes, and never
  // later with a signal on first touch; otherwise pages come on first touch, as for malloc.
  // what names it in errors ("hcMemAlloc", "shm segment").
  static ShmSegment create(size_t size, const char* what, bool reserve);
  // A peer's segment (or this process's own, shared with the thread that created it).
  static ShmSegment open(const ShmHandle& h, const char* what);
  ShmSegment(ShmSegment&& o) noexcept = default;
  ShmSegment& operator=(ShmSegment&& o) noexcept = default;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  ShmHandle handle() const;  // valid while the creator holds the descriptor
  // Allocates the pages of [off, off + len) now (see create's reserve); creator only, before
  // closeFd().
  void reserve(size_t off, size_t len, const char* what);
  void closeFd();  // every peer has opened it: the descriptor is no longer needed
  void* base() const { return map_ ? map_->base : nullptr; }
  size_t size() const { return map_ ? map_->size : 0; }

 private:
  struct Mapping {
    void* base = nullptr;
    size_t size = 0;
    uint64_t ino = 0;
    int fd = -1;  // the creator's descriptor, until closeFd()
    ~Mapping();
  };
  std::shared_ptr<Mapping> map_;
};

// Whether two processes can share segments, tried rather than assumed from host names (two
// containers may share a host name and nothing else): each publishes a probe, a small segment
// holding a random token, and the other maps it and reads the token back.
struct ShmProbe {
  ShmHandle handle;
  uint64_t token[2] = {0, 0};
};
static_assert(sizeof(ShmProbe) == 40, "ShmProbe is exchanged between ranks");
ShmProbe shmProbe();  // this process's, made at its first use (again in a forked child)
// "" when this process maps the peer's probe and reads its token, else why not.
std::string shmProbeCheck(const ShmProbe& peer);

// Why `bytes` more of shared memory cannot be had on this machine or in this container (the
// memory available, the cgroup's limit), or "" when they can.
std::string sharedMemoryShortfall(size_t bytes);

}  // namespace hicoll
