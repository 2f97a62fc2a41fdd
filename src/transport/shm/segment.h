// A POSIX shared-memory segment: created 0600 under an unguessable name, unlinked as soon as
// every rank of the node has mapped it, so nothing is left in /dev/shm even when a rank is
// killed later.
#pragma once

#include <cstddef>
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
  void* base() const { return base_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void release();
  void* base_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;
  bool linked_ = false;
};

}  // namespace hicoll
