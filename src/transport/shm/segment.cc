#include "transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <utility>

#include "bootstrap/socket.h"
#include "core/error.h"

namespace hicoll {
namespace {

void* mapFd(int fd, size_t size, const std::string& name) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throwSystemError(fmt::format("mmap of shared memory '{}' ({} bytes)", name, size).c_str(), errno, __FILE__, __LINE__);
  return p;
}

}  // namespace

ShmSegment ShmSegment::create(size_t size) {
  uint8_t rnd[16];
  HC_CHECK(getrandom(rnd, sizeof rnd, 0) == sizeof rnd, hcSystemError, "getrandom failed");
  std::string name = "/hicoll-";
  for (uint8_t b : rnd) name += fmt::format("{:02x}", b);
  Fd fd(shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  HC_SYSCHECK(fd.get(), "shm_open");
  ShmSegment s;
  s.name_ = name;
  s.owner_ = true;
  s.linked_ = true;
  if (ftruncate(fd.get(), static_cast<off_t>(size)) < 0) {
    int err = errno;
    shm_unlink(name.c_str());
    throwSystemError(fmt::format("ftruncate of shared memory to {} bytes (is /dev/shm big enough?)", size).c_str(),
                     err, __FILE__, __LINE__);
  }
  try {
    s.base_ = mapFd(fd.get(), size, name);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
  s.size_ = size;
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, size_t size) {
  Fd fd(shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600));
  if (!fd.valid())
    throwSystemError(fmt::format("shm_open of a peer's segment '{}'", name).c_str(), errno, __FILE__, __LINE__);
  ShmSegment s;
  s.name_ = name;
  s.base_ = mapFd(fd.get(), size, name);
  s.size_ = size;
  return s;
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    release();
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    owner_ = std::exchange(o.owner_, false);
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { release(); }

void ShmSegment::release() {
  if (linked_ && owner_) shm_unlink(name_.c_str());
  if (base_) munmap(base_, size_);
  base_ = nullptr;
  linked_ = false;
}

void ShmSegment::unlink() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

}  // namespace hicoll
