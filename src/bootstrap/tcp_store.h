// A small key-value store served over TCP by one rank (the root of a unique id or rank 0 of
// an environment launch) — the rendezvous of hcCommInitRank / hcCommInitFromEnv.
// Clients authenticate with the job's secret and a rank; strangers (wrong magic or secret,
// a taken rank, garbage, silence) are disconnected without disturbing the job.
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

// Listens on addr (port 0 = any) and serves in a background thread until destroyed.
std::shared_ptr<TcpStoreServer> startTcpStoreServer(SockAddr addr, const Secret& secret);
// Serves on a socket that is already listening (inherited from a launcher).
std::shared_ptr<TcpStoreServer> startTcpStoreServer(Fd listening, const Secret& secret);
std::shared_ptr<Store> connectTcpStore(const SockAddr& addr, const Secret& secret, int rank, int nranks,
                                       long timeout_ms);

Secret randomSecret();

}  // namespace hicoll
