#include "transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <utility>

#include "bootstrap/socket.h"
#include "base/error.h"

namespace hicoll {
namespace {

void* mapFd(int fd, size_t size, const std::string& name) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throwSystemError(fmt::format("mmap of shared memory '{}' ({} bytes)", name, size).c_str(), errno, __FILE__, __LINE__);
  return p;
}

// This process's mappings by name, so that a thread opening a segment another thread created
// shares its mapping.
std::mutex g_mu;
std::map<std::string, std::weak_ptr<void>> g_maps;

}  // namespace

ShmSegment::Mapping::~Mapping() {
  if (base) munmap(base, size);
}

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
  s.map_ = std::make_shared<Mapping>();
  try {
    s.map_->base = mapFd(fd.get(), size, name);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
  s.map_->size = size;
  std::lock_guard<std::mutex> lock(g_mu);
  std::erase_if(g_maps, [](const auto& kv) { return kv.second.expired(); });
  g_maps[name] = s.map_;
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, size_t size) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_maps.find(name);
    if (it != g_maps.end()) {
      if (auto m = std::static_pointer_cast<Mapping>(it->second.lock()); m && m->size == size) {
        ShmSegment s;
        s.name_ = name;
        s.map_ = std::move(m);
        return s;
      }
    }
  }
  Fd fd(shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600));
  if (!fd.valid())
    throwSystemError(fmt::format("shm_open of a peer's segment '{}'", name).c_str(), errno, __FILE__, __LINE__);
  ShmSegment s;
  s.name_ = name;
  s.map_ = std::make_shared<Mapping>();
  s.map_->base = mapFd(fd.get(), size, name);
  s.map_->size = size;
  return s;
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    release();
    map_ = std::move(o.map_);
    name_ = std::move(o.name_);
    owner_ = std::exchange(o.owner_, false);
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { release(); }

void ShmSegment::release() {
  if (linked_ && owner_) shm_unlink(name_.c_str());
  map_.reset();
  linked_ = false;
}

void ShmSegment::unlink() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

}  // namespace hicoll
