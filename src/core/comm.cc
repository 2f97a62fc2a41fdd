// Communicator creation: configuration, the ranks' identities, topology, transports.
#include "core/comm.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "base/machine_figures.h"
#include "bootstrap/liveness.h"
#include "core/net_probe.h"
#include "transport/ofi/ofi_transport.h"
#include "transport/shm/node_memory.h"
#include "transport/shm/shm_transport.h"
#include "transport/tags.h"

namespace hicoll {
namespace {

constexpr int kMaxKnobs = 48;

struct RankInfo {
  char host[128];
  char label[128];
  uint64_t knob_hash[kMaxKnobs];
  uint64_t kernel;  // hash of the boot id: ranks on one kernel share its cores
  int32_t pid;
  int32_t cores;
  uint64_t rxm_eager;  // the FI_OFI_RXM_EAGER_LIMIT this rank's libfabric will run with (0: no rxm)
  ShmProbe probe;      // its process's shared-memory probe (transport/shm/segment.h)
};

// Ranks that share a kernel share its cores; without a boot id, the host name says as much.
uint64_t bootIdHash(const std::string& host) {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::hash<std::string>()(id.empty() ? host : id);
}

int usableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// The model's host facts, alike on every rank (from the exchanged infos).
void hostFacts(hcComm& c, const std::vector<RankInfo>& all) {
  int most = 1, cores = 1 << 30;
  for (const RankInfo& i : all) {
    int same = 0;
    for (const RankInfo& j : all) same += j.kernel == i.kernel;
    most = std::max(most, same);
    cores = std::min(cores, std::max(1, static_cast<int>(i.cores)));
  }
  c.plan.host_ranks = most;
  c.plan.host_cores = cores;
  if (c.plan.oversubscribed()) Backoff::yieldFirst();
  const Topology& t = c.id.topo;
  std::vector<int> leaving(t.nnodes, 0);
  for (int r = 0; r < t.nranks; ++r)
    if (t.node_of[r] != t.node_of[(r + 1) % t.nranks]) ++leaving[t.node_of[r]];
  c.plan.ring_cross = std::max(1, *std::max_element(leaving.begin(), leaving.end()));
}

void copyString(char* dst, size_t cap, const std::string& s) {
  std::snprintf(dst, cap, "%s", s.c_str());
}

// Ranks with one node label are one node only if they can map each other's memory (two
// containers, or PID namespaces, may share a host name and no memory): each rank tries its
// label's other ranks' probes, the results are exchanged, and a label whose ranks fall apart
// becomes one node per group that can (the first keeps the label, the others get "~1", "~2").
// Those run over the network, as other nodes do. Without any two processes under one label,
// nothing is tried (threads of one process share memory).
void splitUnsharedNodes(Bootstrap& bs, const std::vector<RankInfo>& all, std::vector<std::string>& labels) {
  const int W = static_cast<int>(all.size()), me = bs.rank();
  std::map<std::string, std::vector<int>> groups;
  for (int r = 0; r < W; ++r) groups[labels[r]].push_back(r);
  bool any = false;
  for (const auto& [label, ranks] : groups)
    for (int r : ranks)  // another process: another token (pids repeat across PID namespaces)
      any = any || (std::memcmp(all[r].probe.token, all[ranks[0]].probe.token, sizeof all[r].probe.token) != 0 &&
                    ranks.size() <= 256);
  if (!any) return;
  struct Result {
    uint8_t mask[32];  // bit i: this rank mapped the probe of its label's i-th rank
    char why[96];      // the first failure, for the message
  };
  Result mine{};
  const std::vector<int>& group = groups[labels[me]];
  for (size_t i = 0; i < group.size() && group.size() <= 256; ++i) {
    const std::string why = group[i] == me ? "" : shmProbeCheck(all[group[i]].probe);
    if (why.empty()) mine.mask[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    else if (!mine.why[0]) copyString(mine.why, sizeof mine.why, fmt::format("rank {}: {}", group[i], why));
  }
  std::vector<Result> res(static_cast<size_t>(W));
  bs.allgather(&mine, res.data(), sizeof mine);
  auto whyOf = [&](int r) { return std::string(res[r].why, strnlen(res[r].why, sizeof res[r].why)); };
  for (const auto& [label, ranks] : groups) {
    if (ranks.size() > 256) continue;  // more than a node may hold: the shm transport says so
    auto maps = [&](size_t a, size_t b) { return (res[ranks[a]].mask[b / 8] >> (b % 8) & 1) != 0; };
    std::vector<std::vector<size_t>> parts;  // members (indexes into ranks) that all map each other
    for (size_t i = 0; i < ranks.size(); ++i) {
      auto fits = [&](const std::vector<size_t>& p) {
        return std::all_of(p.begin(), p.end(), [&](size_t j) { return maps(i, j) && maps(j, i); });
      };
      auto p = std::find_if(parts.begin(), parts.end(), fits);
      if (p == parts.end()) parts.push_back({i});
      else p->push_back(i);
    }
    if (parts.size() < 2) continue;
    std::vector<std::string> names;
    for (size_t k = 0; k < parts.size(); ++k) {
      std::vector<int> members;
      for (size_t j : parts[k]) members.push_back(ranks[j]);
      const std::string name = k == 0 ? label : fmt::format("{}~{}", label, k);
      names.push_back(fmt::format("'{}' (ranks {})", name, fmt::join(members, ",")));
      for (int r : members) labels[r] = name;
    }
    if (std::find(ranks.begin(), ranks.end(), me) != ranks.end())
      HC_WARN("the ranks of node '{}' cannot all map each other's memory ({}): they run as nodes {}, over the network",
              label, whyOf(ranks[parts[1][0]]).empty() ? whyOf(ranks[0]) : whyOf(ranks[parts[1][0]]),
              fmt::join(names, ", "));
  }
}

// Every rank compares every rank's hashes, so all of them find the same first differing knob;
// a second exchange of that knob's values lets every rank name them.
void checkConsistency(Bootstrap& bs, const Config& cfg, const std::vector<RankInfo>& all) {
  const auto& table = knobTable();
  for (size_t k = 0; k < table.size(); ++k) {
    bool same = true;
    for (const RankInfo& i : all) same = same && i.knob_hash[k] == all[0].knob_hash[k];
    if (same) continue;
    char mine[96] = {};
    copyString(mine, sizeof mine, cfg.str(table[k].id));
    std::vector<char> values(all.size() * sizeof mine);
    bs.allgather(mine, values.data(), sizeof mine);
    std::string list;
    int shown = 0;
    for (size_t r = 0; r < all.size() && shown < 8; ++r) {
      if (r > 0 && all[r].knob_hash[k] == all[r - 1].knob_hash[k]) continue;
      list += fmt::format("{}rank {} has '{}'", shown ? ", " : "", r, &values[r * sizeof mine]);
      ++shown;
    }
    HC_THROW(hcInvalidUsage, "{} must be the same on every rank{}: {}", table[k].name,
             table[k].id == Knob::ModelFile ? " (the file's contents too)" : "", list);
  }
}

// rxm connects two processes only when their eager limits agree (libfabric 1.17 waits forever
// otherwise): a difference fails creation on every rank, naming the variable and the ranks.
void checkEagerLimits(const std::vector<RankInfo>& all) {
  std::string list;
  bool same = true;
  for (size_t r = 0; r < all.size(); ++r) {
    same = same && all[r].rxm_eager == all[0].rxm_eager;
    if (r == 0 || all[r].rxm_eager != all[r - 1].rxm_eager)
      list += fmt::format("{}rank {} has {}", r ? ", " : "", r, all[r].rxm_eager);
  }
  HC_CHECK(same, hcInvalidUsage,
           "FI_OFI_RXM_EAGER_LIMIT (set in the environment, or by hicoll from HICOLL_NET_CHUNK_SIZE / "
           "HICOLL_CHUNK_SIZE when the process first opens libfabric) must be the same on every rank: {}",
           list);
}

// The ranks a rank watches for liveness: its rail peers on the next and the previous node, or
// on uneven nodes its ring neighbours on other nodes. Symmetric; at most two per rank.
std::vector<int> livenessPeers(const Topology& t, int rank) {
  if (!t.uniform) return t.agreementPeers(rank);
  std::vector<int> peers;
  const int n = t.node_of[rank], l = t.local_of[rank], N = t.nnodes;
  for (int m : {(n + 1) % N, (n + N - 1) % N})
    if (m != n && std::find(peers.begin(), peers.end(), t.rankAt(m, l)) == peers.end()) peers.push_back(t.rankAt(m, l));
  return peers;
}

}  // namespace

std::unique_ptr<hcComm> createComm(std::unique_ptr<Bootstrap> bs, std::shared_ptr<void> keepalive, const Config& cfg,
                                   const hcConfig_t* config, const hcComm* parent) {
  static_assert(static_cast<int>(Knob::Count) <= kMaxKnobs, "RankInfo::knob_hash is too small");
  auto c = std::make_unique<hcComm>();
  Identity& id = c->id;
  PlanContext& pc = c->plan;
  pc.cfg = cfg;
  if (config && config->size >= offsetof(hcConfig_t, algo) && config->name) id.name = config->name;
  else if (parent) id.name = parent->id.name;
  id.log_level = static_cast<int>(logLevelOf(cfg.str(Knob::Debug)));
  id.rank = bs->rank();
  id.nranks = bs->size();
  c->health.timeout_ms = pc.timeoutMs();
  c->api.keepalive = std::move(keepalive);
  ScopedLogRank log_rank(id.rank, id.log_level, id.name.c_str());

  RankInfo mine{};
  char host[128] = {};
  gethostname(host, sizeof host - 1);
  copyString(mine.host, sizeof mine.host, host);
  std::string label = pc.cfg.str(Knob::TopoNode).empty() ? host : pc.cfg.str(Knob::TopoNode);
  HC_CHECK(label.size() < sizeof mine.label, hcInvalidArgument, "HICOLL_TOPO_NODE='{}' is longer than {} characters",
           label, sizeof mine.label - 1);
  copyString(mine.label, sizeof mine.label, label);
  auto hashes = pc.cfg.consistencyHashes();
  std::string model_error;
  const std::string model_path = pc.cfg.str(Knob::ModelFile);
  if (model_path.empty()) {
    pc.model = defaultFigures(pc.cfg.str(Knob::OfiProvider));
  } else {
    // A file this rank cannot use must not throw before the exchange (the others would wait
    // out the timeout): its hash then differs from theirs, which names the knob everywhere.
    std::string text;
    try {
      pc.model = loadFigures(model_path, &text);
    } catch (const Error& e) {
      model_error = e.what();
      text = "unusable: " + model_error;
    }
    // The contents must agree, not the path (each node may keep its own copy).
    hashes[static_cast<size_t>(Knob::ModelFile)] = std::hash<std::string>()(text);
  }
  std::copy(hashes.begin(), hashes.end(), mine.knob_hash);
  mine.pid = getpid();
  mine.kernel = bootIdHash(host);
  mine.cores = usableCores();
  // Under HICOLL_ALGO=auto with the default net chunk the model may raise it up to
  // HICOLL_CHUNK_SIZE (plan/cost_model.h, modelChunking): such chunks go eager too.
  OfiOptions oo;
  oo.provider = pc.cfg.str(Knob::OfiProvider);
  const bool model_chunk = pc.cfg.algoAuto() && pc.cfg.isDefault(Knob::NetChunkBytes);
  const size_t chunk_cap = pc.cfg.netChunkCap();
  mine.rxm_eager = ofiEagerLimit(oo);
  mine.probe = shmProbe();
  std::vector<RankInfo> all(id.nranks);
  bs->allgather(&mine, all.data(), sizeof mine);
  checkConsistency(*bs, pc.cfg, all);
  HC_CHECK(model_error.empty(), hcInvalidArgument, "{}", model_error);  // the same error on every rank

  std::vector<std::string> labels, hosts;
  for (const RankInfo& i : all) {
    labels.emplace_back(i.label);
    hosts.emplace_back(i.host);
  }
  splitUnsharedNodes(*bs, all, labels);
  id.topo = Topology::build(labels, hosts);
  if (id.topo.nnodes > 1) checkEagerLimits(all);
  hostFacts(*c, all);
  Links& links = c->links;
  links.bootstrap = std::move(bs);

  Buffers& buf = c->buf;
  buf.scratch_bytes = pc.scratchBytes();
  buf.sort_bytes = pc.sortBytes();
  ShmOptions so;
  so.scratch_bytes = buf.scratch_bytes;
  so.sort_bytes = buf.sort_bytes;
  so.cma = pc.cfg.str(Knob::ShmCma);
  so.timeout_ms = pc.timeoutMs();
  so.peer_mem_bytes = static_cast<size_t>(pc.cfg.num(Knob::MemCacheBytes));
  Links* lk = &links;
  const Identity* who = &id;
  // The call this rank is in, or between calls the next one: a rank that fails (a revoke) after
  // finishing call n owes its peers nothing in n, which they may still be finishing.
  const ApiState* api = &c->api;
  const CallClock call_now = [lk, api] {
    return lk->calls.load(std::memory_order_relaxed) + (api->in_call.load(std::memory_order_acquire) ? 0 : 1);
  };
  so.call_now = call_now;
  links.shm = std::make_unique<ShmTransport>(*links.bootstrap, id.topo.ranks_of[id.node()], so);
  buf.scratch = links.shm->scratch(links.shm->localIndex());
  buf.sort = links.shm->sort(links.shm->localIndex());

  if (id.topo.nnodes > 1) {
    oo.iface = pc.cfg.str(Knob::OfiIface);
    if (oo.iface.empty() && id.topo.single_host) oo.iface = "lo";  // simulated nodes: stay on loopback
    oo.timeout_ms = pc.timeoutMs();
    oo.share = pc.cfg.flag(Knob::OfiSharedEndpoint);
    oo.call_now = call_now;
    oo.who = [who](int r) { return who->who(r); };  // peers by rank and node, not fabric address
    oo.while_blocked = [lk] {                       // no ofi calls here: the transport holds its lock
      lk->shm->checkPeers();
      if (lk->liveness) lk->liveness->check();
    };
    links.net_opt = oo;
    // Chunks beyond the eager limit would go by rxm's slower protocols (the limit is the same
    // on every rank: checkEagerLimits).
    if (model_chunk) pc.net_chunk_cap = mine.rxm_eager ? std::min<size_t>(chunk_cap, mine.rxm_eager) : chunk_cap;
    // Liveness now (a connection or two): it is what tells a dead rank on another node fast,
    // also while the network opens at the first call.
    links.liveness = std::make_unique<Liveness>(
        *links.bootstrap, livenessPeers(id.topo, id.rank), interfaceIpv4(oo.iface), pc.timeoutMs(),
        [who](int r) { return who->who(r); }, call_now);
  }
  // Without a model file, across uniform nodes: the calls the model predicts refine its figures.
  if (model_path.empty() && id.topo.nnodes > 1 && id.topo.uniform)
    c->refine = Refiner(pc.cfg.num(Knob::ModelRefineCalls));
  c->stats.start();
  c->stats.setModel(c->plan.model.net_Bps, c->plan.model.source);
  HC_INFO("communicator of {} ranks on {} node(s){}; this rank is node {} ({}) local {}", id.nranks, id.topo.nnodes,
          id.topo.uniform ? "" : " (uneven)", id.node(), id.topo.labels[id.node()], id.localRank());
  return c;
}

}  // namespace hicoll

void hcComm::release() {
  api.magic = hicoll::ApiState::kDead;
  device.reset();
  links.close();
  agree.reset();
  p2p.reset();
  buf.release();
  std::vector<hicoll::RedOp>().swap(api.premul_ops);
  api.keepalive.reset();
  plan.cfg = hicoll::Config();
  id.topo = hicoll::Topology();
}

void hcComm::ensureNetwork(bool destroying) {
  if (id.topo.nnodes < 2 || links.ofi) return;
  // Whether every rank is here to open it, or some to destroy: a rank that destroys while the
  // others call a collective makes that an error on them, as a post on the board does on a node.
  struct Intent {
    uint32_t magic;
    uint32_t destroying;
    uint64_t call;
    hicoll::LinkFigures known;  // this link as this process measured it before ({0, 0}: not)
  };
  constexpr uint32_t kMagic = 0x68636e65;  // "hcne"
  const std::string key = hicoll::linkKey(id.topo, links.net_opt.provider, links.net_opt.iface);
  Intent mine{kMagic, destroying ? 1u : 0u, links.calls.load(), hicoll::recallLink(key)};
  std::vector<Intent> all(static_cast<size_t>(id.nranks));
  links.bootstrap->allgather(&mine, all.data(), sizeof mine, links.net_opt.while_blocked);
  for (int r = 0; r < id.nranks; ++r) {
    const Intent& i = all[static_cast<size_t>(r)];
    HC_CHECK(i.magic == kMagic, hcRemoteError,
             "{} is in another bootstrap exchange (hcCommSplit or hcCommShrink?) "
             "while this rank starts its first call on the communicator",
             id.who(r));
    if (i.destroying == mine.destroying) continue;
    if (destroying) {
      HC_WARN("hcCommDestroy: {} called a collective (its call {}) while rank {} destroys the communicator", id.who(r),
              i.call, id.rank);
      return;
    }
    HC_THROW(hcRemoteError, "{} destroyed its communicator while rank {} called its call {}", id.who(r), id.rank,
             mine.call);
  }
  if (destroying) return;  // nobody opened it: nothing in flight to wait for
  auto net = hicoll::makeOfiTransport(*links.bootstrap, links.net_opt);
  net->registerRegion(buf.scratch, buf.scratch_bytes);
  net->registerRegion(buf.sort, buf.sort_bytes);
  {
    std::lock_guard<std::mutex> lock(api.lifecycle_mu);
    links.ofi = std::move(net);
  }
  // Where every rank's process measured this link before, all take the lowest rank's figures.
  bool known = true;
  for (const Intent& i : all) known &= i.known.Bps > 0;
  measureLink(key, known ? &all[0].known : nullptr);
}

void hcComm::measureLink(const std::string& key, const hicoll::LinkFigures* known) {
  // Every rank decides alike: the knobs agree, and so do the topology, the provider and known.
  const size_t bytes =
      std::min({static_cast<size_t>(plan.cfg.num(hicoll::Knob::NetProbeBytes)), buf.scratch_bytes, buf.sort_bytes});
  if (!plan.cfg.str(hicoll::Knob::ModelFile).empty() || bytes == 0 || !id.topo.uniform ||
      links.ofi->tagBits() < hicoll::tags::kTagBits)
    return;
  hicoll::LinkProbe p;
  p.bytes = bytes;
  p.max_bytes = std::min(buf.scratch_bytes, buf.sort_bytes);
  p.chunk = static_cast<size_t>(plan.cfg.num(hicoll::Knob::NetChunkBytes));
  p.send = buf.scratch;
  p.recv = buf.sort;
  p.timeout_ms = health.timeout_ms;
  p.check_peers = [this] { links.checkPeers(); };
  p.while_blocked = links.net_opt.while_blocked;
  const hicoll::LinkFigures f = known ? *known : hicoll::probeLink(id, *links.ofi, *links.bootstrap, p);
  const double bps = f.Bps;
  if (bps <= 0) return;
  if (!known) hicoll::rememberLink(key, f);
  plan.unmeasured = plan.model;  // what decides a reduction's sums under HICOLL_REPRODUCIBLE
  plan.model.net_Bps = bps;
  if (f.alpha_s > 0) plan.model.net_alpha_s = f.alpha_s;
  plan.model.source +=
      fmt::format("; link {:.0f} MB/s each way and {:.0f} us a message, measured at the first call{}", bps / 1e6,
                  plan.model.net_alpha_s * 1e6, known ? " of an earlier communicator over these nodes" : "");
  plan.refined = refine.bands(plan.model);  // each band's factors on the measured link
  plan.memo = {};                           // no plan made with the guess survives
  stats.setModel(bps, plan.model.source);
  HC_INFO("cost model: the link measured {:.0f} MB/s each way per node ({} bytes per rank)", bps / 1e6, bytes);
}

bool hcComm::timesCall(const hicoll::CollPlan& p) const {
  return p.modelled && refine.active();
}

void hcComm::timedCall(const hicoll::CollArgs& a, const hicoll::CollPlan& p, double seconds, bool opened_network) {
  if (!refine.add(hicoll::observationOf(id, plan, a, p, seconds), opened_network)) return;
  // Every rank counted the same calls: all of them are here, at the end of the same call.
  const hicoll::Corrections mine = refine.local(plan.model);
  std::vector<hicoll::Corrections> all(static_cast<size_t>(id.nranks));
  links.bootstrap->allgather(&mine, all.data(), sizeof mine, links.net_opt.while_blocked);
  const hicoll::Corrections agreed = hicoll::combineCorrections(all);
  plan.refined = refine.apply(plan.model, agreed);
  // The refinement replaces the last one in the source (it is cumulative).
  std::string& src = plan.model.source;
  const size_t at = src.find("; refined from ");
  src = (at == std::string::npos ? src : src.substr(0, at)) + "; " + refine.describe();
  plan.memo = {};  // no plan made with the old figures survives
  stats.setModel(plan.model.net_Bps, src);
  HC_INFO("cost model: {}: {}", refine.describe(), refine.factors());
}
