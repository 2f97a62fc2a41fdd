// Who a communicator is: this rank among its ranks, and where every rank lives. Set at
// creation, the same on every rank (but rank), read by every floor; nothing changes it after.
#pragma once

#include <string>

#include "base/topology.h"

namespace hicoll {

struct Identity {
  std::string name;    // hcConfig_t.name, for log lines
  int log_level = -1;  // HICOLL_DEBUG of its configuration, for its log lines
  int rank = 0;
  int nranks = 0;
  Topology topo;

  int node() const { return topo.node_of[rank]; }
  int localRank() const { return topo.local_of[rank]; }
  bool sameNode(int peer) const { return topo.node_of[peer] == node(); }
  // "rank 3 (node 'n1')", for messages.
  std::string who(int r) const { return topo.who(r); }
};

}  // namespace hicoll
