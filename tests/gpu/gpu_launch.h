// Ranks of the GPU tests as forked processes (CUDA IPC needs one process per rank), with
// simulated nodes through HICOLL_TOPO_NODE and a rendezvous on a free loopback port. CUDA must
// not be initialised in the parent before fork(): the device probe runs in a child too.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace hcgpu {

// Number of CUDA devices, probed in a child process (0 when there is no driver or device).
int deviceCount();

struct Job {
  std::vector<std::string> nodes;          // node label per rank
  std::map<std::string, std::string> env;  // extra environment for every rank
  int timeout_s = 180;                     // then every rank still running is killed
};

// Runs body(rank, nranks) in one child per rank through the project's launcher (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, HICOLL_TOPO_NODE and a random HICOLL_COMM_SECRET set:
// hcCommInitFromEnv works). Returns 0 when every rank returned 0; otherwise prints which rank
// failed how and returns 1 (a rank still running at the timeout is killed).
int run(const Job& job, const std::function<int(int rank, int nranks)>& body);

}  // namespace hcgpu
