// The C ABI: validate, dispatch, and turn every exception into an hcResult_t.
#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <vector>

#include "algorithms/host.h"
#include "algorithms/node_small.h"
#include "algorithms/p2p.h"
#include "algorithms/quantize.h"
#include "base/deadline.h"
#include "base/error.h"
#include "base/log.h"
#include "base/numeric.h"
#include "bootstrap/rendezvous.h"
#include "core/comm.h"
#include "transport/shm/node_memory.h"
#include "transport/shm/shm_transport.h"
#include "transport/tags.h"

using namespace hicoll;

namespace {

thread_local std::string t_last_error;

// hcStats as it was while hcNumColls was 5 (before hcCollAllToAll): its arrays were shorter,
// so the later fields sat earlier. Every size up to this one is that layout.
struct hcStats5 {
  size_t size;
  int rank, nranks, nnodes, local_ranks, node, local_rank;
  hcCollStats coll[5];
  uint64_t bytes_node_memory[5];
  uint64_t quantized_calls[5];
  double predicted_us[5];
};
static_assert(sizeof(hcStats5) < sizeof(hcStats), "the sizes tell the layouts apart");
static_assert(offsetof(hcStats5, coll) == offsetof(hcStats, coll), "same header");

// A handle that is NULL, destroyed, or not a communicator at all is refused (destroyed ones
// are recognised as long as their shell is kept, see retire()).
[[gnu::noinline, gnu::cold]] bool refuseHandle(const hcComm* c, const char* fn) {
  t_last_error =
      c == nullptr ? fmt::format("{}: comm is NULL", fn)
      : c->api.magic == hicoll::ApiState::kDead
          ? fmt::format("{}: the communicator was destroyed (hcCommDestroy or hcCommAbort) before this call", fn)
          : fmt::format("{}: not a communicator (a corrupted or foreign handle)", fn);
  return true;
}
inline bool bad(const hcComm* c, const char* fn) {
  return !(c && c->api.magic == hicoll::ApiState::kLive) && refuseHandle(c, fn);
}

// Marks comm failed and tells its peers why (failure notices across nodes, the board within);
// with stop_network, its own waits on the network give up too (thread-safe against a call in
// flight on another thread). The first cause is the one kept and told. Revokes run one at a time
// and never after the release of a destroy or abort on another thread (hcComm::lifecycle_mu).
void revoke(hcComm& c, const std::string& why, bool stop_network = true) noexcept {
  try {
    std::lock_guard<std::mutex> lock(c.api.lifecycle_mu);
    if (c.api.magic != hicoll::ApiState::kLive) return;
    const bool first = c.health.fail(why);
    if (c.links.liveness) c.links.liveness->markFailed(fmt::format("rank {}: {}", c.id.rank, why));
    if (first && c.links.ofi) c.links.ofi->announceFailure(fmt::format("rank {}: {}", c.id.rank, why));
    if (c.links.shm) {
      if (first) c.links.shm->setReason(why);
      c.links.shm->abort();  // local peers stop waiting on this rank, and so does this rank
    }
    if (stop_network && c.links.ofi) c.links.ofi->abort();
  } catch (...) {
  }
}

// After a revoke from another thread during a call: a revoke that came before the call opened
// the network (the first call on more than one node does) told no rank of another node, and the
// liveness links would say "bye" at destroy. Tell them now; a failure is announced once at most.
void announceRevoked(hcComm& c, const std::string& why) noexcept {
  try {
    std::lock_guard<std::mutex> lock(c.api.lifecycle_mu);
    if (c.api.magic != hicoll::ApiState::kLive) return;
    const std::string msg = fmt::format("rank {}: {}", c.id.rank, why);
    if (c.links.liveness) c.links.liveness->markFailed(msg);
    if (c.links.ofi) c.links.ofi->announceFailure(msg);
  } catch (...) {
  }
}

// Frees what a communicator holds and keeps its shell, marked dead, so that a later call with
// the stale handle is an error instead of a use after free. The oldest shells are freed.
// Under the lifecycle lock: a revoke from another thread waits, then finds it dead.
void retire(hcComm* c) {
  struct Graveyard {
    std::mutex mu;
    std::deque<hcComm*> shells;
    ~Graveyard() {
      for (hcComm* s : shells) delete s;
    }
  };
  static Graveyard g;
  {
    std::lock_guard<std::mutex> life(c->api.lifecycle_mu);
    c->release();
  }
  std::lock_guard<std::mutex> lock(g.mu);
  g.shells.push_back(c);
  if (g.shells.size() > 1024) {
    delete g.shells.front();
    g.shells.pop_front();
  }
}

// One try/catch for every entry point; a communicator that saw a remote error or a timeout
// is marked failed so later calls fail fast with the first error.
template <class F>
hcResult_t guard(hcComm* comm, const char* fn, F&& f) {
  try {
    if (comm && comm->health.failed())
      HC_THROW(hcRemoteError, "{}: the communicator failed earlier: {}", fn, comm->health.failure());
    std::optional<ScopedLogRank> lr;
    if (comm) lr.emplace(comm->id.rank, comm->id.log_level, comm->id.name.c_str());
    f();
    return hcSuccess;
  } catch (const Error& e) {
    t_last_error = e.what();
    // Revoked from another thread while the call ran (hcCommRevoke, hcCommAbort, a refused
    // second entry): the abort the call saw is the symptom, the revoke's reason the cause.
    if (comm && comm->health.failed()) {
      const std::string why = comm->health.failure();
      if (!why.empty() && t_last_error.find(why) == std::string::npos)
        t_last_error += fmt::format(" (the communicator was revoked during the call: {})", why);
      announceRevoked(*comm, why);
    }
    if (comm && (e.fatal() || e.code() == hcRemoteError || e.code() == hcTimeout) && !comm->health.failed())
      revoke(*comm, e.what(), /*stop_network=*/false);
    ScopedLogRank lr(comm ? comm->id.rank : -1);
    HC_WARN("{} failed: {} ({})", fn, t_last_error, hcGetErrorString(e.code()));
    return e.code();
  } catch (const std::bad_alloc&) {
    t_last_error = std::string(fn) + ": out of memory";
    return hcSystemError;
  } catch (const std::exception& e) {
    t_last_error = std::string(fn) + ": internal error: " + e.what();
    return hcInternalError;
  } catch (...) {
    t_last_error = std::string(fn) + ": unknown internal error";
    return hcInternalError;
  }
}

// Calls on one communicator come from one thread at a time (hicoll.h, "Ordering"); a second
// thread's entry while a call is in progress is refused at once, on its rank, with
// hcInvalidUsage naming both calls. It must take no part in the call protocol: a board post or
// an agreement message of its own would be consumed by the call in progress and mix two calls'
// data. So the refused thread does nothing but revoke the communicator (refuse()): the call in
// progress fails (or, if it was already past its last wait, completes exactly as it would have
// alone), every later call fails at once, and the peers fail their call as for a rejected
// argument (the board's abort and the failure notices carry the reason, which names both calls).
// No rank returns another call's data as success, and nothing waits on the refused call. The
// cost per call is one compare-exchange on the way in and one store on the way out.
// hcCommDestroy, hcCommAbort and a shrink with HC_SHRINK_ABORT wait instead (bounded) for the
// call in progress to return, and keep the slot: nothing enters a communicator being freed.
class CallGate {
 public:
  CallGate(hcComm& c, const char* fn) : c_(c), fn_(fn) { take(); }
  ~CallGate() {
    if (owned_ && !keep_) c_.api.in_call.store(nullptr, std::memory_order_release);
  }
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;
  bool owned() const { return owned_; }
  const char* busy() const { return busy_; }  // the entry point in progress, when refused
  // Retries for up to ms while another call is in progress (not behind a destroy or abort).
  bool waitFor(long ms) {
    waitUntil(
        [&] {
          if (!owned_ && !closing(busy_)) take();
          return owned_ || closing(busy_);
        },
        Deadline(ms));
    return owned_;
  }
  void keepClosed() { keep_ = true; }  // the communicator is being freed: never released
  static bool closing(const char* fn) {
    return fn && (std::strcmp(fn, "hcCommDestroy") == 0 || std::strcmp(fn, "hcCommAbort") == 0);
  }

 private:
  void take() {
    busy_ = nullptr;
    owned_ = c_.api.in_call.compare_exchange_strong(busy_, fn_, std::memory_order_acq_rel, std::memory_order_acquire);
  }
  hcComm& c_;
  const char* fn_;
  const char* busy_ = nullptr;
  bool owned_ = false, keep_ = false;
};

// A refused entry (see CallGate): hcInvalidUsage naming both calls; with revoke_comm (calls
// that communicate) the communicator is revoked so that the call in progress and the peers fail
// too -- never while it is being destroyed or aborted (it is going away anyway).
hcResult_t refuse(hcComm& c, const char* fn, const char* busy, bool revoke_comm = true, long waited_ms = -1) {
  try {
    std::string why =
        waited_ms >= 0
            ? fmt::format("{} on rank {}: {} (call {}) was still in progress on another thread after {} ms", fn,
                          c.id.rank, busy, c.links.calls.load(), waited_ms)
            : fmt::format("{} entered on rank {} while {}{} is in progress on another thread", fn, c.id.rank, busy,
                          CallGate::closing(busy) ? "" : fmt::format(" (call {})", c.links.calls.load()));
    if (revoke_comm && !CallGate::closing(busy)) {
      why += waited_ms >= 0 ? " (the communicator is revoked, not freed: call it again once that call returned)"
                            : " (one thread at a time per communicator: the communicator is revoked)";
      revoke(c, why);
    } else if (!CallGate::closing(busy)) {
      why += " (one thread at a time per communicator)";
    }
    t_last_error = why;
    ScopedLogRank lr(c.id.rank);
    HC_WARN("{} failed: {} ({})", fn, why, hcGetErrorString(hcInvalidUsage));
  } catch (...) {
    t_last_error = std::string(fn) + ": entered while another thread is in a call on the communicator";
  }
  return hcInvalidUsage;
}

// guard() for a call that must have the communicator to itself (CallGate), held until the
// guard's own revoke is done.
template <class F>
hcResult_t entered(hcComm* comm, const char* fn, F&& f, bool communicates = true) {
  CallGate gate(*comm, fn);
  if (!gate.owned()) return refuse(*comm, fn, gate.busy(), communicates);
  return guard(comm, fn, std::forward<F>(f));
}

RedOp resolveOp(hcComm& c, hcRedOp_t op) {
  switch (op) {
    case hcSum: return {OpKind::Sum, 1.0, op};
    case hcProd: return {OpKind::Prod, 1.0, op};
    case hcMax: return {OpKind::Max, 1.0, op};
    case hcMin: return {OpKind::Min, 1.0, op};
    case hcAvg: return {OpKind::Avg, 1.0, op};
    case hcBand: return {OpKind::Band, 1.0, op};
    case hcBor: return {OpKind::Bor, 1.0, op};
    case hcBxor: return {OpKind::Bxor, 1.0, op};
    default: break;
  }
  long i = static_cast<long>(op) - hcNumOps;
  HC_CHECK(i >= 0 && i < static_cast<long>(c.api.premul_ops.size()) && c.api.premul_ops[i].kind == OpKind::PreMulSum,
           hcInvalidArgument, "invalid reduction op {}", static_cast<int>(op));
  return c.api.premul_ops[i];
}

bool overlaps(const void* a, size_t alen, const void* b, size_t blen) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return alen && blen && x < y + blen && y < x + alen;
}

// An AllToAll's side (send or receive): every count and displacement fits, and the extent
// (bytes from the buffer's start to the end of its last block).
size_t allToAllExtent(const hcComm& c, const size_t* counts, const size_t* displs, size_t e, const char* fn,
                      const char* side) {
  HC_CHECK(counts, hcInvalidArgument, "{}: {}counts is NULL", fn, side);
  const size_t limit = SIZE_MAX / e;
  size_t end = 0, packed = 0;
  for (int p = 0; p < c.id.nranks; ++p) {
    const size_t n = counts[p], at = displs ? displs[p] : packed;
    HC_CHECK(n <= limit && at <= limit - n, hcInvalidArgument, "{}: {}counts[{}] = {} at displacement {} overflows", fn,
             side, p, n, at);
    end = std::max(end, n ? at + n : end);
    packed = at + n;
  }
  return end * e;
}

void validateAllToAll(hcComm& c, const CollArgs& a, const char* fn) {
  const size_t e = typeSize(a.dtype), R = static_cast<size_t>(c.id.rank);
  const size_t send_ext = allToAllExtent(c, a.send_counts, a.send_displs, e, fn, "send");
  const size_t recv_ext = allToAllExtent(c, a.recv_counts, a.recv_displs, e, fn, "recv");
  HC_CHECK(a.send_counts[R] == a.recv_counts[R], hcInvalidArgument,
           "{}: rank {} sends itself {} elements (sendcounts[{}]) but receives {} (recvcounts[{}])", fn, c.id.rank,
           a.send_counts[R], R, a.recv_counts[R], R);
  HC_CHECK((send_ext == 0 || a.send) && (recv_ext == 0 || a.recv), hcInvalidArgument, "{}: NULL {} buffer for {} bytes",
           fn, send_ext && !a.send ? "send" : "receive", send_ext && !a.send ? send_ext : recv_ext);
  HC_CHECK(!overlaps(a.send, send_ext, a.recv, recv_ext), hcInvalidArgument,
           "{}: send and receive buffers overlap (an AllToAll is not in place)", fn);
  HC_CHECK(!a.stream, hcUnsupported, "{}: device buffers are not supported yet (host buffers only)", fn);
  HC_CHECK(!isDevicePointer(a.send) && !isDevicePointer(a.recv), hcInvalidArgument,
           "{}: device buffers need a stream (NULL means host buffers)", fn);
}

// Throws hcInvalidArgument for arguments this rank can see are wrong.
void validate(hcComm& c, const CollArgs& a, const char* fn) {
  HC_CHECK(a.dtype >= 0 && a.dtype < hcNumTypes, hcInvalidArgument, "{}: invalid datatype {}", fn,
           static_cast<int>(a.dtype));
  const size_t e = typeSize(a.dtype), W = static_cast<size_t>(c.id.nranks), R = static_cast<size_t>(c.id.rank);
  if (a.coll == hcCollBroadcast)
    HC_CHECK(a.root >= 0 && a.root < c.id.nranks, hcInvalidArgument, "{}: root {} is outside [0, {})", fn, a.root,
             c.id.nranks);
  if (a.coll == hcCollAllToAll) return validateAllToAll(c, a, fn);
  const bool reduces = a.coll == hcCollReduceScatter || a.coll == hcCollAllReduce;
  HC_CHECK(!reduces || !isBitwise(a.op.kind) || isInteger(a.dtype), hcInvalidArgument,
           "{}: reduction op {} is bitwise: integer datatypes only, not {}", fn, opName(a.op.kind), dtypeName(a.dtype));
  if (a.quant.block) {
    HC_CHECK(quant::quantizable(a.dtype), hcInvalidArgument,
             "{}: datatype {} cannot be quantized (float32, bfloat16 or float16)", fn, dtypeName(a.dtype));
    HC_CHECK(a.quant.block <= quant::kMaxBlock, hcInvalidArgument, "{}: block {} is above the largest, {}", fn,
             a.quant.block, quant::kMaxBlock);
    HC_CHECK(a.coll != hcCollReduceScatter || a.op.kind == OpKind::Sum || a.op.kind == OpKind::Avg ||
                 a.op.kind == OpKind::PreMulSum,
             hcInvalidArgument, "{}: reduction op {} has no quantized form (sum, avg or a pre-multiplied sum)", fn,
             opName(a.op.kind));
  }
  if (a.count == 0 && a.coll != hcCollBarrier) return;
  size_t total = 0;  // a multiplication that overflows, not two 64-bit divisions per call
  HC_CHECK(!__builtin_mul_overflow(a.count, e * W, &total), hcInvalidArgument, "{}: count {} overflows", fn, a.count);
  const size_t b = a.count * e;
  const bool needs_send = a.coll != hcCollBroadcast || c.id.rank == a.root;
  HC_CHECK(a.coll == hcCollBarrier || ((!needs_send || a.send) && a.recv), hcInvalidArgument,
           "{}: NULL buffer for {} elements", fn, a.count);
  switch (a.coll) {
    case hcCollAllGather:
      HC_CHECK(a.send == static_cast<char*>(a.recv) + R * b || !overlaps(a.send, b, a.recv, W * b), hcInvalidArgument,
               "{}: send and receive buffers overlap but not in place (sendbuff must be recvbuff + rank * sendcount)",
               fn);
      break;
    case hcCollReduceScatter:
      HC_CHECK(
          a.recv == static_cast<const char*>(a.send) + R * b || !overlaps(a.send, W * b, a.recv, b), hcInvalidArgument,
          "{}: send and receive buffers overlap but not in place (recvbuff must be sendbuff + rank * recvcount)", fn);
      break;
    case hcCollAllReduce:
    case hcCollBroadcast:
      HC_CHECK(a.send == a.recv || !needs_send || !overlaps(a.send, b, a.recv, b), hcInvalidArgument,
               "{}: send and receive buffers overlap but are not equal", fn);
      break;
    default: break;
  }
  if (!a.stream)
    HC_CHECK(!isDevicePointer(a.send) && !isDevicePointer(a.recv), hcInvalidArgument,
             "{}: device buffers need a stream (NULL means host buffers)", fn);
}

// The device path, created by the first call with a stream (collectively: every rank makes one).
DeviceEngine& deviceOf(hcComm& c, const char* fn) {
  if (!c.device) c.device = makeDeviceEngine({c.id, c.plan, *c.links.bootstrap, c.stats, c.health});
  HC_CHECK(c.device, hcUnsupported, "{}: a stream was given but this build of hicoll has no CUDA support", fn);
  return *c.device;
}

// A zero count completes at once without communication (every rank must pass zero; one that
// does not is found at the next call, whose call numbers then differ).
void runColl(hcComm& c, CollArgs& a, const char* fn, const hcRedOp_t* op) {
  try {
    if (op) a.op = resolveOp(c, *op);
    validate(c, a, fn);
  } catch (const Error& e) {
    if (a.stream || c.id.nranks == 1) throw;
    a.call = c.links.nextCall();
    rejectCall(c, a, e.what());
  }
  // An AllToAll always communicates: zero from this rank says nothing of what it receives.
  if (a.count == 0 && a.coll != hcCollBarrier && a.coll != hcCollAllToAll) return;
  a.call = c.links.nextCall();
  if (a.stream) return deviceOf(c, fn).enqueue(a);
  runHostCollective(c, a);
}

// The body of every collective entry point; op (when given) is resolved inside the guard.
// a by reference: the entry points' braced arguments are built once, in place. (Passed by value,
// they were built and then copied with wide loads of fields just stored narrow: a stalled
// store-to-load forward per field, a tenth of a small call's time.)
hcResult_t collective(hcComm_t comm, const char* fn, CollArgs&& a, const hcRedOp_t* op = nullptr) {
  if (bad(comm, fn)) return hcInvalidArgument;
  return entered(comm, fn, [&] { runColl(*comm, a, fn, op); });
}

// The body of the quantized entry points: the descriptor is read here, and a bad one is this
// rank's argument error like any other (its peers are told).
hcResult_t quantized(hcComm_t comm, const char* fn, CollArgs a, const hcQuant* quant, const hcRedOp_t* op = nullptr) {
  if (bad(comm, fn)) return hcInvalidArgument;
  std::string why;
  if (!quant || quant->size < offsetof(hcQuant, block) + sizeof(quant->block))
    why = fmt::format("{}: quant is NULL or its size field is not set (HC_QUANT_INITIALIZER)", fn);
  else if (quant->format != hcQuantInt8Absmax)
    why = fmt::format("{}: unknown quantization format {}", fn, static_cast<int>(quant->format));
  a.quant = QuantArgs{
      .block = why.empty() && quant->block ? quant->block : quant::kDefaultBlock, .dtype = a.dtype, .count = a.count};
  if (why.empty()) return collective(comm, fn, std::move(a), op);
  return entered(comm, fn, [&] {
    if (op) a.op = resolveOp(*comm, *op);
    if (a.stream || comm->id.nranks == 1) HC_THROW(hcInvalidArgument, "{}", why);
    a.call = comm->links.nextCall();
    rejectCall(*comm, a, why);
  });
}

// After a split, before the child is created: whether each rank of the new group accepted its
// configuration (bs: the group's bootstrap, null for HC_SPLIT_NOCOLOR). Throws
// hcInvalidArgument on every rank of the group when one rejected it, naming that rank (by its
// rank in the parent) and its reason; on the rejecting rank, its own reason.
void checkSplitConfigs(hcComm& parent, Bootstrap* bs, const std::string& rejected) {
  if (!bs) {
    if (!rejected.empty()) HC_THROW(hcInvalidArgument, "hcCommSplit: {}", rejected);
    return;
  }
  struct Verdict {
    int32_t parent_rank;
    int32_t rejected;
    char why[248];
  };
  static_assert(sizeof(Verdict) == 256, "wire layout");
  Verdict mine{};
  mine.parent_rank = parent.id.rank;
  mine.rejected = rejected.empty() ? 0 : 1;
  std::snprintf(mine.why, sizeof mine.why, "%s", rejected.c_str());
  std::vector<Verdict> all(static_cast<size_t>(bs->size()));
  bs->allgather(&mine, all.data(), sizeof mine);
  const bool all_rejected = std::all_of(all.begin(), all.end(), [](const Verdict& v) { return v.rejected != 0; });
  if (!rejected.empty())
    HC_THROW(hcInvalidArgument, "hcCommSplit: {} ({}this communicator is unaffected)", rejected,
             all_rejected ? "" : "the other ranks of the new group fail the split too; ");
  for (const Verdict& v : all) {
    if (!v.rejected) continue;
    HC_THROW(hcInvalidArgument,
             "hcCommSplit: {} rejected its configuration for the new communicator: {} (the split "
             "fails on every rank of the new group; this communicator is unaffected)",
             parent.id.who(v.parent_rank), std::string(v.why, strnlen(v.why, sizeof v.why)));
  }
}

hcResult_t initWith(hcComm_t* out, const char* fn, const std::function<std::unique_ptr<hcComm>()>& make) {
  if (!out) {
    t_last_error = std::string(fn) + ": comm is NULL";
    return hcInvalidArgument;
  }
  *out = nullptr;
  return guard(nullptr, fn, [&] { *out = make().release(); });
}

// ---- Point-to-point (algorithms/p2p.h) ----

// The engine, made at the first p2p call.
P2p& p2pOf(hcComm& c) {
  if (!c.p2p) c.p2p = std::make_shared<P2p>(c.id, c.links, c.stats, c.health.timeout_ms);
  return *c.p2p;
}

// Throws for arguments this rank can see are wrong (nothing is posted: the peer's call is left
// to its timeout, as a send that never comes); returns the size in bytes.
size_t p2pBytes(const hcComm& c, const void* buf, size_t count, hcDataType_t dt, int peer, int tag, hcStream_t stream,
                const char* fn) {
  HC_CHECK(dt >= 0 && dt < hcNumTypes, hcInvalidArgument, "{}: invalid datatype {}", fn, static_cast<int>(dt));
  HC_CHECK(tag >= 0, hcInvalidArgument, "{}: tag {} is negative", fn, tag);
  HC_CHECK(peer == -1 || (peer >= 0 && peer < c.id.nranks), hcInvalidArgument, "{}: peer {} is outside [0, {})", fn,
           peer, c.id.nranks);
  const size_t e = typeSize(dt);
  HC_CHECK(count <= SIZE_MAX / e, hcInvalidArgument, "{}: count {} overflows", fn, count);
  HC_CHECK(count == 0 || buf, hcInvalidArgument, "{}: NULL buffer for {} elements", fn, count);
  if (stream) {
    HC_CHECK(tag == 0, hcUnsupported, "{}: tag {} on device buffers: they go to NCCL, which has no tags (tag 0 only)",
             fn, tag);
    HC_CHECK(peer >= 0, hcUnsupported, "{}: a receive from any source takes host buffers only", fn);
  } else {
    HC_CHECK(!isDevicePointer(buf), hcUnsupported,
             "{}: {} is device memory: device buffers go with a stream (hcSend / hcRecv and their tag-0 forms), "
             "the non-blocking calls take host buffers only",
             fn, buf);
  }
  return count * e;
}

// Posts one operation (peer -1: from any source), opening the network first when it needs it.
std::shared_ptr<P2pOp> postP2p(hcComm& c, bool send, void* buf, size_t bytes, int peer, int tag, const char* fn) {
  const bool remote = peer < 0 ? c.id.topo.nnodes > 1 : !c.id.sameNode(peer);
  if (remote) {
    try {
      c.ensureNetwork();
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("{}: opening the network: {}", fn, e.what()), Error::kFatal);
    }
    HC_CHECK(c.links.ofi->tagBits() >= tags::kTagBits, hcUnsupported,
             "{}: the network's provider carries {} tag bits, point-to-point across nodes needs {}", fn,
             c.links.ofi->tagBits(), tags::kTagBits);
  }
  try {
    return p2pOf(c).post(send, peer, tag, buf, bytes, fn);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", fn, e.what()), Error::kFatal);
  }
}

// The operations hcSend / hcRecv posted inside a group on this thread, for hcGroupEnd, and the
// communicators whose device path holds a group open (NCCL's, closed there too).
struct Group {
  int depth = 0;
  std::vector<std::pair<hcComm*, std::shared_ptr<P2pOp>>> ops;
  std::vector<hcComm*> device;
};
thread_local Group t_group;

// Device buffers: enqueued on the stream through the device path (NCCL), as ncclSend / ncclRecv.
void p2pDevice(hcComm& c, bool send, void* buf, size_t count, hcDataType_t dt, int peer, hcStream_t stream,
               const char* fn) {
  const bool grouped = t_group.depth > 0;
  HC_CHECK(peer != c.id.rank || grouped, hcInvalidUsage,
           "{}: a send or receive with itself on device buffers must be in a group with its counterpart "
           "(hcGroupStart / hcGroupEnd), as in NCCL",
           fn);
  DeviceEngine& d = deviceOf(c, fn);
  // Listed first: a group the call opens is ended at hcGroupEnd even if the call fails.
  if (grouped && std::find(t_group.device.begin(), t_group.device.end(), &c) == t_group.device.end())
    t_group.device.push_back(&c);
  d.enqueueP2p({send, buf, count, dt, peer, stream, grouped});
}

hcResult_t p2pBlocking(hcComm_t comm, const char* fn, bool send, void* buf, size_t count, hcDataType_t dt, int peer,
                       int tag, hcStream_t stream) {
  if (bad(comm, fn)) return hcInvalidArgument;
  std::shared_ptr<P2pOp> op;
  const hcResult_t r = entered(comm, fn, [&] {
    const size_t bytes = p2pBytes(*comm, buf, count, dt, peer, tag, stream, fn);
    HC_CHECK(peer >= 0, hcInvalidArgument, "{}: peer {} is outside [0, {})", fn, peer, comm->id.nranks);
    if (stream) return p2pDevice(*comm, send, buf, count, dt, peer, stream, fn);
    const Deadline d = Deadline::fromFirstCheck(comm->health.timeout_ms);
    if (t_group.depth == 0 && p2pOf(*comm).direct(send, peer, tag, buf, bytes, fn, d)) return;
    op = postP2p(*comm, send, buf, bytes, peer, tag, fn);
    P2pOp* ops[] = {op.get()};
    if (t_group.depth == 0) p2pOf(*comm).wait(ops, nullptr, &d);
  });
  if (r == hcSuccess && t_group.depth > 0 && op) t_group.ops.emplace_back(comm, std::move(op));
  return r;
}

// The first error of a group's wait over several communicators (one loop over all of them:
// waiting for one at a time could leave a peer waiting for this rank's progress on another).
hcResult_t waitGroupOps(const std::vector<std::pair<hcComm*, std::shared_ptr<P2pOp>>>& ops) {
  std::vector<hcComm*> comms;
  for (const auto& [c, op] : ops)
    if (std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
  long timeout = 0;
  for (hcComm* c : comms) {
    if (bad(c, "hcGroupEnd")) return hcInvalidArgument;
    timeout = timeout == 0 ? c->health.timeout_ms : std::min(timeout, c->health.timeout_ms);
  }
  std::vector<std::vector<P2pOp*>> of(comms.size());
  for (const auto& [c, op] : ops)
    of[static_cast<size_t>(std::find(comms.begin(), comms.end(), c) - comms.begin())].push_back(op.get());
  const std::string what = fmt::format("hcGroupEnd ({} operations)", ops.size());
  if (comms.size() == 1) return entered(comms[0], "hcGroupEnd", [&] { p2pOf(*comms[0]).wait(of[0], what.c_str()); });
  const Deadline d(timeout);
  struct Stop {};  // one communicator's call failed: its error is the group's
  hcResult_t err = hcSuccess;
  auto each = [&](auto&& f) {
    for (size_t i = 0; i < comms.size(); ++i) {
      const hcResult_t r = entered(comms[i], "hcGroupEnd", [&] { f(i); });
      if (r != hcSuccess) {
        err = r;
        throw Stop{};
      }
    }
  };
  try {
    const bool done = waitUntil(
        [&] {
          bool all = true;
          each([&](size_t i) { all &= p2pOf(*comms[i]).testAll(of[i], what.c_str()); });
          return all;
        },
        d, [&] { each([&](size_t i) { comms[i]->links.checkPeers(); }); },
        [&] { each([&](size_t i) { p2pOf(*comms[i]).checkDeadline(of[i], d, what.c_str()); }); });
    return done ? hcSuccess : hcTimeout;
  } catch (const Stop&) {
    return err;
  }
}

}  // namespace

extern "C" {

const char* hcGetErrorString(hcResult_t r) {
  switch (r) {
    case hcSuccess: return "success";
    case hcInvalidArgument: return "invalid argument";
    case hcInvalidUsage: return "invalid usage";
    case hcSystemError: return "system error";
    case hcRemoteError: return "remote error (a peer failed or disagreed)";
    case hcTimeout: return "timeout";
    case hcUnsupported: return "unsupported";
    case hcInternalError: return "internal error";
    case hcInProgress: return "in progress";
    default: return "unknown result";
  }
}

const char* hcGetLastError(hcComm_t) {
  return t_last_error.c_str();
}

hcResult_t hcGetVersion(int* version) {
  if (!version) return hcInvalidArgument;
  *version = HICOLL_VERSION_CODE;
  return hcSuccess;
}

hcResult_t hcMemAlloc(void** ptr, size_t size) {
  return guard(nullptr, "hcMemAlloc", [&] {
    HC_CHECK(ptr, hcInvalidArgument, "hcMemAlloc: ptr is NULL");
    *ptr = nullptr;
    *ptr = nodeMemAlloc(size);
  });
}

hcResult_t hcMemFree(void* ptr) {
  return guard(nullptr, "hcMemFree", [&] { nodeMemFree(ptr); });
}

hcResult_t hcGetUniqueId(hcUniqueId* id) {
  if (!id) return hcInvalidArgument;
  return guard(nullptr, "hcGetUniqueId", [&] {
    Config cfg = Config::fromEnv();
    *id = makeUniqueId(cfg.str(Knob::SocketIfname), cfg.num(Knob::TimeoutMs));
  });
}

hcResult_t hcCommInitRankConfig(hcComm_t* comm, int nranks, hcUniqueId id, int rank, const hcConfig_t* config) {
  return initWith(comm, "hcCommInitRank", [&] {
    HC_CHECK(nranks > 0 && rank >= 0 && rank < nranks, hcInvalidArgument, "hcCommInitRank: rank {} is outside [0, {})",
             rank, nranks);
    Config cfg = Config::fromEnv().withOverrides(config);
    const long timeout = cfg.num(Knob::TimeoutMs);
    Rendezvous rv = joinUniqueId(id, rank, nranks, timeout);
    return createComm(std::make_unique<Bootstrap>(rv.store, "hc", rank, nranks, timeout), rv.keepalive, cfg, config);
  });
}

hcResult_t hcCommInitRank(hcComm_t* comm, int nranks, hcUniqueId id, int rank) {
  return hcCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

hcResult_t hcCommInitFromEnvConfig(hcComm_t* comm, const hcConfig_t* config) {
  return initWith(comm, "hcCommInitFromEnv", [&] {
    Config cfg = Config::fromEnv().withOverrides(config);
    const long timeout = cfg.num(Knob::TimeoutMs);
    LaunchEnv e = readLaunchEnv(cfg.str(Knob::CommId));
    e.secret = cfg.str(Knob::CommSecret);
    if (e.rank == 0) {
      e.listen_fd = static_cast<int>(cfg.num(Knob::RendezvousFd));
      unsetenv("HICOLL_RENDEZVOUS_FD");  // consumed: a later init must not reuse the number
    }
    Rendezvous rv = joinEnv(e, timeout);
    return createComm(std::make_unique<Bootstrap>(rv.store, "hc", e.rank, e.nranks, timeout), rv.keepalive, cfg,
                      config);
  });
}

hcResult_t hcCommInitFromEnv(hcComm_t* comm) {
  return hcCommInitFromEnvConfig(comm, nullptr);
}

hcResult_t hcCommInitRankStoreConfig(hcComm_t* comm, int nranks, int rank, const hcStoreOps* store, const char* prefix,
                                     const hcConfig_t* config) {
  return initWith(comm, "hcCommInitRankStore", [&] {
    HC_CHECK(store && store->set && store->get, hcInvalidArgument, "hcCommInitRankStore: store callbacks are NULL");
    // The first version of hcStoreOps ended after get; del came later.
    HC_CHECK(store->size >= offsetof(hcStoreOps, del), hcInvalidArgument,
             "hcCommInitRankStore: hcStoreOps.size is {} (set it to sizeof(hcStoreOps))", store->size);
    HC_CHECK(nranks > 0 && rank >= 0 && rank < nranks, hcInvalidArgument,
             "hcCommInitRankStore: rank {} is outside [0, {})", rank, nranks);
    Config cfg = Config::fromEnv().withOverrides(config);
    const long timeout = cfg.num(Knob::TimeoutMs);
    return createComm(
        std::make_unique<Bootstrap>(makeCallbackStore(*store), prefix ? prefix : "hc", rank, nranks, timeout), nullptr,
        cfg, config);
  });
}

hcResult_t hcCommInitRankStore(hcComm_t* comm, int nranks, int rank, const hcStoreOps* store, const char* prefix) {
  return hcCommInitRankStoreConfig(comm, nranks, rank, store, prefix, nullptr);
}

hcResult_t hcCommSplitConfig(hcComm_t comm, int color, int key, hcComm_t* newcomm, const hcConfig_t* config) {
  if (bad(comm, "hcCommSplit") || !newcomm) return hcInvalidArgument;
  *newcomm = nullptr;
  return entered(comm, "hcCommSplit", [&] {
    // The parent's configuration, with the caller's on top. A rank that rejects it still takes
    // part in the collective split (else the others wait out the timeout and fail the parent),
    // then tells its new group: every rank of the group fails the split with its reason, at
    // once, and the parent goes on (hcInvalidArgument does not fail it).
    std::optional<Config> cfg;
    std::string rejected;
    try {
      cfg = comm->plan.cfg.withOverrides(config);
    } catch (const Error& e) {
      rejected = e.what();
    }
    std::unique_ptr<Bootstrap> bs = comm->links.bootstrap->split(color, key);
    checkSplitConfigs(*comm, bs.get(), rejected);
    if (bs) *newcomm = createComm(std::move(bs), comm->api.keepalive, *cfg, config ? config : nullptr, comm).release();
  });
}

hcResult_t hcCommSplit(hcComm_t comm, int color, int key, hcComm_t* newcomm) {
  return hcCommSplitConfig(comm, color, key, newcomm, nullptr);
}

hcResult_t hcCommGetConfig(const hcComm_t comm, hcConfig_t* config) {
  if (bad(comm, "hcCommGetConfig") || !config) return hcInvalidArgument;
  if (config->size < offsetof(hcConfig_t, algo)) {
    t_last_error = fmt::format("hcCommGetConfig: hcConfig_t.size is {} (use HC_CONFIG_INITIALIZER)", config->size);
    return hcInvalidArgument;
  }
  config->magic = HC_CONFIG_MAGIC;
  config->version = HICOLL_VERSION_CODE;
  config->name = comm->id.name.c_str();
  comm->plan.cfg.fill(config);
  return hcSuccess;
}

hcResult_t hcCommShrink(hcComm_t comm, const int* exclude, int nexclude, hcComm_t* newcomm, int flags) {
  if (bad(comm, "hcCommShrink") || !newcomm) return hcInvalidArgument;
  *newcomm = nullptr;
  // With HC_SHRINK_ABORT a call in progress on another thread is aborted and waited for (it
  // returns promptly); without it such a call is a second thread's entry, refused (CallGate).
  CallGate gate(*comm, "hcCommShrink");
  if (!gate.owned() && (flags & HC_SHRINK_ABORT) && !CallGate::closing(gate.busy())) {
    revoke(*comm, "it shrank the communicator (HC_SHRINK_ABORT)");
    gate.waitFor(comm->health.timeout_ms + 1000);
  }
  if (!gate.owned()) return refuse(*comm, "hcCommShrink", gate.busy());
  // Not guarded by the failed state: shrinking a failed communicator is the point.
  return guard(nullptr, "hcCommShrink", [&] {
    ScopedLogRank lr(comm->id.rank);
    HC_CHECK(nexclude >= 0 && (nexclude == 0 || exclude), hcInvalidArgument,
             "hcCommShrink: {} excluded ranks but the list is NULL", nexclude);
    HC_CHECK((flags & ~HC_SHRINK_ABORT) == 0, hcInvalidArgument, "hcCommShrink: unknown flags {:#x}", flags);
    std::vector<int> ex(exclude, exclude + nexclude);
    std::sort(ex.begin(), ex.end());
    for (size_t i = 0; i < ex.size(); ++i) {
      HC_CHECK(ex[i] >= 0 && ex[i] < comm->id.nranks, hcInvalidArgument,
               "hcCommShrink: excluded rank {} is outside [0, {})", ex[i], comm->id.nranks);
      HC_CHECK(i == 0 || ex[i] != ex[i - 1], hcInvalidArgument, "hcCommShrink: rank {} is excluded twice", ex[i]);
    }
    HC_CHECK(!std::binary_search(ex.begin(), ex.end(), comm->id.rank), hcInvalidArgument,
             "hcCommShrink: rank {} excludes itself (only the survivors call it)", comm->id.rank);
    if (flags & HC_SHRINK_ABORT) revoke(*comm, "it shrank the communicator (HC_SHRINK_ABORT)");
    std::unique_ptr<Bootstrap> bs = comm->links.bootstrap->shrink(ex, comm->links.shrinks++);
    *newcomm = createComm(std::move(bs), comm->api.keepalive, comm->plan.cfg, nullptr, comm).release();
    HC_INFO("hcCommShrink: {} ranks left of {} (excluded {})", comm->id.nranks - nexclude, comm->id.nranks,
            fmt::join(ex, ","));
  });
}

hcResult_t hcCommDestroy(hcComm_t comm) {
  if (bad(comm, "hcCommDestroy")) return hcInvalidArgument;
  // A call in progress on another thread is waited for (it is bounded by the timeout itself):
  // freeing the communicator under it would crash it. From here on nothing enters.
  CallGate gate(*comm, "hcCommDestroy");
  const long wait_ms = comm->health.timeout_ms + 1000;
  if (!gate.owned() && !gate.waitFor(wait_ms))
    return refuse(*comm, "hcCommDestroy", gate.busy(), true, CallGate::closing(gate.busy()) ? -1 : wait_ms);
  gate.keepClosed();
  hcResult_t r = guard(nullptr, "hcCommDestroy", [&] {
    if (comm->device) comm->device->drain();
    // Small Broadcasts that returned before the peers started them: a disagreement the peers
    // posted, or a peer that destroyed its communicator without them, is this call's error
    // (only a communicator on one node has such phases). Nothing is waited for.
    if (!comm->health.failed()) {
      ScopedLogRank lr(comm->id.rank);
      settleUnchecked(*comm);
    }
    // A send completes locally before its receiver matched it; closing the endpoint then can
    // lose it (libfabric's net provider does). Meet the other ranks first, bounded: a barrier
    // over the transports (a dead rank is an error at once), then one over the bootstrap (its
    // messages cannot be lost by the endpoints closing).
    if (comm->id.topo.nnodes > 1 && !comm->health.failed()) {
      ScopedLogRank lr(comm->id.rank);
      try {
        comm->ensureNetwork(/*destroying=*/true);  // never opened (no call): nothing in flight
        if (!comm->links.ofi) return;
        CollArgs b{.coll = hcCollBarrier, .dtype = hcUint8, .destroy = true};
        b.call = comm->links.nextCall();
        runHostCollective(*comm, b);
        comm->links.bootstrap->barrier();
      } catch (const Error& e) {
        HC_WARN("hcCommDestroy: ranks did not all reach destroy: {}", e.what());
        revoke(*comm, fmt::format("could not meet the others in hcCommDestroy: {}", e.what()), false);
      }
    }
  });
  retire(comm);
  return r;
}

hcResult_t hcCommRevoke(hcComm_t comm) {
  if (bad(comm, "hcCommRevoke")) return hcInvalidArgument;
  revoke(*comm, "it revoked the communicator (hcCommRevoke)");
  return hcSuccess;
}

hcResult_t hcCommAbort(hcComm_t comm) {
  if (bad(comm, "hcCommAbort")) return hcInvalidArgument;
  // A call in progress on another thread returns promptly once revoked; it is waited for before
  // anything is freed.
  revoke(*comm, "it called hcCommAbort");
  CallGate gate(*comm, "hcCommAbort");
  const long wait_ms = comm->health.timeout_ms + 1000;
  if (!gate.owned() && !gate.waitFor(wait_ms))
    return refuse(*comm, "hcCommAbort", gate.busy(), true, CallGate::closing(gate.busy()) ? -1 : wait_ms);
  gate.keepClosed();
  retire(comm);
  return hcSuccess;
}

hcResult_t hcCommCount(const hcComm_t comm, int* count) {
  if (bad(comm, "hcCommCount") || !count) return hcInvalidArgument;
  *count = comm->id.nranks;
  return hcSuccess;
}

hcResult_t hcCommUserRank(const hcComm_t comm, int* rank) {
  if (bad(comm, "hcCommUserRank") || !rank) return hcInvalidArgument;
  *rank = comm->id.rank;
  return hcSuccess;
}

hcResult_t hcCommGetStats(const hcComm_t comm, hcStats* stats) {
  if (bad(comm, "hcCommGetStats") || !stats || stats->size < sizeof(size_t)) return hcInvalidArgument;
  const hcStats s = comm->stats.snapshot();
  hcStats5 old;  // a caller built against hcNumColls = 5 gets that layout
  const bool five = stats->size <= sizeof(hcStats5);
  if (five) {
    std::memcpy(&old, &s, offsetof(hcStats5, coll));
    for (int k = 0; k < 5; ++k) {
      old.coll[k] = s.coll[k];
      old.bytes_node_memory[k] = s.bytes_node_memory[k];
      old.quantized_calls[k] = s.quantized_calls[k];
      old.predicted_us[k] = s.predicted_us[k];
    }
  }
  const char* from = five ? reinterpret_cast<const char*>(&old) : reinterpret_cast<const char*>(&s);
  const size_t n = std::min(stats->size, five ? sizeof(hcStats5) : sizeof(hcStats));
  std::memcpy(reinterpret_cast<char*>(stats) + sizeof(size_t), from + sizeof(size_t), n - sizeof(size_t));
  return hcSuccess;
}

hcResult_t hcRedOpCreatePreMulSum(hcRedOp_t* op, const void* scalar, hcDataType_t dtype, hcComm_t comm) {
  if (bad(comm, "hcRedOpCreatePreMulSum") || !op || !scalar) return hcInvalidArgument;
  // The ops table is the calls' (resolveOp): not changed under one (refused, not revoked).
  return entered(
      comm, "hcRedOpCreatePreMulSum",
      [&] {
        double v = 0;
        HC_CHECK(num::decodeScalar(scalar, dtype, &v), hcInvalidArgument, "hcRedOpCreatePreMulSum: invalid datatype {}",
                 static_cast<int>(dtype));
        size_t i = 0;
        while (i < comm->api.premul_ops.size() && comm->api.premul_ops[i].kind == OpKind::PreMulSum) ++i;
        if (i == comm->api.premul_ops.size()) comm->api.premul_ops.emplace_back();
        *op = static_cast<hcRedOp_t>(hcNumOps + i);
        comm->api.premul_ops[i] = RedOp{OpKind::PreMulSum, v, *op};
      },
      /*communicates=*/false);
}

hcResult_t hcRedOpDestroy(hcRedOp_t op, hcComm_t comm) {
  if (bad(comm, "hcRedOpDestroy")) return hcInvalidArgument;
  CallGate gate(*comm, "hcRedOpDestroy");
  if (!gate.owned()) return refuse(*comm, "hcRedOpDestroy", gate.busy(), /*revoke_comm=*/false);
  long i = static_cast<long>(op) - hcNumOps;
  if (i < 0 || i >= static_cast<long>(comm->api.premul_ops.size()) ||
      comm->api.premul_ops[i].kind != OpKind::PreMulSum) {
    t_last_error =
        fmt::format("hcRedOpDestroy: {} is not a pre-multiplied sum of this communicator", static_cast<int>(op));
    return hcInvalidArgument;
  }
  comm->api.premul_ops[i] = RedOp{};  // Sum kind marks the slot free
  return hcSuccess;
}

hcResult_t hcAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, hcDataType_t datatype, hcComm_t comm,
                       hcStream_t stream) {
  return collective(comm, "hcAllGather",
                    {.coll = hcCollAllGather,
                     .send = sendbuff,
                     .recv = recvbuff,
                     .count = sendcount,
                     .dtype = datatype,
                     .stream = stream});
}

hcResult_t hcAllGatherQuantized(const void* sendbuff, void* recvbuff, size_t sendcount, hcDataType_t datatype,
                                const hcQuant* quant, hcComm_t comm, hcStream_t stream) {
  return quantized(comm, "hcAllGatherQuantized",
                   {.coll = hcCollAllGather,
                    .send = sendbuff,
                    .recv = recvbuff,
                    .count = sendcount,
                    .dtype = datatype,
                    .stream = stream},
                   quant);
}

hcResult_t hcReduceScatterQuantized(const void* sendbuff, void* recvbuff, size_t recvcount, hcDataType_t datatype,
                                    hcRedOp_t op, const hcQuant* quant, hcComm_t comm, hcStream_t stream) {
  return quantized(comm, "hcReduceScatterQuantized",
                   {.coll = hcCollReduceScatter,
                    .send = sendbuff,
                    .recv = recvbuff,
                    .count = recvcount,
                    .dtype = datatype,
                    .stream = stream},
                   quant, &op);
}

hcResult_t hcReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, hcDataType_t datatype, hcRedOp_t op,
                           hcComm_t comm, hcStream_t stream) {
  return collective(comm, "hcReduceScatter",
                    {.coll = hcCollReduceScatter,
                     .send = sendbuff,
                     .recv = recvbuff,
                     .count = recvcount,
                     .dtype = datatype,
                     .stream = stream},
                    &op);
}

hcResult_t hcAllReduce(const void* sendbuff, void* recvbuff, size_t count, hcDataType_t datatype, hcRedOp_t op,
                       hcComm_t comm, hcStream_t stream) {
  return collective(comm, "hcAllReduce",
                    {.coll = hcCollAllReduce,
                     .send = sendbuff,
                     .recv = recvbuff,
                     .count = count,
                     .dtype = datatype,
                     .stream = stream},
                    &op);
}

hcResult_t hcBroadcast(const void* sendbuff, void* recvbuff, size_t count, hcDataType_t datatype, int root,
                       hcComm_t comm, hcStream_t stream) {
  return collective(comm, "hcBroadcast",
                    {.coll = hcCollBroadcast,
                     .send = sendbuff,
                     .recv = recvbuff,
                     .count = count,
                     .dtype = datatype,
                     .root = root,
                     .stream = stream});
}

hcResult_t hcBarrier(hcComm_t comm) {
  return collective(comm, "hcBarrier", {.coll = hcCollBarrier, .dtype = hcUint8});
}

hcResult_t hcAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                       const size_t* recvcounts, const size_t* rdispls, hcDataType_t datatype, hcComm_t comm,
                       hcStream_t stream) {
  if (bad(comm, "hcAllToAllv")) return hcInvalidArgument;
  size_t sent = 0;
  if (sendcounts)
    for (int p = 0; p < comm->id.nranks; ++p) sent += sendcounts[p];  // for messages only
  return collective(comm, "hcAllToAllv",
                    {.coll = hcCollAllToAll,
                     .send = sendbuff,
                     .recv = recvbuff,
                     .count = sent,
                     .dtype = datatype,
                     .stream = stream,
                     .send_counts = sendcounts,
                     .send_displs = sdispls,
                     .recv_counts = recvcounts,
                     .recv_displs = rdispls});
}

hcResult_t hcAllToAll(const void* sendbuff, void* recvbuff, size_t count, hcDataType_t datatype, hcComm_t comm,
                      hcStream_t stream) {
  if (bad(comm, "hcAllToAll")) return hcInvalidArgument;
  const std::vector<size_t> counts(static_cast<size_t>(comm->id.nranks), count);
  return collective(comm, "hcAllToAll",
                    {.coll = hcCollAllToAll,
                     .send = sendbuff,
                     .recv = recvbuff,
                     .count = count * counts.size(),
                     .dtype = datatype,
                     .stream = stream,
                     .send_counts = counts.data(),
                     .recv_counts = counts.data()});
}

}  // extern "C"

// The request of a non-blocking call: its communicator and its operation (shared with the
// engine until it completes).
struct hcRequest {
  static constexpr uint64_t kLive = 0x68637265714c4956ull, kDead = 0x6863726571444541ull;
  uint64_t magic = kLive;
  hcComm* comm;
  std::shared_ptr<hicoll::P2pOp> op;
};

namespace {

hcResult_t p2pPost(hcComm_t comm, const char* fn, bool send, void* buf, size_t count, hcDataType_t dt, int peer,
                   int tag, hcRequest_t* req) {
  if (bad(comm, fn)) return hcInvalidArgument;
  if (!req) {
    t_last_error = fmt::format("{}: request is NULL", fn);
    return hcInvalidArgument;
  }
  *req = nullptr;
  return entered(comm, fn, [&] {
    const size_t bytes = p2pBytes(*comm, buf, count, dt, peer, tag, nullptr, fn);
    HC_CHECK(peer >= 0 || !send, hcInvalidArgument, "{}: peer {} is outside [0, {})", fn, peer, comm->id.nranks);
    auto r = std::make_unique<hcRequest>();
    r->comm = comm;
    r->op = postP2p(*comm, send, buf, bytes, peer, tag, fn);
    *req = r.release();
  });
}

// Frees what a finished request holds and keeps its shell, marked dead, so that a later call
// with the stale handle is an error instead of a use after free (as retire() for
// communicators); the oldest shells are freed.
void retireRequest(hcRequest* req) {
  struct Graveyard {
    std::mutex mu;
    std::deque<std::unique_ptr<hcRequest>> shells;
  };
  static Graveyard g;
  req->magic = hcRequest::kDead;
  req->op.reset();
  std::lock_guard<std::mutex> lock(g.mu);
  g.shells.emplace_back(req);
  if (g.shells.size() > 4096) g.shells.pop_front();
}

// hcIrecv / hcIrecvTag: a named peer (p2pPost's -1 is any source, hcIrecvAny's).
hcResult_t irecvFrom(hcComm_t comm, const char* fn, void* buf, size_t count, hcDataType_t dt, int peer, int tag,
                     hcRequest_t* req) {
  if (peer < 0 && comm && comm->api.magic == ApiState::kLive) {
    t_last_error =
        fmt::format("{}: peer {} is outside [0, {}) (hcIrecvAny receives from any source)", fn, peer, comm->id.nranks);
    return hcInvalidArgument;
  }
  return p2pPost(comm, fn, false, buf, count, dt, peer, tag, req);
}

bool badRequest(hcRequest_t req, const char* fn) {
  if (req && req->magic == hcRequest::kLive) return false;
  t_last_error = req ? fmt::format("{}: not a live request (freed by hcWait already?)", fn)
                     : fmt::format("{}: request is NULL", fn);
  return true;
}

}  // namespace

extern "C" {

hcResult_t hcSend(const void* sendbuff, size_t count, hcDataType_t datatype, int peer, hcComm_t comm,
                  hcStream_t stream) {
  return p2pBlocking(comm, "hcSend", true, const_cast<void*>(sendbuff), count, datatype, peer, 0, stream);
}

hcResult_t hcRecv(void* recvbuff, size_t count, hcDataType_t datatype, int peer, hcComm_t comm, hcStream_t stream) {
  return p2pBlocking(comm, "hcRecv", false, recvbuff, count, datatype, peer, 0, stream);
}

hcResult_t hcIsend(const void* sendbuff, size_t count, hcDataType_t datatype, int peer, hcComm_t comm,
                   hcRequest_t* request) {
  return p2pPost(comm, "hcIsend", true, const_cast<void*>(sendbuff), count, datatype, peer, 0, request);
}

hcResult_t hcIrecv(void* recvbuff, size_t count, hcDataType_t datatype, int peer, hcComm_t comm, hcRequest_t* request) {
  return irecvFrom(comm, "hcIrecv", recvbuff, count, datatype, peer, 0, request);
}

hcResult_t hcIrecvAny(void* recvbuff, size_t count, hcDataType_t datatype, hcComm_t comm, hcRequest_t* request) {
  return p2pPost(comm, "hcIrecvAny", false, recvbuff, count, datatype, -1, 0, request);
}

hcResult_t hcSendTag(const void* sendbuff, size_t count, hcDataType_t datatype, int peer, int tag, hcComm_t comm,
                     hcStream_t stream) {
  return p2pBlocking(comm, "hcSendTag", true, const_cast<void*>(sendbuff), count, datatype, peer, tag, stream);
}

hcResult_t hcRecvTag(void* recvbuff, size_t count, hcDataType_t datatype, int peer, int tag, hcComm_t comm,
                     hcStream_t stream) {
  return p2pBlocking(comm, "hcRecvTag", false, recvbuff, count, datatype, peer, tag, stream);
}

hcResult_t hcIsendTag(const void* sendbuff, size_t count, hcDataType_t datatype, int peer, int tag, hcComm_t comm,
                      hcRequest_t* request) {
  return p2pPost(comm, "hcIsendTag", true, const_cast<void*>(sendbuff), count, datatype, peer, tag, request);
}

hcResult_t hcIrecvTag(void* recvbuff, size_t count, hcDataType_t datatype, int peer, int tag, hcComm_t comm,
                      hcRequest_t* request) {
  return irecvFrom(comm, "hcIrecvTag", recvbuff, count, datatype, peer, tag, request);
}

hcResult_t hcIrecvAnyTag(void* recvbuff, size_t count, hcDataType_t datatype, int tag, hcComm_t comm,
                         hcRequest_t* request) {
  return p2pPost(comm, "hcIrecvAnyTag", false, recvbuff, count, datatype, -1, tag, request);
}

hcResult_t hcTest(hcRequest_t req, int* done) {
  if (badRequest(req, "hcTest")) return hcInvalidArgument;
  if (!done) {
    t_last_error = "hcTest: done is NULL";
    return hcInvalidArgument;
  }
  *done = 0;
  if (bad(req->comm, "hcTest")) return hcInvalidArgument;
  return entered(
      req->comm, "hcTest", [&] { *done = p2pOf(*req->comm).test(*req->op) ? 1 : 0; }, /*communicates=*/false);
}

hcResult_t hcWait(hcRequest_t req) {
  if (badRequest(req, "hcWait")) return hcInvalidArgument;
  hcComm* comm = req->comm;
  if (bad(comm, "hcWait")) {
    retireRequest(req);
    return hcInvalidArgument;
  }
  CallGate gate(*comm, "hcWait");
  if (!gate.owned()) return refuse(*comm, "hcWait", gate.busy(), /*revoke_comm=*/false);
  const hcResult_t res = guard(comm, "hcWait", [&] {
    P2pOp& op = *req->op;
    P2pOp* ops[] = {&op};
    if (!op.done()) p2pOf(*comm).wait(ops, nullptr);
  });
  retireRequest(req);  // on every return but a refused entry
  return res;
}

hcResult_t hcRequestSource(hcRequest_t req, int* source) {
  if (badRequest(req, "hcRequestSource")) return hcInvalidArgument;
  if (!source) {
    t_last_error = "hcRequestSource: source is NULL";
    return hcInvalidArgument;
  }
  *source = req->op->source;
  return *source >= 0 ? hcSuccess : hcInProgress;
}

hcResult_t hcGroupStart(void) {
  ++t_group.depth;
  return hcSuccess;
}

hcResult_t hcGroupEnd(void) {
  if (t_group.depth == 0) {
    t_last_error = "hcGroupEnd: no hcGroupStart on this thread";
    return hcInvalidUsage;
  }
  if (--t_group.depth > 0) return hcSuccess;
  const auto ops = std::move(t_group.ops);
  const auto device = std::move(t_group.device);
  t_group.ops.clear();
  t_group.device.clear();
  hcResult_t r = hcSuccess;
  for (hcComm* c : device) {  // NCCL's groups first: they only enqueue
    if (bad(c, "hcGroupEnd")) return hcInvalidArgument;
    const hcResult_t d = entered(c, "hcGroupEnd", [&] { c->device->endGroup(); });
    if (r == hcSuccess) r = d;
  }
  if (ops.empty()) return r;
  const hcResult_t h = waitGroupOps(ops);
  return r != hcSuccess ? r : h;
}

}  // extern "C"
