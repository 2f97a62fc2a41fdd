// Self-launch on one machine with no launcher: fork np ranks, give them node labels, and wait.
// Shared by agbench and the training examples ("--np 4 --nodes 2").
#pragma once

#include <functional>
#include <string>

namespace hicoll::launch {

enum class Layout { Contiguous, Interleaved };  // node of rank r: r / (np/nodes)  |  r % nodes

struct Options {
  int np = 1;
  int nodes = 1;
  Layout layout = Layout::Contiguous;
  int timeout_s = 600;  // the whole job; ranks still running then are killed
};

// True when a launcher (torchrun, mpirun, srun) already started this process as one rank.
bool underLauncher();

// Forks opt.np children. Each gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port), HICOLL_TOPO_NODE=node<k> and runs
// rank_main(); its return value is the child's exit status. When a rank fails or dies the
// others are killed (by pid). Returns 0 when every rank exited 0, else the first failure.
int selfLaunch(const Options& opt, const std::function<int()>& rank_main);

}  // namespace hicoll::launch
