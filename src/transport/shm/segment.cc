#include "transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "base/error.h"
#include "bootstrap/socket.h"

namespace hicoll {
namespace {

// This process's mappings by inode, so that a thread opening a segment another thread created
// shares its mapping.
std::mutex g_mu;
std::map<uint64_t, std::weak_ptr<void>> g_maps;

std::string gib(uint64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30));
}

// A number from a cgroup file ("max" and unreadable: none).
bool readCgroupValue(const std::string& path, uint64_t* v) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return false;
  try {
    *v = std::stoull(s);
  } catch (...) {
    return false;
  }
  return true;
}

// The tightest memory limit of this process's cgroup and its ancestors, with what is in use
// there (cgroup v2, else v1's memory controller). False when none is set.
bool cgroupRoom(uint64_t* limit, uint64_t* used, std::string* where) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  bool found = false;
  while (std::getline(in, line)) {
    // "0::/path" (v2) or "N:memory:/path" (v1)
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string ctl = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    const bool v2 = ctl.empty();
    if (!v2 && ctl.find("memory") == std::string::npos) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const char* max_file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    const char* cur_file = v2 ? "/memory.current" : "/memory.usage_in_bytes";
    for (;;) {
      uint64_t l = 0, u = 0;
      if (readCgroupValue(root + path + max_file, &l) && l < (uint64_t{1} << 62) &&
          readCgroupValue(root + path + cur_file, &u) && (!found || l - std::min(l, u) < *limit - *used)) {
        *limit = l;
        *used = std::min(l, u);
        *where = root + path;
        found = true;
      }
      if (path.empty() || path == "/") break;
      path = path.substr(0, path.rfind('/'));
    }
  }
  return found;
}

uint64_t memAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib << 10;
  }
  return UINT64_MAX;  // not said: let the allocation itself tell
}

void* mapFd(int fd, size_t size, const char* what) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) return p;
  const int err = errno;
  rlimit as{};
  std::string limit;
  if (err == ENOMEM && getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    limit = fmt::format(" (the address-space limit, ulimit -v, is {} bytes)", as.rlim_cur);
  throwSystemError(fmt::format("{}: mmap of {} bytes of shared memory{}", what, size, limit).c_str(), err, __FILE__,
                   __LINE__);
}

}  // namespace

std::string sharedMemoryShortfall(size_t bytes) {
  const uint64_t avail = memAvailable();
  uint64_t limit = 0, used = 0;
  std::string where;
  const bool cg = cgroupRoom(&limit, &used, &where);
  if (bytes <= avail && (!cg || bytes <= limit - used)) return "";
  std::string s =
      fmt::format("{} bytes ({}) asked, {} available on this machine (MemAvailable)", bytes, gib(bytes), gib(avail));
  if (cg)
    s += fmt::format(", {} left under the memory limit of {} of the cgroup {}", gib(limit - used), gib(limit), where);
  return s;
}

ShmSegment::Mapping::~Mapping() {
  if (base) munmap(base, size);
  if (fd >= 0) ::close(fd);
}

ShmSegment ShmSegment::create(size_t size, const char* what, bool reserve) {
  HC_CHECK(size > 0, hcInternalError, "{}: a segment of 0 bytes", what);
  ShmSegment s;
  s.map_ = std::make_shared<Mapping>();  // owns the descriptor from here on
  s.map_->fd = memfd_create("hicoll", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s.map_->fd < 0)
    throwSystemError(fmt::format("{}: memfd_create (anonymous shared memory; out of file descriptors?)", what).c_str(),
                     errno, __FILE__, __LINE__);
  const int fd = s.map_->fd;
  fchmod(fd, 0600);
  if (ftruncate(fd, static_cast<off_t>(size)) < 0)
    throwSystemError(fmt::format("{}: sizing shared memory to {} bytes", what, size).c_str(), errno, __FILE__,
                     __LINE__);
  // Its size is final: a peer that maps it can never fault on a page past a shrunk end.
  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  struct stat st {};
  HC_SYSCHECK(fstat(fd, &st), "fstat of a memfd");
  s.map_->ino = st.st_ino;
  if (reserve) s.reserve(0, size, what);
  s.map_->base = mapFd(fd, size, what);
  s.map_->size = size;
  std::lock_guard<std::mutex> lock(g_mu);
  std::erase_if(g_maps, [](const auto& kv) { return kv.second.expired(); });
  g_maps[s.map_->ino] = s.map_;
  return s;
}

void ShmSegment::reserve(size_t off, size_t len, const char* what) {
  HC_CHECK(map_ && map_->fd >= 0, hcInternalError, "{}: reserve on a segment this rank does not hold", what);
  if (len == 0) return;
  const std::string short_of = sharedMemoryShortfall(len);
  HC_CHECK(short_of.empty(), hcSystemError,
           "{}: not enough memory for {} bytes of shared memory: {}. Free memory, lower the sizes asked "
           "(SMDDP_AG_*_BUFFER_SIZE_BYTES, HICOLL_MEM_CACHE_BYTES), or raise the container's memory limit "
           "(hicoll's shared memory is anonymous: /dev/shm and --shm-size do not bound it)",
           what, len, short_of);
  // fallocate allocates every page or none (tmpfs undoes a partial one): no SIGBUS later.
  if (fallocate(map_->fd, 0, static_cast<off_t>(off), static_cast<off_t>(len)) < 0) {
    const int err = errno;
    throwSystemError(
        fmt::format("{}: allocating {} bytes of shared memory ({} available now)", what, len, gib(memAvailable()))
            .c_str(),
        err, __FILE__, __LINE__);
  }
}

ShmSegment ShmSegment::open(const ShmHandle& h, const char* what) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_maps.find(h.ino);
    if (h.pid == getpid() && it != g_maps.end()) {
      if (auto m = std::static_pointer_cast<Mapping>(it->second.lock()); m && m->size == h.size) {
        ShmSegment s;
        s.map_ = std::move(m);
        return s;
      }
    }
  }
  const std::string path = fmt::format("/proc/{}/fd/{}", h.pid, h.fd);
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid())
    throwSystemError(fmt::format("{}: opening the shared memory of pid {} ({})", what, h.pid, path).c_str(), errno,
                     __FILE__, __LINE__);
  struct stat st {};
  HC_SYSCHECK(fstat(fd.get(), &st), "fstat of a peer's shared memory");
  HC_CHECK(st.st_ino == h.ino && static_cast<uint64_t>(st.st_size) == h.size, hcSystemError,
           "{}: {} is not the shared memory pid {} announced (inode {} of {} bytes, found inode {} of {} bytes): "
           "the owner released it, or pid {} is another process here (another PID namespace or machine)",
           what, path, h.pid, h.ino, h.size, st.st_ino, st.st_size, h.pid);
  ShmSegment s;
  s.map_ = std::make_shared<Mapping>();
  s.map_->base = mapFd(fd.get(), h.size, what);
  s.map_->size = h.size;
  s.map_->ino = h.ino;
  return s;
}

ShmProbe shmProbe() {
  static std::mutex mu;
  static int pid = 0;
  static ShmSegment* seg = nullptr;  // kept for the process's life (one descriptor)
  static ShmProbe probe;
  std::lock_guard<std::mutex> lock(mu);
  if (pid != getpid()) {  // a forked child publishes its own: the parent's is not its to vouch for
    if (seg) seg->closeFd();
    seg = new ShmSegment(ShmSegment::create(4096, "shm probe", /*reserve=*/true));
    do {
      HC_CHECK(getrandom(probe.token, sizeof probe.token, 0) == sizeof probe.token, hcSystemError, "getrandom failed");
    } while (probe.token[0] == 0);
    std::memcpy(seg->base(), probe.token, sizeof probe.token);
    probe.handle = seg->handle();
    pid = getpid();
  }
  return probe;
}

std::string shmProbeCheck(const ShmProbe& peer) {
  // The same pid is not the same process in another PID namespace: the token tells.
  const ShmProbe mine = shmProbe();
  if (std::memcmp(mine.token, peer.token, sizeof mine.token) == 0) return "";
  if (peer.handle.pid == getpid())
    return fmt::format("pid {} is this process's pid but another process (another PID namespace)", peer.handle.pid);
  try {
    ShmSegment s = ShmSegment::open(peer.handle, "shm probe");
    if (std::memcmp(s.base(), peer.token, sizeof peer.token) != 0)
      return fmt::format("pid {} here is another process (another PID namespace or machine)", peer.handle.pid);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

ShmHandle ShmSegment::handle() const {
  ShmHandle h;
  if (!map_) return h;
  h.pid = getpid();
  h.fd = map_->fd;
  h.ino = map_->ino;
  h.size = map_->size;
  return h;
}

void ShmSegment::closeFd() {
  if (map_ && map_->fd >= 0) {
    ::close(map_->fd);
    map_->fd = -1;
  }
}

}  // namespace hicoll
