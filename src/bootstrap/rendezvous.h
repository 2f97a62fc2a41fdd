// From a unique id or a launcher's environment to a Store shared by all ranks.
#pragma once

#include <memory>
#include <string>

#include "bootstrap/store.h"
#include "hicoll/hicoll.h"

namespace hicoll {

struct Rendezvous {
  std::shared_ptr<void> keepalive;  // the server, when this process hosts it: it must
                                    // outlive this process's own connection below
  std::shared_ptr<Store> store;
};

// Starts the rendezvous server (on HICOLL_SOCKET_IFNAME, default loopback) in this process.
hcUniqueId makeUniqueId(const std::string& socket_ifname, long timeout_ms);
Rendezvous joinUniqueId(const hcUniqueId& id, int rank, int nranks, long timeout_ms);

struct LaunchEnv {
  int rank = -1, nranks = -1;
  std::string host;  // rendezvous host and port (rank 0 listens there)
  int port = 0;
  std::string source;      // "torchrun", "mpirun", "srun" (for messages)
  int listen_fd = -1;      // rank 0: an inherited listening socket (HICOLL_RENDEZVOUS_FD)
  std::string secret;      // HICOLL_COMM_SECRET ("" = derived from the launcher's job id)
  bool all_local = false;  // the launcher says every rank runs on this host
};
// Reads torchrun / mpirun / srun variables; throws hcInvalidArgument naming what is missing.
LaunchEnv readLaunchEnv(const std::string& comm_id);
Rendezvous joinEnv(const LaunchEnv& env, long timeout_ms);

}  // namespace hicoll
