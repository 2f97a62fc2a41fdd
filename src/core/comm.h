// The communicator: configuration, bootstrap, topology, transports, buffers and statistics.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/liveness.h"
#include "base/coll.h"
#include "base/config.h"
#include "core/device.h"
#include "base/topology.h"
#include "base/machine_figures.h"
#include "transport/ofi/ofi_transport.h"
#include "transport/transport.h"

namespace hicoll {
class ShmTransport;
struct PlanMemos;  // plan/plan.h: planCall's last plans
}

struct hcComm {
  static constexpr uint64_t kLive = 0x68636f6d6d4c4956ull, kDead = 0x68636f6d6d444541ull;
  uint64_t magic = kLive;  // kDead once destroyed (the API refuses the handle)
  hicoll::Config cfg;     // what it runs with (hcCommGetConfig)
  std::string name;       // hcConfig_t.name, for log lines
  int log_level = -1;     // HICOLL_DEBUG of cfg, for this communicator's log lines
  int rank = 0;
  int nranks = 0;
  std::shared_ptr<void> keepalive;  // e.g. the rendezvous server: outlives the bootstrap below
  std::unique_ptr<hicoll::Bootstrap> bootstrap;
  hicoll::Topology topo;
  // The cost model's figures (HICOLL_MODEL_FILE or the provider's defaults) and what the
  // creation exchange says of the hosts: the ranks sharing one host's cores (one kernel, as
  // emulated nodes do), its cores, the most ring hops that leave one node.
  hicoll::MachineFigures model;
  int host_ranks = 1, host_cores = 1, ring_cross = 1;
  // The largest inter-node chunk the model may raise HICOLL_NET_CHUNK_SIZE to under
  // HICOLL_ALGO=auto: HICOLL_CHUNK_SIZE, within rxm's eager limit in this process (0: none).
  size_t net_chunk_cap = 0;
  mutable std::shared_ptr<hicoll::PlanMemos> plan_memo;  // made by planCall on first use
  std::set<uint64_t> model_logged;  // shapes whose model choice HICOLL_DEBUG=INFO has shown
  // Remote ranks every call is agreed with (rail peers; ring neighbours on uneven nodes), and
  // the messages that carry the descriptors, one in and one out per peer: a descriptor and a
  // reason, or a descriptor and the payload of the call's first message to that peer
  // (hicoll::Agreement). Declared before the transports: a receive may be posted into
  // agree_in when a call fails, and the endpoint must close first.
  struct AgreeMsg {
    static constexpr size_t kBody = 16384;  // payloads up to this ride with the descriptor
    static constexpr size_t kReason = 96;   // a standalone message: the descriptor and a reason
    hicoll::CallDesc desc;
    char body[kBody];
  };
  std::vector<int> agree_peers;
  std::vector<AgreeMsg> agree_in, agree_out;
  std::vector<size_t> agree_got;  // bytes of each agree_in receive (written when it completes)
  std::unique_ptr<hicoll::ShmTransport> shm;  // ranks of this node (always present)
  // The libfabric endpoint opens at the first call, not at creation (ensureNetwork): an idle
  // communicator holds no endpoint (ofi_rxm's buffers are tens of MB) and no fabric
  // connections. Liveness is made at creation: it names a dead rank fast, also while the
  // endpoint opens. Both are null on one node; ofi is set under lifecycle_mu (a revoke from
  // another thread reads it).
  std::unique_ptr<hicoll::Transport> ofi;     // ranks of other nodes
  std::unique_ptr<hicoll::Liveness> liveness;  // watches ranks of other nodes
  hicoll::OfiOptions net_opt;                  // what ensureNetwork opens ofi with
  std::unique_ptr<hicoll::DeviceEngine> device;

  // Scratch and sort buffers live in this rank's shared-memory segment (readable by the
  // node's ranks, registered with libfabric).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  void* sort = nullptr;
  size_t sort_bytes = 0;

  std::mutex stats_mu;
  hcStats stats{};
  std::vector<hicoll::RedOp> premul_ops;  // handle - hcNumOps -> op; Sum kind when freed
  uint64_t seq = 0;    // phases run (a call runs one or more)
  // Calls that communicated or were rejected (CollArgs::call); read by a revoke from another
  // thread (the failure it reports names the call).
  std::atomic<uint64_t> calls{0};
  uint64_t shrinks = 0;  // hcCommShrink calls (names the survivors' bootstrap keys)
  std::atomic<bool> failed{false};
  // Marks it failed with why (the first cause wins; true when this one did) and reads the cause:
  // another thread may revoke the communicator while a call runs (hcCommRevoke).
  bool fail(const std::string& why);
  std::string failure() const;
  std::vector<char> heap_workspace;  // private to the host algorithms; see workspace()
  mutable std::mutex failure_mu;
  std::string failure_;
  ~hcComm();
  // Frees everything it holds (transports first, as the destructor would) and marks it dead.
  void release();

  int node() const { return topo.node_of[rank]; }
  // "rank 3 (node 'n1')", for messages.
  std::string who(int r) const;
  int localRank() const { return topo.local_of[rank]; }
  long timeoutMs() const { return cfg.num(hicoll::Knob::TimeoutMs); }
  // Opens the network on every rank, if it is not open and the communicator spans nodes:
  // collective over the bootstrap, the start of every call. With destroying (hcCommDestroy),
  // it opens nothing: it meets ranks that call a collective instead, and fails them.
  void ensureNetwork(bool destroying = false);
  // The transport that reaches peer: shm on the same node, ofi otherwise.
  hicoll::Transport& transportTo(int peer);
  // Throws hcRemoteError when a rank this one depends on is known to be gone: a local peer
  // died or aborted, a failure notice arrived, a watched rank's liveness connection closed.
  // Cheap enough for every idle pass of a wait (each source is rate-limited).
  void checkPeers();
  // After an error that is a symptom (a broken link): waits up to ms for a failure notice, or
  // a watched rank's failure with its cause on liveness, and throws it if one arrives.
  void explainSymptom(long ms);
  void countCall(hcColl_t c, hcPath_t path, const std::string& fallback_reason = "", double predicted_s = 0,
                 size_t chunk_bytes = 0, size_t net_window = 0);
  void countBytes(hcColl_t c, int peer, size_t bytes);
  void countNodeMemory(hcColl_t c, size_t bytes);  // of those, read from a peer's node memory
  // At least `bytes` of private memory, kept for later calls (grows, never shrinks); valid
  // until the next call of workspace().
  char* workspace(size_t bytes);
  // At least `bytes` of node memory (hcMemAlloc's kind) for the quantized calls' packed images,
  // kept for later calls (grows, never shrinks): local peers read it where it lies.
  char* quantBuffer(size_t bytes);
  // predicted_s > 0: the model's time of the whole quantized call (its pieces counted their own).
  void countQuantized(hcColl_t c, double predicted_s = 0);
  void* quant_buf = nullptr;      // node memory, or null: then quant_heap
  std::vector<char> quant_heap;
  size_t quant_bytes = 0;
  // The entry point of the call in progress on some thread (null: none). Calls on one
  // communicator come from one thread at a time (hicoll.h); the API takes this slot with one
  // compare-exchange per call and refuses a second thread instead of letting it in (api.cc).
  std::atomic<const char*> in_call{nullptr};
  // Held by a revoke and by the release of destroy/abort: a revoke from another thread (a
  // refused entry, hcCommRevoke, hcCommAbort) never runs on transports being freed, nor two at once.
  std::mutex lifecycle_mu;
};

namespace hicoll {
// Communicator creation from a bootstrap (every hcCommInit*, hcCommSplit, hcCommShrink).
// cfg: the configuration it runs with (the environment, a parent's, and a caller's hcConfig_t on
// top); config: the caller's (for its name; may be null); parent: for the name of a split.
std::unique_ptr<hcComm> createComm(std::unique_ptr<Bootstrap> bs, std::shared_ptr<void> keepalive, const Config& cfg,
                                   const hcConfig_t* config, const hcComm* parent = nullptr);
}  // namespace hicoll
