// A POSIX shared-memory segment: created 0600 under an unguessable name, unlinked as soon as
// every rank of the node has mapped it, so nothing is left in /dev/shm even when a rank is
// killed later. Ranks that are threads of one process share one mapping of a segment (the
// last to let go unmaps it): the same memory at the same address, so its atomics are the same
// objects to the compiler and to ThreadSanitizer.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace hicoll {

class ShmSegment {
 public:
  ShmSegment() = default;
  static ShmSegment create(size_t size);                          // O_CREAT | O_EXCL, 0600
  static ShmSegment open(const std::string& name, size_t size);  // a peer's segment
  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  void unlink();  // removes the name; the mapping stays valid
  void* base() const { return map_ ? map_->base : nullptr; }
  size_t size() const { return map_ ? map_->size : 0; }
  const std::string& name() const { return name_; }

 private:
  struct Mapping {
    void* base = nullptr;
    size_t size = 0;
    ~Mapping();
  };
  void release();
  std::shared_ptr<Mapping> map_;
  std::string name_;
  bool owner_ = false;
  bool linked_ = false;
};

}  // namespace hicoll
