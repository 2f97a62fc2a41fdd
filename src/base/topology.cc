#include "base/topology.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace hicoll {

Topology Topology::build(const std::vector<std::string>& node_labels, const std::vector<std::string>& host_names) {
  Topology t;
  t.nranks = static_cast<int>(node_labels.size());
  t.node_of.assign(t.nranks, -1);
  t.local_of.assign(t.nranks, -1);
  std::map<std::string, int> index;
  for (int r = 0; r < t.nranks; ++r) {
    auto [it, inserted] = index.emplace(node_labels[r], t.nnodes);
    if (inserted) {
      ++t.nnodes;
      t.ranks_of.emplace_back();
      t.labels.push_back(node_labels[r]);
    }
    int n = it->second;
    t.node_of[r] = n;
    t.local_of[r] = static_cast<int>(t.ranks_of[n].size());
    t.ranks_of[n].push_back(r);
  }
  t.uniform = true;
  for (const auto& rs : t.ranks_of) t.uniform = t.uniform && rs.size() == t.ranks_of[0].size();
  t.single_host = true;
  for (const auto& h : host_names) t.single_host = t.single_host && h == host_names[0];
  return t;
}

std::string Topology::who(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(node_of.size())) return fmt::format("rank {}", rank);
  return fmt::format("rank {} (node '{}')", rank, labels[node_of[rank]]);
}

std::vector<int> Topology::agreementPeers(int rank) const {
  std::vector<int> peers;
  if (nnodes < 2) return peers;
  const int n = node_of[rank];
  if (uniform) {
    for (int m = 0; m < nnodes; ++m)
      if (m != n) peers.push_back(rankAt(m, local_of[rank]));
    return peers;
  }
  for (int p : {(rank + nranks - 1) % nranks, (rank + 1) % nranks})
    if (node_of[p] != n && std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);
  return peers;
}

}  // namespace hicoll
