// Host-buffer collectives: plan the call (plan/plan.h), agree it with the peers, run the path
// it names, count it.
#include <algorithm>
#include <chrono>
#include <cstdint>

#include "algorithms/host.h"
#include "algorithms/node_small.h"
#include "algorithms/run.h"
#include "base/error.h"
#include "base/log.h"
#include "plan/plan.h"

namespace hicoll {
namespace {

// Whether the call's first message to every agreement peer can carry the descriptor: the
// hierarchical paths on uniform nodes exchange with every rail peer at once, and the block
// (which bounds that message) is small.
bool piggybacks(const hcComm& c, const CollArgs& a, const CollPlan& p) {
  if (p.path != hcPathHierarchical || !c.id.topo.uniform || c.id.topo.nnodes < 2) return false;
  switch (a.coll) {
    case hcCollAllGather:
    case hcCollReduceScatter:
    case hcCollAllReduce: return Agreement::canPiggyback(p.block_bytes);
    case hcCollBarrier: return true;
    default: return false;
  }
}

void runPath(const CollArgs& a, const CollPlan& plan, Run& r) {
  const bool hier = plan.path == hcPathHierarchical;
  switch (a.coll) {
    case hcCollAllGather:
      hier ? hierAllGather(r, a.send, a.recv, a.count) : ringAllGather(r, a.send, a.recv, a.count);
      break;
    case hcCollReduceScatter:
      hier ? hierReduceScatter(r, a.send, a.recv, a.count) : ringReduceScatter(r, a.send, a.recv, a.count);
      break;
    case hcCollAllReduce: allReduce(r, a.send, a.recv, a.count, hier); break;  // split: r.plan
    case hcCollBroadcast:
      hier ? hierBroadcast(r, a.send, a.recv, a.count, a.root) : chainBroadcast(r, a.send, a.recv, a.count, a.root);
      break;
    case hcCollAllToAll: allToAll(r); break;
    case hcCollBarrier: {
      // A barrier is a one-byte AllGather: it crosses every node and notices dead peers.
      std::vector<uint8_t> all(r.id.nranks);
      uint8_t one = 1;
      hier ? hierAllGather(r, &one, all.data(), 1) : ringAllGather(r, &one, all.data(), 1);
      break;
    }
    default: HC_THROW(hcInvalidArgument, "unknown collective {}", static_cast<int>(a.coll));
  }
}

}  // namespace

Capabilities hostCapabilities(const hcComm& c) {
  Capabilities caps;
  caps.single_copy_reads = c.links.shm->directRead();
  return caps;
}

namespace {

// HICOLL_DEBUG=INFO: what the model chose and why, once per shape and choice (a training step
// repeats its shapes; a sweep logs each size once; a refinement that changes a choice shows).
void logModelChoice(hcComm& c, const CollArgs& a, const CollPlan& p) {
  if (logLevel() < LogLevel::kInfo) return;
  const uint64_t choice = (p.path == hcPathHierarchical ? 1u : 0u) | (p.allreduce_small ? 2u : 0u);
  const uint64_t key = (a.count << 12) ^ (static_cast<uint64_t>(a.dtype) << 4) ^ a.coll ^ (choice << 60);
  if (c.plan.model_logged.size() >= 256 || !c.plan.model_logged.insert(key).second) return;
  HC_INFO("cost model: {} takes the {} path{}, chunk {} x {} in flight, predicted {} ({}-bound; figures: {})",
          describe(a), p.path == hcPathHierarchical ? "hierarchical" : "ring",
          a.coll == hcCollAllReduce ? (p.allreduce_small ? " (latency split)" : " (RS + AG)") : "", p.chunk_bytes,
          p.net_window, p.predicted.terms(), p.predicted.bound(), c.plan.model.source);
}

// The agreement's messages: made, and registered with the network, at the first call that
// agrees across nodes.
AgreeState* agreeState(hcComm& c) {
  if (!c.links.ofi) return nullptr;
  if (!c.agree) c.agree = std::make_shared<AgreeState>(c.id.topo.agreementPeers(c.id.rank), *c.links.ofi);
  return c.agree.get();
}

// The network opens at a communicator's first call (hcComm::ensureNetwork); a failure there
// leaves the communicator unusable, as one midway through a call does.
void openNetwork(hcComm& c, const CollArgs& a) {
  if (c.links.ofi || c.id.topo.nnodes < 2) return;
  try {
    c.ensureNetwork();
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: opening the network: {}", describe(a), e.what()), Error::kFatal);
  }
}

}  // namespace

void runHostCollective(hcComm& c, const CollArgs& a) {
  if (runNodeSmall(c, a)) return;
  const bool opens_network = !c.links.ofi && c.id.topo.nnodes > 1;
  openNetwork(c, a);
  if (a.quant.block && !a.quant.packed) return runQuantized(c, a);
  const CollPlan p = planCall(c.id, c.plan, a, hostCapabilities(c));
  if (p.fallback())
    HC_INFO("fallback: {} takes the flat {}: {}", describe(a), a.coll == hcCollAllToAll ? "exchange" : "ring",
            p.reason);
  HC_TRACE("{}: path {} ({})", describe(a), p.path == hcPathHierarchical ? "hierarchical" : "ring", ruleName(p.rule));
  if (p.modelled && c.plan.cfg.algoAuto()) logModelChoice(c, a, p);
  // The model refines its figures from the times of the calls it predicts (plan/refine.h).
  const bool timed = c.timesCall(p);
  const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  try {
    Agreement ag(c.id, c.links.ofi.get(), agreeState(c), CallDesc::of(a), "", piggybacks(c, a, p));
    Run r(c, a, &p, &ag);
    try {
      runPath(a, p, r);
      ag.finish(r);
    } catch (const Error& e) {
      // A disagreement explains a size mismatch or a timeout better; a peer's own report of its
      // failure (its notice, its abort) is the cause already.
      if (e.code() != hcRemoteError || e.symptom()) ag.explain(200);
      if (e.symptom()) c.links.explainSymptom(250);  // so does the failure notice of the peer behind it
      throw;
    }
    if (timed)
      c.timedCall(a, p, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), opens_network);
  } catch (const Error& e) {
    // Midway through a call: the communicator cannot go on, whatever the code.
    throw Error(e.code(), fmt::format("{}: {}", describe(a), e.what()), Error::kFatal);
  }
}

void rejectCall(hcComm& c, const CollArgs& a, const std::string& why) {
  const CallDesc mine = CallDesc::of(a, CallDesc::kInvalid);
  bool others_valid = false;
  try {
    c.links.shm->setReason(why);
    c.ensureNetwork();
    Agreement ag(c.id, c.links.ofi.get(), agreeState(c), mine, why);
    Run r(c, a, nullptr, &ag);
    r.beginPhase();
    r.post(nullptr, a.coll, CallDesc::kInvalid);
    for (int l = 0; l < c.links.shm->localSize(); ++l)
      if (l != c.links.shm->localIndex()) others_valid |= r.waitPosted(l, /*collect=*/true);
    ag.finish(r, /*collect=*/true);
    others_valid |= ag.anyValid();
  } catch (const Error& e) {
    // A peer failed the call (it had valid arguments) or died: the communicator is gone.
    throw Error(hcInvalidArgument, fmt::format("{} (and the call failed on other ranks too: {})", why, e.what()),
                Error::kFatal);
  }
  // Every rank rejected its arguments: nothing moved, the communicator goes on.
  if (!others_valid) throw Error(hcInvalidArgument, why);
  throw Error(hcInvalidArgument, fmt::format("{} (its peers were told: their call fails too)", why), Error::kFatal);
}

}  // namespace hicoll
