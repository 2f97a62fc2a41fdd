#include "transport/shm/node_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <list>
#include <map>
#include <mutex>

#include "base/config.h"
#include "base/error.h"
#include "bootstrap/socket.h"

namespace hicoll {
namespace {

constexpr const char* kPrefix = "hicoll-mem-";

struct Block {
  NodeMemRef ref;
  std::string name;
};

struct Registry {
  std::mutex mu;
  std::map<uint64_t, Block> live;          // by base address
  std::atomic<size_t> nlive{0};            // live.size(), read without the lock
  std::list<Block> kept;                   // freed, for reuse; oldest first
  size_t kept_bytes = 0;
  size_t cache_limit = 0;
  int started_pid = 0;  // the process that read the limit and swept (a forked child sweeps again)
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: tensors may be freed at exit
  return *r;
}

// Names of owners that died (killed before they could free) belong to nobody: remove them.
void sweepDeadOwners() {
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  const uid_t me = geteuid();
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, kPrefix, std::strlen(kPrefix)) != 0) continue;
    const long pid = std::strtol(e->d_name + std::strlen(kPrefix), nullptr, 10);
    struct stat st;
    if (pid <= 0 || fstatat(dirfd(d), e->d_name, &st, 0) != 0 || st.st_uid != me) continue;
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) shm_unlink((std::string("/") + e->d_name).c_str());
  }
  closedir(d);
}

void release(const Block& b) {
  munmap(reinterpret_cast<void*>(b.ref.base), b.ref.size);
  shm_unlink(b.name.c_str());
}

}  // namespace

std::string nodeMemName(int pid, const NodeMemRef& ref) {
  return fmt::format("/{}{}-{:016x}{:016x}", kPrefix, pid, ref.id[0], ref.id[1]);
}

void* nodeMemAlloc(size_t bytes) {
  HC_CHECK(bytes > 0, hcInvalidArgument, "hcMemAlloc: size 0");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = (bytes + page - 1) / page * page;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.started_pid != getpid()) {
    r.cache_limit = static_cast<size_t>(Config::fromEnv().num(Knob::MemCacheBytes));
    sweepDeadOwners();
    r.started_pid = getpid();
  }
  for (auto it = r.kept.begin(); it != r.kept.end(); ++it) {
    if (it->ref.size != size) continue;
    Block b = std::move(*it);
    r.kept.erase(it);
    r.kept_bytes -= size;
    const uint64_t base = b.ref.base;
    r.live.emplace(base, std::move(b));
    r.nlive = r.live.size();
    return reinterpret_cast<void*>(base);
  }
  Block b;
  HC_CHECK(getrandom(b.ref.id, sizeof b.ref.id, 0) == sizeof b.ref.id, hcSystemError, "getrandom failed");
  b.name = nodeMemName(static_cast<int>(getpid()), b.ref);
  Fd fd(shm_open(b.name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  HC_SYSCHECK(fd.get(), "hcMemAlloc: shm_open");
  if (ftruncate(fd.get(), static_cast<off_t>(size)) < 0) {
    const int err = errno;
    shm_unlink(b.name.c_str());
    throwSystemError(fmt::format("hcMemAlloc: ftruncate of shared memory to {} bytes (is /dev/shm big enough?)", size).c_str(),
                     err, __FILE__, __LINE__);
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    shm_unlink(b.name.c_str());
    throwSystemError(fmt::format("hcMemAlloc: mmap of {} bytes", size).c_str(), err, __FILE__, __LINE__);
  }
  b.ref.base = reinterpret_cast<uint64_t>(p);
  b.ref.size = size;
  r.live.emplace(b.ref.base, std::move(b));
  r.nlive = r.live.size();
  return p;
}

void nodeMemFree(void* p) {
  if (!p) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(reinterpret_cast<uint64_t>(p));
  HC_CHECK(it != r.live.end(), hcInvalidArgument, "hcMemFree: {} is not the start of a live hcMemAlloc allocation", p);
  Block b = std::move(it->second);
  r.live.erase(it);
  r.nlive = r.live.size();
  if (b.ref.size > r.cache_limit) return release(b);
  r.kept_bytes += b.ref.size;
  r.kept.push_back(std::move(b));
  while (r.kept_bytes > r.cache_limit) {
    r.kept_bytes -= r.kept.front().ref.size;
    release(r.kept.front());
    r.kept.pop_front();
  }
}

NodeMemRef nodeMemFind(const void* p) {
  Registry& r = registry();
  const uint64_t a = reinterpret_cast<uint64_t>(p);
  if (r.nlive.load(std::memory_order_relaxed) == 0) return {};  // most calls: no lock
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.upper_bound(a);
  if (it == r.live.begin()) return {};
  --it;
  const NodeMemRef& ref = it->second.ref;
  return a < ref.base + ref.size ? ref : NodeMemRef{};
}

}  // namespace hicoll
