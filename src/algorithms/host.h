// Host-buffer collectives: choose the path (hierarchical, ring, or the ring as fallback) and
// run it, blocking, with statistics and the fallback announced.
#pragma once

#include <string>

#include "core/coll.h"

struct hcComm;

namespace hicoll {

struct PathChoice {
  hcPath_t path = hcPathHierarchical;
  std::string reason;  // why the hierarchical path was not taken ("" when it was)
};

// The decision table, the same on every rank (it depends only on values that agree across
// ranks): HICOLL_FORCE_FALLBACK, HICOLL_ALGO, uneven nodes, scratch/sort rules.
PathChoice choosePath(const hcComm& comm, const CollArgs& a);

void runHostCollective(hcComm& comm, const CollArgs& a);

}  // namespace hicoll
