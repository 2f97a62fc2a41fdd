// What the planner's tests build: a communicator as the planner sees it (identity and plan
// context, on simulated nodes, with the given environment) and a host call.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace plantest {

struct Comm {
  hicoll::Identity id;
  hicoll::PlanContext ctx;
  // nodes x local ranks, contiguous, each node a host of its own.
  Comm(int nodes, int local, std::map<std::string, std::string> env = {}) {
    ctx.cfg = hicoll::Config::from([&](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
    std::vector<std::string> labels;
    for (int n = 0; n < nodes; ++n)
      for (int l = 0; l < local; ++l) labels.push_back("n" + std::to_string(n));
    id.nranks = nodes * local;
    id.topo = hicoll::Topology::build(labels, labels);
  }
};

// A float32 call of count elements (quantized in blocks of quant_block when set).
inline hicoll::CollArgs call(hcColl_t coll, size_t count, size_t quant_block = 0) {
  hicoll::CollArgs a;
  a.coll = coll;
  a.count = count;
  a.dtype = hcFloat32;
  a.quant.block = quant_block;
  a.quant.count = count;
  return a;
}

}  // namespace plantest
