#include "transport/shm/shm_transport.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"

namespace hicoll {
namespace {

constexpr uint64_t kSegMagic = 0x6863736567303034ULL;  // "hcseg004"
constexpr int kMaxLocal = 256;
constexpr int kQueueDepth = 64;
constexpr size_t kBounceBytes = 256 << 10;  // per ordered pair
// Messages up to this size go through the bounce ring even with CMA: two small copies cost less
// than the process_vm_readv system call (Open MPI's vader has the same eager limit).
constexpr size_t kEagerBytes = 4096;
constexpr size_t kCmaPiece = 4 << 20;  // large pieces: CMA pins pages per call
constexpr size_t kPage = 4096;

size_t roundUp(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

// Maps the pages of [at, at + len) in a node segment here at once (write: this rank's own, to
// write them; else a peer's, to read them). A hint: without MADV_POPULATE_* (Linux before 5.14)
// they still come on first touch.
void populate(const void* at, size_t len, bool write) {
  const uintptr_t from = reinterpret_cast<uintptr_t>(at) & ~uintptr_t{kPage - 1};
  const uintptr_t to = roundUp(reinterpret_cast<uintptr_t>(at) + len, kPage);
  madvise(reinterpret_cast<void*>(from), to - from, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
}

// Yama's ptrace_scope, -1 without Yama.
int yamaScope() {
  FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  if (!f) return -1;
  int v = -1;
  if (std::fscanf(f, "%d", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}

// A message's descriptor says itself that it is posted, so the receiver of a small message (its
// bytes inline: up to 40 in the line it polls, up to 104 in the next) takes one or two lines from
// the sender's cache, and of one in the bounce ring two it can fetch at once (the descriptor and
// the ring's bytes at its own position).
constexpr size_t kInlineBytes = 104;
struct alignas(64) Desc {
  std::atomic<uint64_t> posted;  // its queue index + 1, stored last
  uint64_t tag, len;
  union {
    struct {
      uint64_t addr;  // where it is in the sender (single-copy reads)
      uint64_t in;    // bytes written into the bounce ring when it was posted
    } at;
    char data[kInlineBytes];  // len <= kInlineBytes
  };
};
static_assert(sizeof(Desc) == 128 && alignof(Desc) == 64, "two cache lines");

// A send's descriptor, all but its posted word (small bytes inline).
void describe(Desc& d, uint64_t tag, const void* buf, size_t len) {
  d.tag = tag;
  d.len = len;
  d.at.addr = reinterpret_cast<uint64_t>(buf);
  if (len <= kInlineBytes && len) std::memcpy(d.data, buf, len);
}
// Posts it as queue index slot, with the ring's byte count `in` (after its bytes were fed).
void publish(Desc& d, uint64_t slot, uint64_t in) {
  if (d.len > kInlineBytes) d.at.in = in;
  d.posted.store(slot + 1, std::memory_order_release);
}

}  // namespace

// One queue per ordered pair (sender -> receiver), in the sender's segment.
struct ShmTransport::Pair {
  // Fields in shared memory are in Header; this is the local bookkeeping per peer.
  std::deque<ReqId> sends;       // posted or waiting for a queue slot, in order
  std::deque<ReqId> recvs;       // in order
  uint64_t next_send = 0;        // descriptors this rank posted to the peer
  uint64_t next_recv = 0;        // descriptors from the peer this rank has matched
  uint64_t bounce_recvd = 0;     // bytes of the current recv already copied out
  bool ring_out_mapped = false;  // the bounce rings' pages are mapped here (mapRing): to the peer,
  bool ring_in_mapped = false;   // from it
};

struct ShmTransport::Req {
  bool send;
  int peer;  // local index
  char* buf;
  size_t len;
  uint64_t tag;
  uint64_t slot = UINT64_MAX;  // descriptor index once posted
  uint64_t fed = 0;            // bytes put into the bounce ring (sends without CMA)
  bool done = false;
  Placer place;      // irecvPlaced: buf, len and tag are set from the message it takes
  uint32_t gen = 0;  // the slab slot's generation (ReqId's high half); 0: free
};

// What each side writes has its own cache line.
struct alignas(64) QueueShared {
  std::atomic<uint64_t> bytes_in{0};          // sender: bytes written into the bounce ring
  alignas(64) std::atomic<uint64_t> tail{0};  // receiver: descriptors completed
  std::atomic<uint64_t> bytes_out{0};         // receiver: bytes taken out of it
  Desc desc[kQueueDepth];                     // sender
};

// Default-initialised in place (every member but the board's ring has an initialiser): the ring
// stays untouched zero pages until used (board.h).
struct ShmTransport::Header {
  uint64_t magic = 0;
  int32_t pid = 0;
  int32_t comm_rank = 0;
  uint64_t base_in_owner = 0;  // where the owner mapped this segment
  std::atomic<uint32_t> aborted{0};
  std::atomic<uint64_t> failed_call{0};  // the call it aborted in (stored before aborted)
  std::atomic<uint32_t> closed{0};       // destroyed cleanly: its exit is not a failure
  char reason[1024] = {};                // why it aborted or rejected a call (set before either is seen)
  NodeMemFreeLog freed;                  // its process's node memory released for good (node_memory.h)
  Board board;
  QueueShared queue[1];  // [local size], to each receiver
};

// process_vm_readv needs ptrace access to the peer. Without Yama (or scope 0) a process of the
// same user has it; under scope 1 only a declared tracer does, and a process may declare one
// pid only: with one local peer hicoll declares it, with more it does not declare "any"
// (PR_SET_PTRACER_ANY would let every process of the user read this rank's memory and switch
// Yama off for it) and the node stages through shared memory instead. Returns a note for the
// log ("" when nothing was needed).
std::string ShmTransport::allowPeerReads(const std::string& mode, const std::vector<int>& pids, int me) {
  if (mode == "0") return "";
  const int scope = yamaScope();
  std::vector<int> others;
  for (size_t i = 0; i < pids.size(); ++i)
    if (static_cast<int>(i) != me && pids[i] != getpid()) others.push_back(pids[i]);
  if (scope <= 0 || others.empty()) return "";
  if (scope == 1 && others.size() == 1) {
    prctl(PR_SET_PTRACER, others[0], 0, 0, 0);
    return fmt::format("Yama ptrace_scope=1: pid {} declared as this rank's tracer", others[0]);
  }
  return fmt::format(
      "Yama ptrace_scope={}: single-copy reads between {} processes would need wider ptrace access "
      "than hicoll grants; shared-memory staging instead",
      scope, others.size() + 1);
}

ShmTransport::ShmTransport(Bootstrap& bs, const std::vector<int>& local_ranks, const ShmOptions& opt)
    : local_ranks_(local_ranks), opt_(opt) {
  const int L = localSize();
  HC_CHECK(L <= kMaxLocal, hcUnsupported, "shm: {} ranks on one node; at most {} are supported", L, kMaxLocal);
  local_of_.assign(static_cast<size_t>(bs.size()), -1);
  for (int i = 0; i < L; ++i) local_of_[static_cast<size_t>(local_ranks_[i])] = i;
  me_ = localOf(bs.rank());
  header_bytes_ = roundUp(sizeof(Header) + sizeof(QueueShared) * (L - 1), kPage);
  bounce_bytes_ = kBounceBytes;
  size_t total = header_bytes_ + bounce_bytes_ * L + roundUp(opt.scratch_bytes, kPage) + roundUp(opt.sort_bytes, kPage);

  // Create mine, tell everybody where it is, map the node's. Its pages come on first touch: the
  // scratch and sort buffers cost nothing until a call uses them.
  ShmSegment mine = ShmSegment::create(total, "shm segment", /*reserve=*/false);
  auto* h = new (mine.base()) Header;
  h->magic = kSegMagic;
  h->pid = getpid();
  h->comm_rank = bs.rank();
  h->base_in_owner = reinterpret_cast<uint64_t>(mine.base());
  // The queues are not written here: a new memfd's pages read as zero, their initial state, and
  // cost nothing until a message goes to that peer (8 KiB per pair that exchanges).
  struct Info {
    ShmHandle seg;
    int32_t pid;
    int32_t pad;
  };
  Info my_info{};
  my_info.seg = mine.handle();
  my_info.pid = getpid();
  std::vector<Info> all(bs.size());
  bs.allgather(&my_info, all.data(), sizeof(Info));

  my_pid_ = getpid();
  segs_.resize(L);
  pids_.resize(L);
  pidfds_.assign(L, -1);
  // Every rank says whether it mapped every segment of its node (and allowed its reads), so one
  // rank's failure fails them all at once, with its cause (an allgather in place of a barrier).
  char why[200] = {};
  try {
    for (int i = 0; i < L; ++i) {
      const Info& in = all[local_ranks_[i]];
      pids_[i] = in.pid;
      if (i == me_) continue;
      HC_CHECK(in.seg.size == total, hcInvalidUsage,
               "shm: rank {} uses a segment of {} bytes, rank {} of {}: scratch/sort sizes differ across ranks",
               local_ranks_[i], in.seg.size, bs.rank(), total);
      segs_[i] = ShmSegment::open(in.seg, "shm segment");
      if (in.pid != getpid()) pidfds_[i] = static_cast<int>(syscall(SYS_pidfd_open, in.pid, 0));
    }
    segs_[me_] = std::move(mine);
    cma_note_ = allowPeerReads(opt_.cma, pids_, me_);
  } catch (const Error& e) {
    std::snprintf(why, sizeof why, "%s", e.what());
  }
  std::vector<char> whys(sizeof why * bs.size());
  bs.allgather(why, whys.data(), sizeof why);
  for (int i = 0; i < L; ++i) {
    const char* w = &whys[sizeof why * local_ranks_[i]];
    HC_CHECK(!w[0], hcSystemError, "shm: rank {} cannot map the shared memory of its node's ranks: {}", local_ranks_[i],
             std::string(w, strnlen(w, sizeof why)));
  }
  segs_[me_].closeFd();
  board_ring_mapped_.assign(static_cast<size_t>(L), 0);
  for (int i = 0; i < L; ++i) {
    boards_.push_back(&header(i).board);
    scratch_.push_back(static_cast<char*>(segs_[i].base()) + header_bytes_ + bounce_bytes_ * localSize());
  }

  same_process_ = std::all_of(pids_.begin(), pids_.end(), [](int p) { return p == getpid(); });
  bool cma_ok = true;
  if (!same_process_ && opt_.cma != "0") {
    for (int i = 0; i < L && cma_ok; ++i) {
      if (i == me_ || pids_[i] == getpid()) continue;
      uint64_t magic = 0;
      iovec l{&magic, sizeof magic}, r{reinterpret_cast<void*>(header(i).base_in_owner), sizeof magic};
      cma_ok = process_vm_readv(pids_[i], &l, 1, &r, 1, 0) == sizeof magic && magic == kSegMagic;
    }
  }
  if (opt_.cma == "0") cma_ok = false;
  // Every rank must agree, or a sender would not feed the bounce ring its receiver reads.
  uint8_t ok = cma_ok ? 1 : 0;
  std::vector<uint8_t> oks(bs.size());
  bs.allgather(&ok, oks.data(), 1);
  direct_ = true;
  for (int r : local_ranks_) direct_ = direct_ && oks[r];
  if (opt_.cma == "1" && !direct_)
    HC_THROW(hcUnsupported, "HICOLL_SHM_CMA=1 but process_vm_readv between the ranks of this node is not permitted");
  HC_INFO("shm: {} local ranks, intra-node copies: {}{}", L,
          same_process_ ? "memcpy (ranks are threads)"
          : direct_     ? "single copy (process_vm_readv)"
                        : "bounce buffers (two copies)",
          cma_note_.empty() ? "" : " (" + cma_note_ + ")");
  pairs_.resize(L);
  for (auto& p : pairs_) p = std::make_unique<Pair>();
  freed_seen_.assign(L, 0);
  nodeMemPublishFrees(&header(me_).freed);
}

ShmTransport::~ShmTransport() {
  if (!segs_.empty() && segs_[me_].base()) {
    nodeMemUnpublishFrees(&header(me_).freed);
    header(me_).closed.store(1, std::memory_order_release);
  }
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
}

int ShmTransport::localOf(int peer) const {
  HC_CHECK(canConnect(peer), hcInternalError, "shm: rank {} is not on this node", peer);
  return local_of_[static_cast<size_t>(peer)];
}

ShmTransport::Header& ShmTransport::header(int local) {
  return *static_cast<Header*>(segs_[local].base());
}
char* ShmTransport::ring(int sender, int receiver) {
  return static_cast<char*>(segs_[sender].base()) + header_bytes_ + bounce_bytes_ * receiver;
}
// A ring's pages come whole, in both processes, with the pair's first message through it: one
// page at a time on first touch they cost a fault in each process on every small message until
// the ring had gone round once (most of a short job's messages). Memory the ring holds anyway.
void ShmTransport::mapRing(int sender, int receiver, bool* mapped) {
  if (*mapped) return;
  populate(ring(sender, receiver), bounce_bytes_, sender == me_);
  *mapped = true;
}
// Likewise a board's ring data, which small Broadcasts walk a slot per call.
void ShmTransport::mapBoardRingNow(int local) {
  populate(header(local).board.ring, sizeof(Board::ring), local == me_);
  board_ring_mapped_[static_cast<size_t>(local)] = 1;
}
char* ShmTransport::sort(int local) {
  return scratch(local) + roundUp(opt_.scratch_bytes, kPage);
}

void ShmTransport::read(int local, const void* remote, void* dst, size_t len) {
  if (len == 0) return;
  Header& h = header(local);
  uint64_t r = reinterpret_cast<uint64_t>(remote);
  if (r >= h.base_in_owner && r + len <= h.base_in_owner + segs_[local].size()) {
    std::memcpy(dst, static_cast<char*>(segs_[local].base()) + (r - h.base_in_owner), len);
    return;
  }
  if (pids_[local] == my_pid_) {
    std::memcpy(dst, remote, len);
    return;
  }
  HC_CHECK(direct_, hcInternalError, "shm: direct read from rank {} without CMA", commRank(local));
  char* d = static_cast<char*>(dst);
  size_t off = 0;
  while (off < len) {
    size_t n = std::min(kCmaPiece, len - off);
    iovec l{d + off, n}, rv{reinterpret_cast<void*>(r + off), n};
    ssize_t got = process_vm_readv(pids_[local], &l, 1, &rv, 1, 0);
    if (got <= 0) {
      // Gone memory (EFAULT) or a gone process (ESRCH) is the symptom of a peer that failed or
      // died: its cause, when it shows, is the error.
      const int err = got < 0 ? errno : EFAULT;
      if (err == ESRCH || err == EFAULT) explainReadFailure(local);
      if (err == ESRCH) throwPeerError(local, "a read of its buffer");
      throw Error(hcRemoteError,
                  fmt::format("shm: process_vm_readv of {} bytes from local peer rank {} (pid {}) failed: {}", n,
                              commRank(local), pids_[local], std::strerror(err)),
                  err == EFAULT ? Error::kSymptom : 0u);
    }
    off += static_cast<size_t>(got);
  }
}

const char* ShmTransport::mapPeerMemory(int local, const NodeMemRef& ref, const void* remote, size_t len) {
  const uint64_t r = reinterpret_cast<uint64_t>(remote);
  HC_CHECK(ref.valid() && r >= ref.base && r + len <= ref.base + ref.size, hcInvalidUsage,
           "shm: rank {} posted {} bytes at {:#x}, outside its node memory [{:#x}, +{})", commRank(local), len, r,
           ref.base, ref.size);
  if (pids_[local] == my_pid_) return static_cast<const char*>(remote);  // ranks are threads
  const uint64_t call = opt_.call_now ? opt_.call_now() : 0;
  dropFreedPeerMemory(call);
  const auto key = std::make_pair(local, ref.id);
  auto it = peer_mem_.find(key);
  if (it == peer_mem_.end()) {
    PeerMemory m;
    try {
      m.seg = ShmSegment::open(ShmHandle{pids_[local], ref.fd, ref.ino, ref.size}, "shm");
    } catch (const Error& e) {
      if (failed(local) || closed(local)) throwPeerError(local, "mapping its node memory");
      HC_THROW(hcSystemError, "shm: cannot map rank {}'s node memory (hcMemAlloc, {} bytes): {}", commRank(local),
               ref.size, e.what());
    }
    peer_mem_bytes_ += ref.size;
    it = peer_mem_.emplace(key, std::move(m)).first;
  }
  it->second.last_call = call;
  // Views of allocations the owners still hold, least recently used first, beyond the cache's
  // bytes (HICOLL_MEM_CACHE_BYTES, as for the owners' own) or 256 of them; never one this call uses.
  while (peer_mem_bytes_ > opt_.peer_mem_bytes || peer_mem_.size() > 256) {
    auto lru = peer_mem_.end();
    for (auto j = peer_mem_.begin(); j != peer_mem_.end(); ++j)
      if (j->second.last_call != call && (lru == peer_mem_.end() || j->second.last_call < lru->second.last_call))
        lru = j;
    if (lru == peer_mem_.end()) break;
    peer_mem_bytes_ -= lru->second.seg.size();
    peer_mem_.erase(lru);
  }
  return static_cast<const char*>(it->second.seg.base()) + (r - ref.base);
}

void ShmTransport::dropFreedPeerMemory(uint64_t call) {
  for (int l = 0; l < localSize(); ++l) {
    if (l == me_) continue;
    const NodeMemFreeLog& log = header(l).freed;
    const uint64_t n = log.count.load(std::memory_order_acquire);
    if (n == freed_seen_[l]) continue;
    // Ids the owner overwrote before this rank read them are unknown: drop every view of it.
    bool all = n - freed_seen_[l] > NodeMemFreeLog::kSlots;
    std::vector<uint64_t> ids;
    for (uint64_t i = all ? n : freed_seen_[l]; i < n; ++i)
      ids.push_back(log.id[i % NodeMemFreeLog::kSlots].load(std::memory_order_relaxed));
    all = all || log.count.load(std::memory_order_acquire) - freed_seen_[l] > NodeMemFreeLog::kSlots;
    freed_seen_[l] = n;
    for (auto it = peer_mem_.begin(); it != peer_mem_.end();) {
      const bool drop = it->first.first == l && it->second.last_call != call &&
                        (all || std::find(ids.begin(), ids.end(), it->first.second) != ids.end());
      if (!drop) {
        ++it;
        continue;
      }
      peer_mem_bytes_ -= it->second.seg.size();
      it = peer_mem_.erase(it);
    }
  }
}

void ShmTransport::checkPeers() {
  auto now = coarseNow();
  if (now - last_check_ < std::chrono::milliseconds(20)) return;
  last_check_ = now;
  for (int i = 0; i < localSize(); ++i) {
    if (i == me_) continue;
    if (header(i).aborted.load(std::memory_order_acquire) &&
        reportIsDue(opt_.call_now, header(i).failed_call.load(std::memory_order_relaxed)))
      throwPeerError(i, "its abort");
    if (pidfds_[i] >= 0) {
      // Read closed after seeing the exit: a clean destroy stores it before the process ends.
      pollfd p{pidfds_[i], POLLIN, 0};
      if (::poll(&p, 1, 0) > 0 && !header(i).closed.load(std::memory_order_acquire)) throwPeerError(i, "a wait");
    }
  }
  if (aborted_) HC_THROW(hcRemoteError, "shm: the communicator was aborted");
}

void ShmTransport::throwPeerError(int local, const char* what) {
  if (local < 0) throwTimeout(-1, what);
  if (header(local).aborted.load()) {
    const std::string why = reason(local);
    HC_THROW(hcRemoteError, "local peer rank {} failed{}{} (noticed in {})", commRank(local), why.empty() ? "" : ": ",
             why, what);
  }
  HC_THROW(hcRemoteError, "local peer rank {} (pid {}) died (noticed in {})", commRank(local), pids_[local], what);
}

void ShmTransport::throwTimeout(int local, const char* what) {
  // Who has not arrived: the peer waited for and the peers whose process is stopped; without
  // either, every peer. Each with what its board shows.
  std::vector<int> who;
  bool any_stopped = false;
  if (local >= 0) who.push_back(local);
  for (int i = 0; i < localSize(); ++i) {
    if (i == me_ || !stopped(i)) continue;
    any_stopped = true;
    if (i != local) who.push_back(i);
  }
  for (int i = 0; i < localSize() && who.empty(); ++i)
    if (i != me_) who.push_back(i);
  std::string list;
  for (int i : who) list += fmt::format("{}rank {} ({})", list.empty() ? "" : "; ", commRank(i), peerState(i));
  // A peer that is not stopped may itself wait for one elsewhere: a symptom, which the failure
  // notice of a rank that sees the stopped one explains.
  throw Error(hcTimeout,
              fmt::format("shm: timed out after {} ms {}: local peer{} {}", opt_.timeout_ms, what,
                          who.size() > 1 ? "s" : "", list),
              any_stopped ? 0u : Error::kSymptom);
}

bool ShmTransport::stopped(int local) {
  if (local == me_ || pids_[local] == my_pid_) return false;  // ranks that are threads run with this one
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pids_[local]);
  FILE* f = std::fopen(path, "re");
  if (!f) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ')'.
  const char* p = std::strrchr(buf, ')');
  return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

std::string ShmTransport::peerState(int local) {
  // The board's post slots take the phases in turn: the latest one is where the peer is.
  const Board& b = board(local);
  int latest = 0;
  uint64_t seq = 0;
  for (int i = 0; i < Board::kSlots; ++i) {
    const uint64_t s = b.post[i].posted.load(std::memory_order_acquire);
    if (s > seq) seq = s, latest = i;
  }
  const std::string at = seq == 0
                             ? "no call yet on this communicator"
                             : fmt::format("{} {}", b.done.load(std::memory_order_acquire) >= seq ? "done with" : "in",
                                           describeCall(b.post[latest].desc));
  return fmt::format("pid {}{}, {}", pids_[local], stopped(local) ? ", stopped (SIGSTOP or a debugger)" : "", at);
}

void ShmTransport::explainReadFailure(int local) {
  // A peer frees its buffers only after its call returned, which for a failed call is after its
  // abort; a dying process's memory goes before its pidfd says so. A moment covers both.
  waitUntil(
      [&] {
        if (failed(local)) throwPeerError(local, "a read of its buffer");
        bool exited = false;
        if (pidfds_[local] >= 0) {
          pollfd p{pidfds_[local], POLLIN, 0};
          exited = ::poll(&p, 1, 0) > 0;
        }
        if (closed(local))
          HC_THROW(hcRemoteError, "local peer rank {} destroyed its communicator while this rank read its buffer",
                   commRank(local));
        if (exited) throwPeerError(local, "a read of its buffer");
        return false;  // nothing to explain yet: look again until the moment is over
      },
      Deadline(std::min<long>(opt_.timeout_ms, 250)));
}

bool ShmTransport::closed(int local) {
  return header(local).closed.load(std::memory_order_acquire) != 0;
}

bool ShmTransport::failed(int local) {
  return header(local).aborted.load(std::memory_order_acquire) != 0;
}

void ShmTransport::setReason(const std::string& why) {
  std::snprintf(header(me_).reason, sizeof header(me_).reason, "%s", why.c_str());
}

std::string ShmTransport::reason(int local) {
  const char* r = header(local).reason;
  return std::string(r, strnlen(r, sizeof header(local).reason));
}

void ShmTransport::abort() {
  aborted_ = true;
  header(me_).failed_call.store(opt_.call_now ? opt_.call_now() : 0, std::memory_order_relaxed);
  header(me_).aborted.store(1, std::memory_order_release);
}

ReqId ShmTransport::isend(int peer, const void* buf, size_t len, uint64_t tag) {
  HC_CHECK(!aborted_, hcRemoteError, "shm: send on an aborted communicator");
  int local = localOf(peer);
  ReqId id = newReq(true, local, static_cast<char*>(const_cast<void*>(buf)), len, tag);
  pairs_[local]->sends.push_back(id);
  progressSend(local);
  return id;
}

ReqId ShmTransport::irecv(int peer, void* buf, size_t len, uint64_t tag) {
  HC_CHECK(!aborted_, hcRemoteError, "shm: receive on an aborted communicator");
  int local = localOf(peer);
  ReqId id = newReq(false, local, static_cast<char*>(buf), len, tag);
  pairs_[local]->recvs.push_back(id);
  return id;
}

ReqId ShmTransport::irecvPlaced(int peer, Placer place) {
  const ReqId id = irecv(peer, nullptr, 0, 0);
  req(id).place = std::move(place);
  return id;
}

bool ShmTransport::peek(int peer, uint64_t* tag, size_t* len) {
  const int local = localOf(peer);
  const Pair& p = *pairs_[local];
  const Desc& d = header(local).queue[me_].desc[p.next_recv % kQueueDepth];
  if (d.posted.load(std::memory_order_acquire) != p.next_recv + 1) return false;
  *tag = d.tag;
  *len = d.len;
  return true;
}

uint64_t ShmTransport::postNow(int peer, const void* buf, size_t len, uint64_t tag) {
  HC_CHECK(!aborted_, hcRemoteError, "shm: send on an aborted communicator");
  const int local = localOf(peer);
  Pair& p = *pairs_[local];
  QueueShared& q = header(me_).queue[local];
  if (!p.sends.empty() || p.next_send - q.tail.load(std::memory_order_acquire) >= kQueueDepth) return kNotNow;
  uint64_t in = q.bytes_in.load(std::memory_order_relaxed);
  const bool via_ring = viaRing(len);
  if (via_ring && len > bounce_bytes_ - (in - q.bytes_out.load(std::memory_order_acquire))) return kNotNow;
  const uint64_t slot = p.next_send++;
  Desc& d = q.desc[slot % kQueueDepth];
  describe(d, tag, buf, len);
  if (via_ring) {
    mapRing(me_, local, &p.ring_out_mapped);
    char* base = ring(me_, local);
    const size_t pos = in % bounce_bytes_, first = std::min(len, bounce_bytes_ - pos);
    std::memcpy(base + pos, buf, first);
    std::memcpy(base, static_cast<const char*>(buf) + first, len - first);
    in += len;
    q.bytes_in.store(in, std::memory_order_release);
  }
  publish(d, slot, in);
  return slot;
}

bool ShmTransport::taken(int peer, uint64_t index) {
  return header(me_).queue[localOf(peer)].tail.load(std::memory_order_acquire) > index;
}

bool ShmTransport::takeNow(int peer, void* buf, size_t len) {
  if (aborted_.load(std::memory_order_relaxed)) HC_THROW(hcRemoteError, "shm: the communicator was aborted");
  const int local = localOf(peer);
  Pair& p = *pairs_[local];
  QueueShared& q = header(local).queue[me_];
  const Desc& d = q.desc[p.next_recv % kQueueDepth];
  if (!p.recvs.empty() || d.posted.load(std::memory_order_acquire) != p.next_recv + 1 || d.len != len) return false;
  if (len <= kInlineBytes) {
    if (len) std::memcpy(buf, d.data, len);
  } else if (!viaRing(len)) {
    read(local, reinterpret_cast<void*>(d.at.addr), buf, len);
  } else {
    const uint64_t out = q.bytes_out.load(std::memory_order_relaxed);
    if ((d.at.in > out ? d.at.in - out : 0) < len && q.bytes_in.load(std::memory_order_acquire) - out < len)
      return false;
    mapRing(local, me_, &p.ring_in_mapped);
    const char* base = ring(local, me_);
    const size_t pos = out % bounce_bytes_, first = std::min(len, bounce_bytes_ - pos);
    std::memcpy(buf, base + pos, first);
    std::memcpy(static_cast<char*>(buf) + first, base, len - first);
    q.bytes_out.store(out + len, std::memory_order_release);
  }
  q.tail.store(++p.next_recv, std::memory_order_release);
  return true;
}

void ShmTransport::prefetchFrom(int peer, size_t len) {
  const int local = localOf(peer);
  const QueueShared& q = header(local).queue[me_];
  const char* d = reinterpret_cast<const char*>(&q.desc[pairs_[local]->next_recv % kQueueDepth]);
  __builtin_prefetch(d);
  if (len > 64 - 3 * sizeof(uint64_t) && len <= kInlineBytes)
    __builtin_prefetch(d + 64);  // inline bytes in the 2nd line
  if (!viaRing(len)) return;
  __builtin_prefetch(ring(local, me_) + q.bytes_out.load(std::memory_order_relaxed) % bounce_bytes_);
}

size_t ShmTransport::postedRecvs(int peer) const {
  return pairs_[static_cast<size_t>(localOf(peer))]->recvs.size();
}

bool ShmTransport::viaRing(size_t len) const {
  return len > kInlineBytes && (!direct_ || len <= kEagerBytes);
}

// Posts descriptors while the queue has room and feeds the bounce ring the sends it carries.
bool ShmTransport::progressSend(int local) {
  Pair& p = *pairs_[local];
  QueueShared& q = header(me_).queue[local];
  bool moved = false;
  const uint64_t posted = p.next_send;
  for (ReqId id : p.sends) {
    Req& r = req(id);
    if (r.slot != UINT64_MAX) continue;
    if (p.next_send - q.tail.load(std::memory_order_acquire) >= kQueueDepth) break;
    r.slot = p.next_send++;
    describe(q.desc[r.slot % kQueueDepth], r.tag, r.buf, r.len);
    moved = true;
  }
  // The ring carries the bytes of the posted sends it takes, in order. Fed before they are
  // posted: a small message is then whole when the receiver sees its descriptor.
  char* to = ring(me_, local);
  for (ReqId id : p.sends) {
    Req& r = req(id);
    if (r.slot == UINT64_MAX) break;
    if (!viaRing(r.len) || r.fed == r.len) continue;
    mapRing(me_, local, &p.ring_out_mapped);
    uint64_t in = q.bytes_in.load(std::memory_order_relaxed);
    size_t room = bounce_bytes_ - (in - q.bytes_out.load(std::memory_order_acquire));
    while (room > 0 && r.fed < r.len) {
      size_t pos = in % bounce_bytes_;
      size_t n = std::min({room, r.len - r.fed, bounce_bytes_ - pos});
      std::memcpy(to + pos, r.buf + r.fed, n);
      in += n;
      room -= n;
      r.fed += n;
      moved = true;
    }
    q.bytes_in.store(in, std::memory_order_release);
    if (r.fed < r.len) break;
  }
  const uint64_t in = q.bytes_in.load(std::memory_order_relaxed);
  for (uint64_t slot = posted; slot < p.next_send; ++slot) publish(q.desc[slot % kQueueDepth], slot, in);
  // Completion: the receiver has taken the descriptor (and so the data).
  while (!p.sends.empty()) {
    Req& r = req(p.sends.front());
    if (r.slot == UINT64_MAX || q.tail.load(std::memory_order_acquire) <= r.slot) break;
    r.done = true;
    p.sends.pop_front();
    moved = true;
  }
  return moved;
}

bool ShmTransport::progressRecv(int local) {
  Pair& p = *pairs_[local];
  QueueShared& q = header(local).queue[me_];
  bool moved = false;
  while (!p.recvs.empty()) {
    Req& r = req(p.recvs.front());
    const Desc& d = q.desc[p.next_recv % kQueueDepth];
    if (d.posted.load(std::memory_order_acquire) != p.next_recv + 1) break;
    if (r.place) {
      char* buf = nullptr;
      if (!r.place(p.recvs.front(), d.tag, d.len, &buf)) break;
      r.place = nullptr;
      r.buf = buf;
      r.len = d.len;
      r.tag = d.tag;
    }
    if (d.tag != r.tag || d.len != r.len)
      HC_THROW(hcInvalidUsage,
               "shm: message mismatch from rank {}: it sent {} bytes with tag {:#x}, this rank expected {} bytes "
               "with tag {:#x} (collectives called in a different order, or with different counts or types)",
               commRank(local), d.len, d.tag, r.len, r.tag);
    if (r.len <= kInlineBytes) {
      if (r.len) std::memcpy(r.buf, d.data, r.len);
    } else if (!viaRing(r.len)) {
      read(local, reinterpret_cast<void*>(d.at.addr), r.buf, r.len);
    } else {
      mapRing(local, me_, &p.ring_in_mapped);
      const char* from = ring(local, me_);
      uint64_t out = q.bytes_out.load(std::memory_order_relaxed);
      // What was in the ring when it was posted is usually all of it: no look at the count.
      uint64_t avail = d.at.in > out ? d.at.in - out : 0;
      if (avail < r.len - p.bounce_recvd) avail = q.bytes_in.load(std::memory_order_acquire) - out;
      while (avail > 0 && p.bounce_recvd < r.len) {
        size_t pos = out % bounce_bytes_;
        size_t n = std::min<uint64_t>({avail, r.len - p.bounce_recvd, bounce_bytes_ - pos});
        std::memcpy(r.buf + p.bounce_recvd, from + pos, n);
        out += n;
        avail -= n;
        p.bounce_recvd += n;
        moved = true;
      }
      q.bytes_out.store(out, std::memory_order_release);
      if (p.bounce_recvd < r.len) break;
      p.bounce_recvd = 0;
    }
    q.tail.store(++p.next_recv, std::memory_order_release);
    r.done = true;
    p.recvs.pop_front();
    moved = true;
  }
  return moved;
}

void ShmTransport::progress() {
  // After abort nothing moves: a receive posted before it is cancelled, not filled.
  if (aborted_.load(std::memory_order_relaxed)) HC_THROW(hcRemoteError, "shm: the communicator was aborted");
  for (int i = 0; i < localSize(); ++i) {
    if (!pairs_[i]->sends.empty()) progressSend(i);
    if (!pairs_[i]->recvs.empty()) progressRecv(i);
  }
}

bool ShmTransport::test(ReqId id) {
  Req& r = req(id);
  if (aborted_.load(std::memory_order_relaxed)) HC_THROW(hcRemoteError, "shm: the communicator was aborted");
  if (!r.done) {
    progress();
    if (!r.done) {
      checkPeers();
      return false;
    }
  }
  r.gen = 0;
  r.place = nullptr;
  free_reqs_.push_back(static_cast<uint32_t>(id));
  return true;
}

// Requests live in a slab whose slots are reused (a message allocates nothing); the id carries
// the slot's generation, so a stale id is an error rather than another request.
ReqId ShmTransport::newReq(bool send, int local, char* buf, size_t len, uint64_t tag) {
  uint32_t slot;
  if (free_reqs_.empty()) {
    slot = static_cast<uint32_t>(reqs_.size());
    reqs_.push_back(std::make_unique<Req>());
  } else {
    slot = free_reqs_.back();
    free_reqs_.pop_back();
  }
  if (next_gen_ == 0) next_gen_ = 1;  // 0 marks a free slot
  const uint32_t gen = next_gen_++;
  Req& r = *reqs_[slot];
  r.send = send;
  r.peer = local;
  r.buf = buf;
  r.len = len;
  r.tag = tag;
  r.slot = UINT64_MAX;
  r.fed = 0;
  r.done = false;
  r.gen = gen;
  return (static_cast<ReqId>(gen) << 32) | slot;
}

ShmTransport::Req& ShmTransport::req(ReqId id) {
  const uint32_t slot = static_cast<uint32_t>(id), gen = static_cast<uint32_t>(id >> 32);
  HC_CHECK(slot < reqs_.size() && gen != 0 && reqs_[slot]->gen == gen, hcInternalError, "shm: unknown request {}", id);
  return *reqs_[slot];
}

}  // namespace hicoll
