// Self-launch on one machine with no launcher: fork np ranks, give them node labels and a
// torchrun-style environment, and wait, bounded. The one launcher of agbench, soak, the training
// examples and the multi-process and GPU tests (not part of libhicoll; POSIX only).
#pragma once

#include <functional>
#include <map>
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

  // Tests and tools: per-rank node labels instead of nodes/layout; extra environment for every
  // rank and per rank (set last); whether to set HICOLL_TOPO_NODE; whether to make a random
  // HICOLL_COMM_SECRET (unless the environment has one); whether one rank's failure ends the job.
  std::vector<std::string> labels;
  std::map<std::string, std::string> env;
  std::map<int, std::map<std::string, std::string>> rank_env;
  bool set_node_labels = true;
  bool secret = true;
  bool kill_others = true;
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
// The same, given the rank, returning every rank's status (exit status, 128 + signal, 124 when
// the job's timeout killed it; -1 for ranks another launcher runs); empty when it could not
// launch (said on stderr).
std::vector<int> launchRanks(const Options& opt, const std::function<int(int rank)>& rank_main);

// Runs argv (argv[0] looked up in PATH) as a child with the same bounded wait: its exit status,
// 128 + signal, or 124 after timeout_s (the child is sent SIGTERM, then SIGKILL). Used to
// re-run a program under mpirun.
int runChild(const std::vector<std::string>& argv, int timeout_s);

}  // namespace hicoll::launch
