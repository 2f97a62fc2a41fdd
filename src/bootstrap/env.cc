#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "bootstrap/rendezvous.h"
#include "bootstrap/tcp_store.h"

namespace hicoll {
namespace {

constexpr uint64_t kIdMagic = 0x6863756e69717565ULL;

struct IdData {
  uint64_t magic;
  uint8_t secret[16];
  uint32_t addrlen;
  uint32_t pad;
  uint8_t addr[sizeof(sockaddr_in6)];  // IPv4 or IPv6
};
static_assert(sizeof(IdData) <= HC_UNIQUE_ID_BYTES, "hcUniqueId is too small");

// Servers started by hcGetUniqueId in this process, until a rank of this process joins.
std::mutex g_mu;
std::map<std::string, std::shared_ptr<TcpStoreServer>> g_servers;

std::string secretKey(const uint8_t* s) {
  return std::string(reinterpret_cast<const char*>(s), 16);
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Launchers give no secret; derive one from HICOLL_COMM_SECRET and the job's id so unrelated
// jobs cannot collide. Written out (FNV-1a of a fixed text) so that it is the same in every
// build; it is only as unguessable as its inputs, which is why weakSecretWhy() exists.
Secret deriveSecret(const std::string& configured) {
  Secret s{};
  std::string job = "hicoll-secret-v1;";
  if (!configured.empty()) job += "secret=" + configured + ";";
  for (const char* n : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"})
    if (const char* v = env(n)) job += std::string(n) + "=" + v + ";";
  const uint64_t h1 = fnv1a(job), h2 = fnv1a(job + "#", h1);
  std::memcpy(s.data(), &h1, 8);
  std::memcpy(s.data() + 8, &h2, 8);
  return s;
}

// Why the derived secret is guessable ("" when it is not): only HICOLL_COMM_SECRET, or a run id
// with the randomness of a UUID (torchrun --standalone makes one), count.
std::string weakSecretWhy(const std::string& configured) {
  if (configured.size() >= 16) return "";
  if (!configured.empty()) return fmt::format("HICOLL_COMM_SECRET has only {} characters", configured.size());
  const char* run = env("TORCHELASTIC_RUN_ID");
  if (run && std::strlen(run) >= 16 && std::string(run) != "none") return "";
  std::string ids;
  for (const char* n : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"})
    if (const char* v = env(n)) ids += fmt::format("{}{}='{}'", ids.empty() ? "" : ", ", n, v);
  return "no HICOLL_COMM_SECRET, and " +
         (ids.empty() ? std::string("no launcher job id") : "the launcher's job id (" + ids + ") can be guessed");
}

// Whether the launcher says every rank runs on this host.
bool allRanksLocal(int nranks) {
  for (const char* n : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"})
    if (const char* v = env(n)) return std::atoi(v) == nranks;
  for (const char* n : {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"})
    if (const char* v = env(n)) return std::atoi(v) == 1;
  return false;
}

}  // namespace

hcUniqueId makeUniqueId(const std::string& socket_ifname, long timeout_ms) {
  SockAddr addr = addressOfInterface(socket_ifname);
  Secret secret = randomSecret();
  TcpStoreLimits limits;
  limits.drain_ms = timeout_ms;
  auto server = startTcpStoreServer(addr, secret, limits);
  IdData d{};
  d.magic = kIdMagic;
  std::memcpy(d.secret, secret.data(), 16);
  SockAddr bound = server->address();
  HC_CHECK(bound.len <= sizeof d.addr, hcInternalError, "rendezvous address too long");
  d.addrlen = bound.len;
  std::memcpy(d.addr, &bound.ss, bound.len);
  HC_INFO("rendezvous listening on {}", bound.str());
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_servers[secretKey(d.secret)] = server;
  }
  hcUniqueId id{};
  std::memcpy(id.internal, &d, sizeof d);
  return id;
}

Rendezvous joinUniqueId(const hcUniqueId& id, int rank, int nranks, long timeout_ms) {
  IdData d;
  std::memcpy(&d, id.internal, sizeof d);
  HC_CHECK(d.magic == kIdMagic && d.addrlen > 0 && d.addrlen <= sizeof d.addr, hcInvalidArgument,
           "hcCommInitRank: the unique id is not one made by hcGetUniqueId");
  Rendezvous rv;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_servers.find(secretKey(d.secret));
    if (it != g_servers.end()) {
      rv.keepalive = it->second;
      g_servers.erase(it);
    }
  }
  SockAddr addr;
  std::memcpy(&addr.ss, d.addr, d.addrlen);
  addr.len = d.addrlen;
  Secret secret;
  std::memcpy(secret.data(), d.secret, 16);
  rv.store = connectTcpStore(addr, secret, rank, nranks, timeout_ms);
  return rv;
}

LaunchEnv readLaunchEnv(const std::string& comm_id) {
  LaunchEnv e;
  auto num = [](const char* name) { return static_cast<int>(parseInt(name, env(name))); };
  if (env("RANK") && env("WORLD_SIZE")) {
    e.rank = num("RANK");
    e.nranks = num("WORLD_SIZE");
    e.source = "torchrun";
  } else if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    e.rank = num("OMPI_COMM_WORLD_RANK");
    e.nranks = num("OMPI_COMM_WORLD_SIZE");
    e.source = "mpirun";
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    e.rank = num("SLURM_PROCID");
    e.nranks = num("SLURM_NTASKS");
    e.source = "srun";
  } else {
    HC_THROW(hcInvalidArgument,
             "hcCommInitFromEnv: no launcher environment (RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/SIZE or "
             "SLURM_PROCID/NTASKS)");
  }
  HC_CHECK(e.nranks > 0 && e.rank >= 0 && e.rank < e.nranks, hcInvalidArgument,
           "hcCommInitFromEnv: rank {} is outside [0, {}) ({})", e.rank, e.nranks, e.source);
  if (!comm_id.empty()) {
    size_t colon = comm_id.rfind(':');
    HC_CHECK(colon != std::string::npos && colon > 0, hcInvalidArgument, "HICOLL_COMM_ID='{}' is not host:port",
             comm_id);
    e.host = comm_id.substr(0, colon);
    if (e.host.size() > 2 && e.host.front() == '[') e.host = e.host.substr(1, e.host.size() - 2);
    const int64_t port = parseInt("HICOLL_COMM_ID", comm_id.substr(colon + 1));
    HC_CHECK(port > 0 && port < 65536, hcInvalidArgument, "HICOLL_COMM_ID='{}': port {} is outside 1 .. 65535", comm_id,
             port);
    e.port = static_cast<int>(port);
  } else if (env("MASTER_ADDR") && env("MASTER_PORT")) {
    // MASTER_PORT itself is taken by torchrun's own store: hicoll listens on the next port.
    e.host = env("MASTER_ADDR");
    const int64_t port = parseInt("MASTER_PORT", env("MASTER_PORT"));
    HC_CHECK(port > 0 && port < 65535, hcInvalidArgument,
             "MASTER_PORT={}: hicoll's rendezvous listens on MASTER_PORT + 1, which must be in 1 .. 65535 (or set "
             "HICOLL_COMM_ID=host:port)",
             port);
    e.port = static_cast<int>(port + 1);
  } else {
    HC_THROW(hcInvalidArgument,
             "hcCommInitFromEnv: rank {} of {} ({}) has no rendezvous: set MASTER_ADDR and MASTER_PORT, or "
             "HICOLL_COMM_ID=host:port",
             e.rank, e.nranks, e.source);
  }
  e.all_local = allRanksLocal(e.nranks);
  return e;
}

Rendezvous joinEnv(const LaunchEnv& e, long timeout_ms) {
  Rendezvous rv;
  const std::string weak = weakSecretWhy(e.secret);
  // A guessable secret: at least keep the rendezvous off the network when nobody needs it there.
  const bool loopback = !weak.empty() && e.all_local && e.listen_fd < 0;
  SockAddr addr = resolveHostPort(loopback ? "127.0.0.1" : e.host, e.port);
  Secret secret = deriveSecret(e.secret);
  if (e.rank == 0) {
    if (!weak.empty())
      HC_WARN(
          "hcCommInitFromEnv: the rendezvous secret can be guessed ({}): a process that reaches port {} can "
          "join as a rank. Set HICOLL_COMM_SECRET to the same random string on every rank (e.g. `openssl rand "
          "-hex 16`).{}",
          weak, e.port, loopback ? " Every rank is on this host: the rendezvous listens on 127.0.0.1 only." : "");
    TcpStoreLimits limits;
    limits.drain_ms = timeout_ms;
    auto server = e.listen_fd >= 0 ? startTcpStoreServer(Fd(e.listen_fd), secret, limits)
                                   : startTcpStoreServer(addr, secret, limits);
    HC_INFO("rendezvous for {} ranks ({}) listening on {}", e.nranks, e.source, server->address().str());
    rv.keepalive = server;
  }
  rv.store = connectTcpStore(addr, secret, e.rank, e.nranks, timeout_ms);
  return rv;
}

}  // namespace hicoll
