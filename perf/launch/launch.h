// Self-launch on one machine with no launcher: fork np ranks, give them node labels, and wait.
// Shared by agbench and the training examples ("--np 4 --nodes 2").
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace hicoll::launch {

enum class Layout { Contiguous, Interleaved };  // node of rank r: r / (np/nodes)  |  r % nodes

struct Options {
  int np = 1;
  int nodes = 1;
  Layout layout = Layout::Contiguous;
  int timeout_s = 600;  // the whole job; ranks still running then are killed

  // Multi-node use (one launcher per node, e.g. one per network namespace): fork only the ranks
  // of node `node_rank` (-1: every rank, on this machine). Ranks keep their global numbers.
  int node_rank = -1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port on master_addr (only valid when node_rank < 0)
};

// True when a launcher (torchrun, mpirun, srun) already started this process as one rank.
bool underLauncher();

// Node index of rank r under the layout; for np not divisible by nodes the contiguous layout
// gives blocks of floor/ceil(np/nodes) ranks.
int nodeOf(const Options& opt, int rank);
// "node<k>", the HICOLL_TOPO_NODE label of node k.
std::string nodeLabel(int node);

// Forks opt.np children. Each gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port), HICOLL_TOPO_NODE=node<k> and runs
// rank_main(); its return value is the child's exit status. When a rank fails or dies the
// others are killed (by pid). Returns 0 when every rank exited 0, else the first failure
// (an exit status, 128 + signal for a rank killed by a signal, 124 on the job timeout).
int selfLaunch(const Options& opt, const std::function<int()>& rank_main);

// Runs argv (argv[0] looked up in PATH) as a child with the same bounded wait: its exit status,
// 128 + signal, or 124 after timeout_s (the child is sent SIGTERM, then SIGKILL). Used to
// re-run a program under mpirun.
int runChild(const std::vector<std::string>& argv, int timeout_s);

}  // namespace hicoll::launch
