// The hierarchical device path, independent of CUDA: how device-buffer collectives are cut
// into chunks, which copies, reductions and counter waits go on the engine's stream, and the
// proxy thread that moves the inter-node part over the network.
//
// Stream ordering. Everything a collective does on the GPU is enqueued at call time on one
// internal stream, between joinFrom(user stream) and joinTo(user stream) (CUDA events), so
// the user's stream and the proxy never wait for work that is enqueued later: a counter the
// stream waits on is only ever advanced by work enqueued earlier (on this or a peer's stream)
// or by the proxy thread, which itself waits only on earlier stream work and the network.
// That rules out the false-dependency deadlocks cuStreamWaitValue32 warns about. The proxy
// never calls CUDA; it polls and writes counters in pinned host memory.
//
// Buffers (per rank): dsort, device memory that the node's ranks map with CUDA IPC; dwork,
// private device memory for partial sums; hscratch / hsort, pinned host memory that stages the
// inter-node traffic (sent from hscratch, received into hsort). Each is a ring of kDepth
// fixed slots (dwork: kDepth partial slots and an inbox), one slot per chunk in flight.
//
// Counters (uint32, cyclic, in a host segment shared by the node's ranks, one writer each):
//   pub[l]   rank l's stream: its slot for intra step s is filled (peers may read it)
//   cons[l]  rank l's stream: it finished reading its peers' slots of step s
//   staged / h2d  this rank's stream -> proxy: network step x staged in hscratch / hsort slot
//                 of step x copied out (free again)
//   sent / recvd  proxy -> stream: sends of step x done (hscratch slot free) / receives of
//                 step x landed in hsort
//   started / finished  the stream reached / completed collective j (the proxy's watchdog)
// Step numbers are global and advance identically on every rank when every rank runs the same
// collectives with the same chunking. That is checked, not assumed: each collective's call
// descriptor (base/coll.h) is published in the node segment at enqueue and sent to the rail
// peers, and the proxy compares its peers' with its own while the data moves; a difference
// fails every rank with both calls named (hier_agree.cc) instead of corrupting or hanging.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/coll.h"
#include "base/identity.h"
#include "base/topology.h"
#include "device/dev_stream.h"
#include "plan/plan.h"
#include "transport/transport.h"

namespace hicoll::dev {

constexpr int kDepth = 2;  // ring slots per buffer: chunk k+1 fills while chunk k drains

// A quantized call that quantizes here (one run exact carries quant.packed, as on the host).
inline bool quantizes(const CollArgs& a) {
  return a.quant.block && !a.quant.packed;
}

enum class Counter : int { Pub = 0, Cons, Staged, Sent, Recvd, H2d, Started, Finished, Agreed, kCount };

// The node's counter segment: a header line (the node's abort word), then one 64-byte line per
// (local rank, counter) so that no two writers share a cache line, then each local rank's ring
// of call descriptors (one line per collective: the descriptor's 4 words and the job number).
struct FlagLayout {
  static constexpr size_t kLine = 64;
  // Descriptors per local rank: a rank's enqueue may run this many collectives ahead of a
  // peer's proxy before its entry is overwritten (that peer then skips the node check).
  static constexpr size_t kDescRing = 64;
  volatile uint32_t* host = nullptr;  // segment base in this process
  uint64_t dev = 0;                   // the same for the stream (0 for host streams)
  int local_ranks = 0;

  static size_t counterLines(int local_ranks) {
    return 1 + static_cast<size_t>(local_ranks) * static_cast<size_t>(Counter::kCount);
  }
  static size_t bytes(int local_ranks) {
    return kLine * (counterLines(local_ranks) + static_cast<size_t>(local_ranks) * kDescRing);
  }
  // Words 0-3: the descriptor of collective `job` of rank `local`; word 4: job (0 while written).
  uint64_t* descLine(int local, uint64_t job) const {
    const size_t line = counterLines(local_ranks) + static_cast<size_t>(local) * kDescRing + job % kDescRing;
    return reinterpret_cast<uint64_t*>(const_cast<uint32_t*>(host) + line * kLine / 4);
  }
  FlagRef at(int local, Counter c) const {
    const size_t off =
        kLine * (1 + static_cast<size_t>(local) * static_cast<size_t>(Counter::kCount) + static_cast<size_t>(c));
    return FlagRef{host + off / 4, dev ? dev + off : 0};
  }
  // Set (to 1 + the failing rank) when any rank of the node fails; never cleared.
  FlagRef abortWord() const { return FlagRef{host, dev}; }
};

struct Resources {
  int rank = 0;
  Topology topo;             // must be uniform (every node has the same number of ranks)
  std::vector<char*> dsort;  // by local index: that rank's dsort as mapped in this process
  size_t dsort_bytes = 0;
  char* dwork = nullptr;
  size_t dwork_bytes = 0;
  char* hscratch = nullptr;
  size_t hscratch_bytes = 0;
  char* hsort = nullptr;
  size_t hsort_bytes = 0;
  FlagLayout flags;
  Transport* net = nullptr;  // reaches the rail peers on other nodes; null on one node
  size_t chunk_bytes = 1 << 20;
  // What planCall reads besides the topology: the communicator's configuration (its AllReduce
  // split, HICOLL_ALLREDUCE_SMALL_BYTES, and the buffer rules) and model. The engine runs the
  // plan's split (CollPlan::allreduce_small, allreduce_block), not one of its own.
  PlanContext plan;
  long timeout_ms = 120000;
};

// Buffer sizes that let chunks of chunk_bytes flow (each capped by its knob).
struct BufferSizes {
  size_t dsort = 0, dwork = 0, hscratch = 0, hsort = 0;
};
BufferSizes bufferSizes(int local_ranks, int nnodes, size_t chunk_bytes, size_t scratch_knob, size_t sort_knob);

class HierEngine {
 public:
  HierEngine(Resources res, std::unique_ptr<DevStream> stream);
  ~HierEngine();
  HierEngine(const HierEngine&) = delete;
  HierEngine& operator=(const HierEngine&) = delete;

  // "" when the engine can run a, otherwise why not (then the caller falls back). Depends
  // only on values that agree across ranks.
  std::string unsupported(const CollArgs& a) const;
  // The call's plan (planCall with the device's capabilities), whose AllReduce split the
  // engine runs; the same plan dev::decide took it by.
  CollPlan plan(const CollArgs& a) const;
  bool smallAllReduce(const CollArgs& a) const { return a.coll == hcCollAllReduce && plan(a).allreduce_small; }
  // Enqueues a on its stream (a.stream) and returns. Throws hicoll::Error if the engine
  // failed earlier or cannot enqueue; errors found later surface on the next call.
  void enqueue(const CollArgs& a);
  // Waits until every enqueued collective has completed (bounded by the timeout, counted
  // from the last progress); throws the engine's error if it failed.
  void drain();
  // Fails the engine: records why, tells the node (abort word), releases every counter so that
  // no stream stays blocked, and aborts the network. Later calls throw.
  void abort(hcResult_t code, const std::string& why);
  bool failed() const { return failed_.load(); }
  // Payload bytes this rank sends for a, per peer (statistics).
  void forEachPeerBytes(const CollArgs& a, const std::function<void(int peer, size_t bytes)>& fn) const;
  // Chunk size (bytes) the engine uses for a, 0 when the buffers cannot hold one element.
  size_t chunkFor(const CollArgs& a) const;
  // The quantization block of what a moves as images, 0 when it moves exact. A quantized
  // ReduceScatter's partials cross nodes as images chunk by chunk (the node's own sums stay
  // exact), unless on one node or when a chunk's image would not be smaller than the chunk
  // (every rank decides alike from the call, as the host path does).
  size_t wireBlock(const CollArgs& a) const;
  DevStream& stream() { return *stream_; }

 private:
  struct Xfer {
    int peer;
    char* buf;
    size_t len;
  };
  struct NetStep {
    uint64_t x = 0;
    std::vector<Xfer> sends, recvs;
  };
  struct Job {
    uint64_t id = 0;
    std::string what;
    CallDesc desc;  // what every rank of the collective must agree on
    std::vector<NetStep> steps;
  };
  enum class Kind { AllGather, ReduceScatter, Broadcast };

  size_t chunkBytes(Kind k, size_t esize) const;
  FlagRef pub(int local) const { return res_.flags.at(local, Counter::Pub); }
  FlagRef cons(int local) const { return res_.flags.at(local, Counter::Cons); }
  FlagRef mine(Counter c) const { return res_.flags.at(l_, c); }
  void waitAtLeast(const FlagRef& f, uint64_t v);   // no-op for v == 0 (counters start there)
  void waitFreed(const FlagRef& f, uint64_t step);  // reached(step - kDepth), if step > kDepth
  // Rows of one chunk between a slot (pieces q apart, indexed by node m) and a user buffer
  // (blocks b apart, indexed by rank(m, local)).
  void copyPieces(bool to_user, char* user, size_t b, size_t off, char* slot, size_t q, int local, size_t len);

  void emitAllGather(const char* send, char* recv, size_t b, size_t esize, Job& job);
  void emitReduceScatter(const char* send, char* recv, size_t b, const CollArgs& a, Job& job);
  void emitBroadcast(const char* send, char* recv, size_t b, int root, Job& job);
  void emitAllReduce(const CollArgs& a, Job& job);
  // hcAllGatherQuantized: this rank's block quantized once on the stream, the images gathered
  // by emitAllGather, every image (its own too) dequantized into recv.
  void emitQuantizedAllGather(const CollArgs& a, Job& job);
  ReduceJob reduction(const CollArgs& a, bool first_stage, bool last_stage) const;

  void proxyMain();
  void runJob(const Job& job);
  // The descriptor check (hier_agree.cc): publish at enqueue; post the rail exchange when the
  // proxy starts the job; poll until every peer's arrived and matched (throws hcInvalidUsage
  // naming both calls); what is still missing, for a timeout's message.
  void publishDesc(const Job& job);
  void postDescs(const Job& job);
  bool pollDescs(const Job& job);
  std::string missingDescs() const;
  void compareDesc(int peer, const CallDesc& theirs, const Job& job) const;
  enum class DescRead { NotYet, Read, Overwritten };
  DescRead readDesc(int local, uint64_t job, CallDesc* out) const;
  // Throws hcInvalidUsage if a local peer has published a different call for job: when the
  // node aborts, the difference is the cause to report, not the abort.
  void compareLocalDescs(const Job& job) const;
  [[noreturn]] void throwNodeFailed(const Job& job, const std::string& who, const char* when) const;
  // Throws when a rank of another node sent a failure notice (the proxy's waits call it).
  void checkOtherNodes(const Job& job);
  // The proxy's one wait (hicoll::waitUntil): pass() until Done; false when the engine stops
  // or fails first. After an idle pass a local peer's abort (named with `during`) and another
  // node's failure notice end it with their error; past `bound`, timeout() throws.
  template <class Pass, class Timeout>
  bool proxyWait(const Job& job, const char* during, const Deadline& bound, Pass&& pass, Timeout&& timeout);
  void waitStream(const Job& job, Counter c, uint64_t v, const char* what);
  void waitNodeAgreed(const Job& job);
  void throwIfFailed() const;
  void releaseCounters();
  bool nodeAborted(std::string* who) const;

  Resources res_;
  Identity id_;  // res_'s rank and topology, as planCall takes them
  std::unique_ptr<DevStream> stream_;
  int L_ = 1, N_ = 1, W_ = 1, n_ = 0, l_ = 0;
  size_t dslot_ = 0, wslot_ = 0, hsslot_ = 0, hrslot_ = 0;  // ring slot sizes (fixed per buffer)

  // Enqueue-side counters (atomic: the proxy reads them when it releases counters).
  std::atomic<uint64_t> S_{0};  // intra steps
  std::atomic<uint64_t> X_{0};  // network steps of this rank
  std::atomic<uint64_t> J_{0};  // collectives

  std::thread proxy_;
  std::mutex mu_;
  std::condition_variable cv_;       // jobs for the proxy
  std::condition_variable done_cv_;  // a job completed
  std::deque<Job> queue_;
  std::atomic<uint64_t> completed_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  // The proxy's descriptor check of the job it runs (buffers outlive a job cut short by a
  // failure: the network may still write into them until it is aborted).
  std::vector<int> rails_;  // rail peers: this local index on every other node
  std::vector<CallDesc> desc_in_;
  CallDesc desc_out_;
  std::vector<ReqId> desc_recv_, desc_send_;  // 0 once complete
  std::vector<char> local_ok_;
  mutable std::mutex err_mu_;
  hcResult_t err_code_ = hcSuccess;
  std::string err_;
};

}  // namespace hicoll::dev
