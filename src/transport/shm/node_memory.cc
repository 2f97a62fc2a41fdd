#include "transport/shm/node_memory.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <list>
#include <map>
#include <mutex>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "transport/shm/segment.h"

namespace hicoll {
namespace {

struct Block {
  NodeMemRef ref;
  ShmSegment seg;
};

struct Registry {
  std::mutex mu;
  std::map<uint64_t, Block> live;  // by base address
  std::atomic<size_t> nlive{0};    // live.size(), read without the lock
  std::list<Block> kept;           // freed, for reuse; oldest first
  size_t kept_bytes = 0;
  size_t cache_limit = 0;
  int started_pid = 0;  // the process the fields below are of (see adopt)
  std::vector<NodeMemFreeLog*> logs;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: tensors may be freed at exit
  return *r;
}

// Unmaps b and tells the local peers to unmap it too. Called with the lock held.
void release(Registry& r, Block& b) {
  for (NodeMemFreeLog* log : r.logs) {
    const uint64_t n = log->count.load(std::memory_order_relaxed);
    log->id[n % NodeMemFreeLog::kSlots].store(b.ref.id, std::memory_order_relaxed);
    log->count.store(n + 1, std::memory_order_release);
  }
  b.seg = ShmSegment();
}

// A forked child starts its own accounting: the parent's transports (and their logs) are not its.
void adopt(Registry& r) {
  if (r.started_pid == getpid()) return;
  r.cache_limit = static_cast<size_t>(Config::fromEnv().num(Knob::MemCacheBytes));
  r.logs.clear();
  r.started_pid = getpid();
}

}  // namespace

void* nodeMemAlloc(size_t bytes) {
  HC_CHECK(bytes > 0, hcInvalidArgument, "hcMemAlloc: size 0");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  HC_CHECK(bytes <= SIZE_MAX - page, hcInvalidArgument, "hcMemAlloc: size {} overflows", bytes);
  const size_t size = (bytes + page - 1) / page * page;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  adopt(r);
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
  // Memory kept for reuse goes first when the machine is short of it.
  while (!r.kept.empty() && !sharedMemoryShortfall(size).empty()) {
    r.kept_bytes -= r.kept.front().ref.size;
    release(r, r.kept.front());
    r.kept.pop_front();
  }
  Block b;
  b.seg = ShmSegment::create(size, "hcMemAlloc", /*reserve=*/true);
  while (b.ref.id == 0)
    HC_CHECK(getrandom(&b.ref.id, sizeof b.ref.id, 0) == sizeof b.ref.id, hcSystemError, "getrandom failed");
  const ShmHandle h = b.seg.handle();
  b.ref.ino = h.ino;
  b.ref.fd = h.fd;
  b.ref.base = reinterpret_cast<uint64_t>(b.seg.base());
  b.ref.size = size;
  void* p = b.seg.base();
  r.live.emplace(b.ref.base, std::move(b));
  r.nlive = r.live.size();
  return p;
}

void nodeMemFree(void* p) {
  if (!p) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  adopt(r);
  auto it = r.live.find(reinterpret_cast<uint64_t>(p));
  HC_CHECK(it != r.live.end(), hcInvalidArgument, "hcMemFree: {} is not the start of a live hcMemAlloc allocation", p);
  Block b = std::move(it->second);
  r.live.erase(it);
  r.nlive = r.live.size();
  if (b.ref.size > r.cache_limit) return release(r, b);
  r.kept_bytes += b.ref.size;
  r.kept.push_back(std::move(b));
  while (r.kept_bytes > r.cache_limit) {
    r.kept_bytes -= r.kept.front().ref.size;
    release(r, r.kept.front());
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

void nodeMemPublishFrees(NodeMemFreeLog* log) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  adopt(r);
  r.logs.push_back(log);
}

void nodeMemUnpublishFrees(NodeMemFreeLog* log) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::erase(r.logs, log);
}

}  // namespace hicoll
