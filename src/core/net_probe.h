// The cost model's link figure measured at a communicator's first call across nodes, for a
// communicator whose model has no file (HICOLL_MODEL_FILE unset): the built-in figure is a
// guess (10 Gbit/s for TCP), and HICOLL_ALGO=auto's decisions and every prediction in hcStats
// made on a guess are off by the ratio of the guess to the link.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "base/identity.h"
#include "bootstrap/bootstrap.h"
#include "transport/transport.h"

namespace hicoll {

struct LinkProbe {
  size_t bytes = 0;      // per rank, the first round
  size_t max_bytes = 0;  // per rank, what send and recv hold
  size_t chunk = 0;      // per message
  void* send = nullptr;
  void* recv = nullptr;  // bytes each, registered with the transport
  long timeout_ms = 0;
  std::function<void()> check_peers, while_blocked;
};

// Every rank sends p.bytes to its rail peer on the next node while it receives as much from
// the previous one, after a warm-up message (connections open lazily); a node's link then
// carried its ranks' bytes each way in its span (its first rank's start to its last one's end;
// the nodes' mean, which cancels their different starts). A round shorter than
// kProbeRoundSeconds mostly measures TCP's ramp and the scheduler, so the size grows (within
// p.max_bytes, at most kProbeGrowth times) until a round lasts that long, then two rounds
// at that size give the figure. After every round the ranks exchange their times over the
// bootstrap, so every rank takes the same steps and returns the same figure (its decisions must
// be the same everywhere): a node's bytes per second each way. Collective over the
// communicator (uniform nodes, a transport with tags::kTagBits tag bits or more); throws on a peer's
// failure or the timeout.
constexpr double kProbeRoundSeconds = 0.01;
constexpr size_t kProbeGrowth = 16;
// Before the rounds of bytes, kLatencyRounds exchanges of one small message each way give the
// message latency (the model's net_alpha_s: a message's time one way, its CPU included): every
// rank's first quartile, then the ranks' median. Where ranks outnumber cores (emulated nodes) half
// of the exchanges or more wait for a peer to get a core: a median there measured the scheduler
// (perf/results/2026-12-05-model-ring.md), where the figure that predicts the calls is the
// calibrated one, taken while the other ranks sleep.
constexpr int kLatencyRounds = 16;
struct LinkFigures {
  double Bps = 0;      // each way per node
  double alpha_s = 0;  // one small message, one way
};
LinkFigures probeLink(const Identity& id, Transport& net, Bootstrap& bs, const LinkProbe& p);

// The links this process measured, by what they connect (linkKey: the provider, the interface,
// and each node's label and rank count): a later communicator over the same nodes takes the
// figures instead of probing again, which costs its first call tens of ms and touches up to
// kProbeGrowth probe sizes of its scratch and sort buffers. {0, 0}: not measured here.
std::string linkKey(const Topology& t, const std::string& provider, const std::string& iface);
LinkFigures recallLink(const std::string& key);
void rememberLink(const std::string& key, const LinkFigures& f);

// A round's figures from every rank's start and end (ends[2r], ends[2r+1]: seconds on its
// host's clock). A node's span runs from its first rank's start to its last rank's end (its
// ranks share its clock; its rails need not start together). The nodes are a ring of
// exchanges: a node's span is off by the difference between its start and its sender's, which
// cancels over the ring, so the mean span is the links' time (a rank's own time is not: one
// whose sender started first finds part of its data arrived).
std::vector<double> nodeSpans(const Topology& t, const std::vector<double>& ends);
// Bytes per second each way per node, of `bytes` per rank (uniform nodes).
double roundFigure(const Topology& t, size_t bytes, const std::vector<double>& ends);

}  // namespace hicoll
