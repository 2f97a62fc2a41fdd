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
#include "bootstrap/liveness.h"
#include "base/machine_figures.h"
#include "transport/ofi/ofi_transport.h"
#include "transport/shm/node_memory.h"
#include "transport/shm/shm_transport.h"

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
  c.host_ranks = most;
  c.host_cores = cores;
  const Topology& t = c.topo;
  std::vector<int> leaving(t.nnodes, 0);
  for (int r = 0; r < t.nranks; ++r)
    if (t.node_of[r] != t.node_of[(r + 1) % t.nranks]) ++leaving[t.node_of[r]];
  c.ring_cross = std::max(1, *std::max_element(leaving.begin(), leaving.end()));
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

// The remote ranks each call is agreed with. With the node board agreeing every node, the rails
// (the same local index on every other node) connect all nodes; on uneven nodes, the ring
// neighbours do. Symmetric: each rank receives from every rank it sends to.
std::vector<int> agreementPeers(const Topology& t, int rank) {
  std::vector<int> peers;
  if (t.nnodes < 2) return peers;
  const int n = t.node_of[rank];
  if (t.uniform) {
    for (int m = 0; m < t.nnodes; ++m)
      if (m != n) peers.push_back(t.rankAt(m, t.local_of[rank]));
    return peers;
  }
  const int W = t.nranks;
  for (int p : {(rank + W - 1) % W, (rank + 1) % W})
    if (t.node_of[p] != n && std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);
  return peers;
}

// The ranks a rank watches for liveness: its rail peers on the next and the previous node, or
// on uneven nodes its ring neighbours on other nodes. Symmetric; at most two per rank.
std::vector<int> livenessPeers(const Topology& t, int rank) {
  if (!t.uniform) return agreementPeers(t, rank);
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
  c->cfg = cfg;
  if (config && config->size >= offsetof(hcConfig_t, algo) && config->name) c->name = config->name;
  else if (parent) c->name = parent->name;
  c->log_level = static_cast<int>(logLevelOf(cfg.str(Knob::Debug)));
  c->rank = bs->rank();
  c->nranks = bs->size();
  c->keepalive = std::move(keepalive);
  ScopedLogRank log_rank(c->rank, c->log_level, c->name.c_str());

  RankInfo mine{};
  char host[128] = {};
  gethostname(host, sizeof host - 1);
  copyString(mine.host, sizeof mine.host, host);
  std::string label = c->cfg.str(Knob::TopoNode).empty() ? host : c->cfg.str(Knob::TopoNode);
  HC_CHECK(label.size() < sizeof mine.label, hcInvalidArgument, "HICOLL_TOPO_NODE='{}' is longer than {} characters",
           label, sizeof mine.label - 1);
  copyString(mine.label, sizeof mine.label, label);
  auto hashes = c->cfg.consistencyHashes();
  std::string model_error;
  const std::string model_path = c->cfg.str(Knob::ModelFile);
  if (model_path.empty()) {
    c->model = defaultFigures(c->cfg.str(Knob::OfiProvider));
  } else {
    // A file this rank cannot use must not throw before the exchange (the others would wait
    // out the timeout): its hash then differs from theirs, which names the knob everywhere.
    std::string text;
    try {
      c->model = loadFigures(model_path, &text);
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
  oo.provider = c->cfg.str(Knob::OfiProvider);
  const size_t net_chunk = static_cast<size_t>(c->cfg.num(Knob::NetChunkBytes));
  const bool model_chunk = c->cfg.algoAuto() && c->cfg.isDefault(Knob::NetChunkBytes);
  const size_t chunk_cap = model_chunk ? std::max(net_chunk, static_cast<size_t>(c->cfg.num(Knob::ChunkBytes))) : net_chunk;
  if (c->cfg.str(Knob::OfiRxmEager) == "1") oo.rxm_eager_bytes = chunk_cap;
  mine.rxm_eager = ofiEagerLimit(oo);
  mine.probe = shmProbe();
  std::vector<RankInfo> all(c->nranks);
  bs->allgather(&mine, all.data(), sizeof mine);
  checkConsistency(*bs, c->cfg, all);
  HC_CHECK(model_error.empty(), hcInvalidArgument, "{}", model_error);  // the same error on every rank

  std::vector<std::string> labels, hosts;
  for (const RankInfo& i : all) {
    labels.emplace_back(i.label);
    hosts.emplace_back(i.host);
  }
  splitUnsharedNodes(*bs, all, labels);
  c->topo = Topology::build(labels, hosts);
  if (c->topo.nnodes > 1) checkEagerLimits(all);
  hostFacts(*c, all);
  c->bootstrap = std::move(bs);
  c->agree_peers = agreementPeers(c->topo, c->rank);
  c->agree_in.resize(c->agree_peers.size());
  c->agree_out.resize(c->agree_peers.size());
  c->agree_got.resize(c->agree_peers.size());

  c->scratch_bytes = static_cast<size_t>(c->cfg.num(Knob::ScratchBytes));
  c->sort_bytes = static_cast<size_t>(c->cfg.num(Knob::SortBytes));
  ShmOptions so;
  so.scratch_bytes = c->scratch_bytes;
  so.sort_bytes = c->sort_bytes;
  so.cma = c->cfg.str(Knob::ShmCma);
  so.timeout_ms = c->timeoutMs();
  so.peer_mem_bytes = static_cast<size_t>(c->cfg.num(Knob::MemCacheBytes));
  hcComm* self = c.get();
  const CallClock call_now = [self] { return self->calls.load(std::memory_order_relaxed); };
  so.call_now = call_now;
  c->shm = std::make_unique<ShmTransport>(*c->bootstrap, c->topo.ranks_of[c->node()], so);
  c->scratch = c->shm->scratch(c->shm->localIndex());
  c->sort = c->shm->sort(c->shm->localIndex());

  if (c->topo.nnodes > 1) {
    oo.iface = c->cfg.str(Knob::OfiIface);
    if (oo.iface.empty() && c->topo.single_host) oo.iface = "lo";  // simulated nodes: stay on loopback
    oo.timeout_ms = c->timeoutMs();
    oo.call_now = call_now;
    oo.who = [self](int r) { return self->who(r); };  // peers by rank and node, not fabric address
    oo.while_blocked = [self] {  // no ofi calls here: the transport holds its lock
      self->shm->checkPeers();
      if (self->liveness) self->liveness->check();
    };
    c->net_opt = oo;
    // Chunks beyond the eager limit would go by rxm's slower protocols (the limit is the same
    // on every rank: checkEagerLimits).
    if (model_chunk) c->net_chunk_cap = mine.rxm_eager ? std::min<size_t>(chunk_cap, mine.rxm_eager) : chunk_cap;
    // Liveness now (a connection or two): it is what tells a dead rank on another node fast,
    // also while the network opens at the first call.
    c->liveness = std::make_unique<Liveness>(*c->bootstrap, livenessPeers(c->topo, c->rank), interfaceIpv4(oo.iface),
                                             c->timeoutMs(), [self](int r) { return self->who(r); }, call_now);
  }
  c->stats.size = sizeof(hcStats);
  c->stats.rank = c->rank;
  c->stats.nranks = c->nranks;
  c->stats.nnodes = c->topo.nnodes;
  c->stats.local_ranks = c->topo.uniform ? c->topo.localSize(0) : 0;
  c->stats.node = c->node();
  c->stats.local_rank = c->localRank();
  HC_INFO("communicator of {} ranks on {} node(s){}; this rank is node {} ({}) local {}", c->nranks,
          c->topo.nnodes, c->topo.uniform ? "" : " (uneven)", c->node(), c->topo.labels[c->node()],
          c->localRank());
  return c;
}

}  // namespace hicoll

hcComm::~hcComm() {
  try {
    if (quant_buf) hicoll::nodeMemFree(quant_buf);
  } catch (...) {
  }
}

bool hcComm::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(failure_mu);
  if (failed.exchange(true)) return false;
  failure_ = why;
  return true;
}

std::string hcComm::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu);
  return failure_;
}

void hcComm::release() {
  magic = kDead;
  device.reset();
  liveness.reset();
  ofi.reset();
  shm.reset();
  std::vector<AgreeMsg>().swap(agree_in);
  std::vector<AgreeMsg>().swap(agree_out);
  std::vector<size_t>().swap(agree_got);
  std::vector<int>().swap(agree_peers);
  bootstrap.reset();
  keepalive.reset();
  std::vector<char>().swap(heap_workspace);
  if (quant_buf) hicoll::nodeMemFree(quant_buf);
  quant_buf = nullptr;
  quant_bytes = 0;
  std::vector<char>().swap(quant_heap);
  std::vector<hicoll::RedOp>().swap(premul_ops);
  cfg = hicoll::Config();
  std::string().swap(failure_);
  topo = hicoll::Topology();
}

void hcComm::ensureNetwork(bool destroying) {
  if (topo.nnodes < 2 || ofi) return;
  // Whether every rank is here to open it, or some to destroy: a rank that destroys while the
  // others call a collective makes that an error on them, as a post on the board does on a node.
  struct Intent {
    uint32_t magic;
    uint32_t destroying;
    uint64_t call;
  };
  constexpr uint32_t kMagic = 0x68636e65;  // "hcne"
  Intent mine{kMagic, destroying ? 1u : 0u, calls.load()};
  std::vector<Intent> all(static_cast<size_t>(nranks));
  bootstrap->allgather(&mine, all.data(), sizeof mine, net_opt.while_blocked);
  for (int r = 0; r < nranks; ++r) {
    const Intent& i = all[static_cast<size_t>(r)];
    HC_CHECK(i.magic == kMagic, hcRemoteError, "{} is in another bootstrap exchange (hcCommSplit or hcCommShrink?) "
             "while this rank starts its first call on the communicator", who(r));
    if (i.destroying == mine.destroying) continue;
    if (destroying) {
      HC_WARN("hcCommDestroy: {} called a collective (its call {}) while rank {} destroys the communicator", who(r),
              i.call, rank);
      return;
    }
    HC_THROW(hcRemoteError, "{} destroyed its communicator while rank {} called its call {}", who(r), rank,
             mine.call);
  }
  if (destroying) return;  // nobody opened it: nothing in flight to wait for
  auto net = hicoll::makeOfiTransport(*bootstrap, net_opt);
  net->registerRegion(scratch, scratch_bytes);
  net->registerRegion(sort, sort_bytes);
  for (auto* v : {&agree_in, &agree_out})
    if (!v->empty()) net->registerRegion(v->data(), v->size() * sizeof(hcComm::AgreeMsg));
  std::lock_guard<std::mutex> lock(lifecycle_mu);
  ofi = std::move(net);
}

void hcComm::checkPeers() {
  shm->checkPeers();
  if (ofi) ofi->checkFailureNotices();
  if (liveness) liveness->check();
}

void hcComm::explainSymptom(long ms) {
  if (!ofi) return;
  hicoll::Deadline d(ms);
  while (!d.expired()) {
    ofi->checkFailureNotices();
    if (liveness) liveness->explain();  // a peer that closed its endpoint told its cause here
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string hcComm::who(int r) const { return topo.who(r); }

hicoll::Transport& hcComm::transportTo(int peer) {
  if (topo.node_of[peer] == node()) return *shm;
  HC_CHECK(ofi, hcInternalError, "no inter-node transport to rank {}", peer);
  return *ofi;
}

void hcComm::countCall(hcColl_t c, hcPath_t path, const std::string& reason, double predicted_s,
                       size_t chunk_bytes, size_t net_window) {
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.coll[c].calls[path]++;
  stats.predicted_us[c] = predicted_s * 1e6;
  stats.chunk_bytes[c] = chunk_bytes;
  stats.net_window[c] = net_window;
  if (path == hcPathFallback && !reason.empty())  // a ring the model chose is no fallback
    std::snprintf(stats.coll[c].last_fallback_reason, sizeof stats.coll[c].last_fallback_reason, "%s", reason.c_str());
}

char* hcComm::workspace(size_t bytes) {
  if (heap_workspace.size() < bytes) {
    heap_workspace = std::vector<char>();  // the old contents are not kept: free first
    heap_workspace.resize(bytes);
  }
  return heap_workspace.data();
}

char* hcComm::quantBuffer(size_t bytes) {
  if (quant_bytes >= bytes) return static_cast<char*>(quant_buf ? quant_buf : quant_heap.data());
  if (quant_buf) hicoll::nodeMemFree(quant_buf);
  quant_buf = nullptr;
  quant_bytes = 0;
  std::vector<char>().swap(quant_heap);
  try {
    quant_buf = hicoll::nodeMemAlloc(bytes);
  } catch (const hicoll::Error& e) {
    // Private memory works too (peers then read it with single-copy reads or through scratch).
    HC_WARN("quantized calls: no node memory for {} bytes ({}); using private memory", bytes, e.what());
    quant_heap.resize(bytes);
  }
  quant_bytes = bytes;
  return static_cast<char*>(quant_buf ? quant_buf : quant_heap.data());
}

void hcComm::countQuantized(hcColl_t c, double predicted_s) {
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.quantized_calls[c]++;
  if (predicted_s > 0) stats.predicted_us[c] = predicted_s * 1e6;
}

void hcComm::countNodeMemory(hcColl_t c, size_t bytes) {
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.bytes_node_memory[c] += bytes;
}

void hcComm::countBytes(hcColl_t c, int peer, size_t bytes) {
  std::lock_guard<std::mutex> lock(stats_mu);
  if (topo.node_of[peer] == node()) {
    stats.coll[c].bytes_intra += bytes;
  } else {
    stats.coll[c].bytes_inter += bytes;
  }
}
