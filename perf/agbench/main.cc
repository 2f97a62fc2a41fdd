// agbench entry: pick how the ranks start (self-launch, one launcher per node, mpirun,
// torchrun/srun), bootstrap hicoll, add the baselines, run.
//
// The MPI baseline needs MPI ranks. Self-launched, agbench re-runs itself as
//   mpirun --allow-run-as-root --oversubscribe --bind-to none -np N <agbench> <same args>
// and each rank derives its node label (hcConfig_t.topoNode) from its MPI rank, --nodes and
// --layout; hicoll then bootstraps from a unique id that rank 0 creates and MPI_Bcast hands out.
#include <hicoll/hicoll.h>
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "agbench.h"
#include "bench.h"
#include "comm.h"
#include "launch/launch.h"

namespace agbench {
namespace {

namespace L = hicoll::launch;

enum class Mode { SelfLaunch, PerNode, Mpi, Launcher };

L::Options launchOptions(const Args& a) {
  L::Options o;
  o.np = a.np;
  o.nodes = a.nodes;
  o.layout = a.layout;
  o.timeout_s = a.timeout_s > 0 ? a.timeout_s : o.timeout_s;
  o.node_rank = a.node_rank;
  o.master_addr = a.master_addr;
  o.master_port = a.master_port;
  return o;
}

#ifdef AGBENCH_HAVE_MPI
bool underMpirun() {
  return std::getenv("OMPI_COMM_WORLD_RANK") && std::getenv("OMPI_COMM_WORLD_SIZE");
}
#endif

// A second hicoll communicator over the same ranks with HICOLL_ALGO=algo (a per-communicator
// configuration), bootstrapped by a unique id that rank 0 hands out over sync.
hcComm_t makeAlgoComm(Sync& sync, hcConfig_t cfg, const char* algo) {
  hcUniqueId id{};
  if (sync.rank() == 0) hcCheck(hcGetUniqueId(&id), nullptr, "hcGetUniqueId");
  sync.broadcast(&id, sizeof id, 0);
  hcComm_t ring = nullptr;
  cfg.algo = algo;
  const std::string name = std::string(algo) + " baseline";
  cfg.name = name.c_str();
  hcCheck(hcCommInitRankConfig(&ring, sync.size(), id, sync.rank(), &cfg), nullptr, "hcCommInitRank (baseline)");
  return ring;
}

// The whole life of one rank. Returns its exit status.
int rankMain(const Args& a, Mode mode, int* argc, char*** argv) {
  hcConfig_t cfg = HC_CONFIG_INITIALIZER;  // --algo, and under mpirun the node label
  if (!a.algo.empty()) cfg.algo = a.algo.c_str();
  std::string node_label;
  if (a.timeout_s > 0 && (mode == Mode::Mpi || mode == Mode::Launcher))
    ::alarm(static_cast<unsigned>(a.timeout_s));  // no supervising parent of ours here

  hcComm_t comm = nullptr, sync_comm = nullptr, ring_comm = nullptr, hier_comm = nullptr, quant_comm = nullptr;
  std::unique_ptr<Sync> sync;
  std::vector<std::unique_ptr<Variant>> owned;
  World w;
  int rc = 0;
  (void)argc, (void)argv;
  try {
    if (mode == Mode::Mpi) {
#ifdef AGBENCH_HAVE_MPI
      mpiInit(argc, argv);
      const int rank = mpiRank(), size = mpiSize();
      if (a.np_given && a.np != size)
        throw std::runtime_error("--np " + std::to_string(a.np) + " but mpirun started " + std::to_string(size) +
                                 " ranks");
      if (a.nodes_given) {
        L::Options o = launchOptions(a);
        o.np = size;
        node_label = L::nodeLabel(L::nodeOf(o, rank));
        cfg.topoNode = node_label.c_str();
      }
      sync = makeMpiSync();
      hcUniqueId id{};
      if (rank == 0) hcCheck(hcGetUniqueId(&id), nullptr, "hcGetUniqueId");
      sync->broadcast(&id, sizeof id, 0);
      hcCheck(hcCommInitRankConfig(&comm, size, id, rank, &cfg), nullptr, "hcCommInitRank");
      w.mode = std::getenv("AGBENCH_REEXEC") ? "self-launch (mpirun)" : "mpirun";
#endif
    } else {
      hcCheck(hcCommInitFromEnvConfig(&comm, &cfg), nullptr, "hcCommInitFromEnv");
      // Bookkeeping on a communicator of its own keeps the measured one's statistics clean.
      int rank = 0;
      hcCheck(hcCommUserRank(comm, &rank), comm, "hcCommUserRank");
      hcCheck(hcCommSplit(comm, 0, rank, &sync_comm), comm, "hcCommSplit");
      sync = makeHicollSync(sync_comm);
      w.mode = mode == Mode::Launcher ? "launcher" : mode == Mode::PerNode ? "per-node launch" : "self-launch";
    }
    w.sync = sync.get();
    w.rank = sync->rank();
    w.nranks = sync->size();

    // Ranks must agree on what they run (iteration counts, sizes, types, baselines).
    int64_t h[2] = {static_cast<int64_t>(a.hash() >> 1), -static_cast<int64_t>(a.hash() >> 1)};
    sync->allreduce(h, 2, Sync::Red::Min);
    if (h[0] != static_cast<int64_t>(a.hash() >> 1) || -h[1] != static_cast<int64_t>(a.hash() >> 1))
      throw std::runtime_error("ranks were given different arguments");

    if (a.calibrate) {
      rc = runCalibrate(a, w, comm);
      if (sync_comm) hcCommDestroy(sync_comm);
      hcCommDestroy(comm);
      return rc;
    }
    owned.push_back(makeHicollVariant(comm, "hicoll"));
    if (a.quant_block) {
      // A communicator of its own, so that each variant's statistics count only its calls.
      hcCheck(hcCommSplit(comm, 0, w.rank, &quant_comm), comm, "hcCommSplit (quantized variant)");
      owned.push_back(makeHicollVariant(quant_comm, "hicoll-int8", a.quant_block));
    }
    if (a.has(Baseline::Ring)) {
      ring_comm = makeAlgoComm(*sync, cfg, "ring");
      owned.push_back(makeHicollVariant(ring_comm, "ring"));
    }
    if (a.has(Baseline::Hier)) {
      hier_comm = makeAlgoComm(*sync, cfg, "hier");
      owned.push_back(makeHicollVariant(hier_comm, "hier"));
    }
    if (a.has(Baseline::Mpi)) {
#ifdef AGBENCH_HAVE_MPI
      owned.push_back(makeMpiVariant());
      if (std::getenv("AGBENCH_REEXEC") && a.nodes > 1)
        w.mpi_note = "all ranks on one host: MPI sees 1 node (shared memory), hicoll sees " + std::to_string(a.nodes) +
                     " emulated nodes";
#endif
    }
    for (auto& v : owned) w.variants.push_back(v.get());
    rc = runBench(a, w);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "agbench: rank %d: %s\n", w.rank, e.what());
    std::fflush(stderr);
    rc = 3;
  }
  owned.clear();
  if (rc == 3) {
    // Peers may be blocked in a collective: abort so they fail fast instead of timing out.
    if (ring_comm) hcCommAbort(ring_comm);
    if (hier_comm) hcCommAbort(hier_comm);
    if (quant_comm) hcCommAbort(quant_comm);
    if (sync_comm) hcCommAbort(sync_comm);
    if (comm) hcCommAbort(comm);
#ifdef AGBENCH_HAVE_MPI
    if (mode == Mode::Mpi) mpiAbort(rc);
#endif
    return rc;
  }
  if (ring_comm) hcCommDestroy(ring_comm);
  if (hier_comm) hcCommDestroy(hier_comm);
  if (quant_comm) hcCommDestroy(quant_comm);
  if (sync_comm) hcCommDestroy(sync_comm);
  if (comm) hcCommDestroy(comm);
#ifdef AGBENCH_HAVE_MPI
  if (mode == Mode::Mpi) mpiFinalize();
#endif
  return rc;
}

#ifdef AGBENCH_HAVE_MPI
std::vector<std::string> splitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Self-launch with the MPI baseline: re-run this program under mpirun (see the top comment).
int reexecUnderMpirun(const Args& a) {
  char exe[PATH_MAX] = {};
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    std::fprintf(stderr, "agbench: cannot find my own executable\n");
    return 2;
  }
  std::vector<std::string> cmd = {a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                                  "-np",    std::to_string(a.np)};
  for (const std::string& w : splitWords(a.mpirun_args)) cmd.push_back(w);
  cmd.push_back(exe);
  for (size_t k = 1; k < a.argv.size(); ++k) cmd.push_back(a.argv[k]);
  ::setenv("AGBENCH_REEXEC", "1", 1);
  std::string shown;  // the machine's paths stay out of printed (and committed) results
  for (const std::string& w : cmd) shown += (shown.empty() ? "" : " ") + (w == exe ? std::string("agbench") : w);
  std::printf("# agbench: running the ranks under MPI: %s\n", shown.c_str());
  return L::runChild(cmd, launchOptions(a).timeout_s);
}
#endif

}  // namespace
}  // namespace agbench

int main(int argc, char** argv) {
  using namespace agbench;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Args a;
  int code = 0;
  if (!parseArgs(argc, argv, &a, &code)) return code;

  if (a.node_rank >= 0) {  // one agbench per node (network namespaces): ranks of this node only
    if (a.has(Baseline::Mpi)) {
      std::fprintf(stderr, "agbench: --baseline mpi with --node-rank: run agbench under mpirun instead\n");
      return 2;
    }
    return L::selfLaunch(launchOptions(a), [&] { return rankMain(a, Mode::PerNode, &argc, &argv); });
  }

  if (L::underLauncher()) {
    Mode mode = Mode::Launcher;
#ifdef AGBENCH_HAVE_MPI
    if (underMpirun()) mode = Mode::Mpi;
#endif
    if (a.has(Baseline::Mpi) && mode != Mode::Mpi) {
      std::fprintf(stderr,
                   "agbench: --baseline mpi needs mpirun (or no launcher: agbench then "
                   "starts mpirun itself)%s\n",
#ifdef AGBENCH_HAVE_MPI
                   ""
#else
                   "; this build has no MPI"
#endif
      );
      return 2;
    }
    return rankMain(a, mode, &argc, &argv);
  }

  if (a.has(Baseline::Mpi)) {
#ifdef AGBENCH_HAVE_MPI
    return reexecUnderMpirun(a);
#else
    std::fprintf(stderr, "agbench: --baseline mpi: this build has no MPI (HICOLL_WITH_MPI)\n");
    return 2;
#endif
  }
  return L::selfLaunch(launchOptions(a), [&] { return rankMain(a, Mode::SelfLaunch, &argc, &argv); });
}
