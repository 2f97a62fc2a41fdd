// The communicator: owned, typed parts, each handed to the floor that needs it (as the device
// engine gets its dev::Resources): who it is (Identity), how it plans (PlanContext), whether it
// can go on (Health), how it reaches peers (Links), its memory (Buffers), what it counts
// (Stats), and what the API layer keeps of it (ApiState). Code outside src/core takes a part,
// never a field of hcComm.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/coll.h"
#include "base/identity.h"
#include "bootstrap/bootstrap.h"
#include "core/buffers.h"
#include "core/device.h"
#include "core/health.h"
#include "core/links.h"
#include "core/stats.h"
#include "plan/plan.h"

namespace hicoll {
struct AgreeState;   // algorithms/agree.h: the agreement's messages, made at the first call
class P2p;           // algorithms/p2p.h: point-to-point messages, made at the first p2p call
struct LinkFigures;  // core/net_probe.h: a link's measured figures

// What the API layer keeps of a communicator: whether the handle is live, the one call in
// progress, the lock of its teardown, the reduction ops it made.
struct ApiState {
  static constexpr uint64_t kLive = 0x68636f6d6d4c4956ull, kDead = 0x68636f6d6d444541ull;
  uint64_t magic = kLive;  // kDead once destroyed (the API refuses the handle)
  // The entry point of the call in progress on some thread (null: none). Calls on one
  // communicator come from one thread at a time (hicoll.h); the API takes this slot with one
  // compare-exchange per call and refuses a second thread instead of letting it in (api.cc).
  std::atomic<const char*> in_call{nullptr};
  // Held by a revoke and by the release of destroy/abort: a revoke from another thread (a
  // refused entry, hcCommRevoke, hcCommAbort) never runs on transports being freed, nor two at once.
  std::mutex lifecycle_mu;
  std::vector<RedOp> premul_ops;    // handle - hcNumOps -> op; Sum kind when freed
  std::shared_ptr<void> keepalive;  // e.g. the rendezvous server: outlives the bootstrap
};
}  // namespace hicoll

struct hcComm {
  // Declaration order is construction order; teardown runs backwards (release() does the same
  // explicitly): the device engine and the network close before the memory they use.
  hicoll::ApiState api;
  hicoll::Identity id;
  hicoll::PlanContext plan;
  hicoll::Refiner refine;  // this rank's timed calls (HICOLL_MODEL_REFINE_CALLS, at creation)
  hicoll::Health health;
  hicoll::Stats stats{id};
  hicoll::Buffers buf;
  // Before links: a receive may be posted into its messages when a call fails, and the
  // endpoint must close first.
  std::shared_ptr<hicoll::AgreeState> agree;
  std::shared_ptr<hicoll::P2p> p2p;  // likewise: its envelope receives stay posted
  hicoll::Links links{id};
  std::unique_ptr<hicoll::DeviceEngine> device;

  // Opens the network on every rank, if it is not open and the communicator spans nodes:
  // collective over the bootstrap, the start of every call. With destroying (hcCommDestroy),
  // it opens nothing: it meets ranks that call a collective instead, and fails them.
  void ensureNetwork(bool destroying = false);
  // The model's link figure measured once the network is open (core/net_probe.h), when the
  // model has no file (HICOLL_ALGO=auto decides by it; every algo predicts with it); known: the
  // figures every rank's process measured before over the same nodes (key), taken instead.
  void measureLink(const std::string& key, const hicoll::LinkFigures* known);
  // Whether a call planned as p is timed for the model's refinement (plan/refine.h), and its
  // time; at the refinement's fixed counts, collective over the bootstrap (every rank times the
  // same calls). opened_network: the call opened the network (its time is not the call's).
  bool timesCall(const hicoll::CollPlan& p) const;
  void timedCall(const hicoll::CollArgs& a, const hicoll::CollPlan& p, double seconds, bool opened_network);
  // Frees everything it holds (transports first, as the destructor would) and marks it dead.
  void release();
};

namespace hicoll {
// Communicator creation from a bootstrap (every hcCommInit*, hcCommSplit, hcCommShrink).
// cfg: the configuration it runs with (the environment, a parent's, and a caller's hcConfig_t on
// top); config: the caller's (for its name; may be null); parent: for the name of a split.
std::unique_ptr<hcComm> createComm(std::unique_ptr<Bootstrap> bs, std::shared_ptr<void> keepalive, const Config& cfg,
                                   const hcConfig_t* config, const hcComm* parent = nullptr);
}  // namespace hicoll
