// Ranks grouped into nodes by label (host name or HICOLL_TOPO_NODE). Ranks need not be
// block-ordered: the rank -> (node, local) map is explicit, so ranks 0,2 on one node and
// 1,3 on another work like any other layout.
#pragma once

#include <string>
#include <vector>

namespace hicoll {

struct Topology {
  int nranks = 0;
  int nnodes = 0;
  std::vector<int> node_of;                // rank -> node index (nodes numbered by lowest rank)
  std::vector<int> local_of;               // rank -> index among its node's ranks (by rank)
  std::vector<std::vector<int>> ranks_of;  // node -> ranks, ascending
  std::vector<std::string> labels;         // node -> label
  bool uniform = false;                    // every node has the same number of ranks
  bool single_host = false;                // every rank reported the same host name

  int localSize(int node) const { return static_cast<int>(ranks_of[node].size()); }
  // Valid only when uniform: the rank at (node, local).
  int rankAt(int node, int local) const { return ranks_of[node][local]; }
  // "rank 3 (node 'n1')": how every message names a rank ("rank 3" outside the topology).
  std::string who(int rank) const;
  // The remote ranks each call of rank is agreed with. With the node board agreeing every node,
  // the rails (the same local index on every other node) connect all nodes; on uneven nodes,
  // the ring neighbours do. Symmetric: each rank receives from every rank it sends to.
  std::vector<int> agreementPeers(int rank) const;

  static Topology build(const std::vector<std::string>& node_labels, const std::vector<std::string>& host_names);
};

}  // namespace hicoll
