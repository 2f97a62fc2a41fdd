// A small key-value store served over TCP by one rank (the root of a unique id or rank 0 of
// an environment launch) — the rendezvous of hcCommInitRank / hcCommInitFromEnv.
// Clients authenticate with the job's secret and a rank; strangers (wrong magic or secret,
// a taken rank, garbage, silence) are disconnected without disturbing the job. Before a
// connection has authenticated the server reads nothing but its greeting; unauthenticated
// connections are capped in number and lifetime, values in size (each, and all of one rank's), and
// keys a bootstrap no longer needs are deleted, so nobody can grow the server without bound.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "bootstrap/socket.h"
#include "bootstrap/store.h"

namespace hicoll {

using Secret = std::array<uint8_t, 16>;

class TcpStoreServer {
 public:
  virtual ~TcpStoreServer() = default;
  virtual SockAddr address() const = 0;
};

struct TcpStoreLimits {
  long drain_ms = 60000;             // how long destruction waits for connected ranks to leave
  size_t max_value = 1 << 20;        // bytes of one value
  size_t per_rank_total = 4u << 20;  // bytes of the keys and values one rank holds
  size_t max_unauthenticated = 64;   // the oldest is dropped beyond this
  long hello_ms = 5000;              // an unauthenticated connection's lifetime
};

// Listens on addr (port 0 = any) and serves in a background thread until destroyed.
std::shared_ptr<TcpStoreServer> startTcpStoreServer(SockAddr addr, const Secret& secret,
                                                    const TcpStoreLimits& limits = {});
// Serves on a socket that is already listening (inherited from a launcher).
std::shared_ptr<TcpStoreServer> startTcpStoreServer(Fd listening, const Secret& secret,
                                                    const TcpStoreLimits& limits = {});
std::shared_ptr<Store> connectTcpStore(const SockAddr& addr, const Secret& secret, int rank, int nranks,
                                       long timeout_ms);

Secret randomSecret();

}  // namespace hicoll
