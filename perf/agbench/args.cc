// Command line: nccl-tests' flags and meanings, plus launch and baseline options.
#include <CLI/CLI.hpp>

#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>

#include "agbench.h"

namespace agbench {

size_t parseBytes(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    throw std::invalid_argument("not a size: '" + s + "'");
  }
  double unit = 1;
  std::string rest = s.substr(pos);
  if (rest.size() == 1 || (rest.size() == 2 && (rest[1] == 'B' || rest[1] == 'b'))) {
    switch (std::toupper(static_cast<unsigned char>(rest[0]))) {
      case 'K': unit = 1024.0; break;
      case 'M': unit = 1024.0 * 1024; break;
      case 'G': unit = 1024.0 * 1024 * 1024; break;
      case 'B': unit = 1; break;
      default: throw std::invalid_argument("not a size: '" + s + "' (suffixes K, M, G)");
    }
  } else if (!rest.empty()) {
    throw std::invalid_argument("not a size: '" + s + "' (suffixes K, M, G)");
  }
  if (!(v >= 0) || !std::isfinite(v)) throw std::invalid_argument("not a size: '" + s + "'");
  return static_cast<size_t>(std::llround(v * unit));
}

namespace {

const TypeDesc* findType(const std::string& name) {
  static const std::map<std::string, std::string> alias = {
      {"char", "int8"},  {"int", "int32"},      {"fp16", "half"},   {"float16", "half"},  {"float32", "float"},
      {"fp32", "float"}, {"float64", "double"}, {"fp64", "double"}, {"bf16", "bfloat16"}, {"uchar", "uint8"},
  };
  std::string n = name;
  if (auto it = alias.find(n); it != alias.end()) n = it->second;
  for (const TypeDesc& t : allTypes())
    if (n == t.name) return &t;
  return nullptr;
}

int findOp(const std::string& name) {
  for (int op : allOps())
    if (name == opName(op)) return op;
  throw std::invalid_argument("unknown op '" + name + "' (sum, prod, min, max, avg, mulsum, all)");
}

// nccl-tests' program names, as subcommands (and as agbench's own name through a link).
const std::map<std::string, std::string>& perfNames() {
  static const std::map<std::string, std::string> m = {
      {"all_gather_perf", "allgather"}, {"reduce_scatter_perf", "reducescatter"},
      {"all_reduce_perf", "allreduce"}, {"broadcast_perf", "broadcast"},
      {"alltoall_perf", "alltoall"},    {"sendrecv_perf", "sendrecv"},
  };
  return m;
}

// Integer ranges whose message reads well (CLI11's PositiveNumber prints the largest double).
const CLI::Range kPositive(1, INT_MAX), kNonNegative(0, INT_MAX);

std::string baseName(const std::string& path) {
  return path.substr(path.rfind('/') + 1);
}

// nccl-tests' flags that ask for what host buffers do not have: accepted at their defaults
// (scripts pass them), refused otherwise, each with what to do instead.
struct Refused {
  int value = 0, allowed = 0;
  const char* flag;
  const char* why;
};

}  // namespace

bool parseArgs(int argc, char** argv, Args* a, int* exit_code) {
  // Called through a link named as an nccl-tests program (all_gather_perf -> agbench): that
  // program's collective is the subcommand.
  const int given = argc;
  std::vector<char*> args(argv, argv + argc);
  const std::string self = argc > 0 ? baseName(argv[0]) : "";
  auto linked = perfNames().find(self);
  std::string linked_sub = linked != perfNames().end() ? linked->second : "";
  if (!linked_sub.empty()) args.insert(args.begin() + 1, linked_sub.data());
  a->program = self.empty() ? "agbench" : self;
  // nccl-tests' programs of collectives the C API does not have: said so, not "unexpected".
  for (char* arg : args)
    for (const char* other : {"reduce_perf", "gather_perf", "scatter_perf", "hypercube_perf"})
      if (baseName(arg) == other) {
        std::fprintf(stderr,
                     "agbench: %s: hicoll's C API has no such collective; agbench measures all_gather_perf, "
                     "reduce_scatter_perf, all_reduce_perf, broadcast_perf, alltoall_perf and sendrecv_perf\n",
                     other);
        *exit_code = 2;
        return false;
      }
  argc = static_cast<int>(args.size());
  char** av = args.data();

  CLI::App app{
      "agbench: nccl-tests-style benchmark of hicoll collectives on host buffers.\n"
      "Self-launches --np ranks on --nodes emulated nodes when no launcher (mpirun, torchrun, "
      "srun) started it.",
      "agbench"};
  // A collective or calibrate; `agbench --calibrate` is the calibrate subcommand too.
  app.require_subcommand(0, 1);
  app.fallthrough();
  bool calibrate_flag = false;
  app.add_flag("--calibrate", calibrate_flag, "the same as the calibrate subcommand");
  const char* colls[] = {"allgather", "reducescatter", "allreduce", "broadcast", "alltoall", "sendrecv"};
  for (const char* c : colls) {
    CLI::App* s = app.add_subcommand(c, std::string("benchmark ") + c);
    for (const auto& [perf, coll] : perfNames())
      if (coll == c) s->alias(perf);
  }
  app.add_subcommand("calibrate",
                     "measure the cost model's machine figures on these ranks and print them; "
                     "-J FILE writes them for HICOLL_MODEL_FILE (perf/README.md)");

  std::string b = "32M", e = "32M", i = "1M", d = "float", o = "sum", layout = "contiguous";
  std::vector<std::string> baselines;
  app.add_option("-b,--minbytes", b, "minimum size: the full buffer, K/M/G suffixes")->capture_default_str();
  app.add_option("-e,--maxbytes", e, "maximum size")->capture_default_str();
  app.add_option("-i,--stepbytes", i, "size increment when -f is 1")->capture_default_str();
  app.add_option("-f,--stepfactor", a->step_factor, "size multiplication factor")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("-n,--iters", a->iters, "timed iterations")->capture_default_str()->check(kPositive);
  std::string ib;
  app.add_option("--iters-bytes", ib,
                 "time at least this many bytes (size x iterations) per timing, more iterations "
                 "than -n at small sizes: a token-bucket link's burst (netns_emulate.sh) or a "
                 "cache then counts for little");
  app.add_option("-w,--warmup_iters", a->warmup, "warm-up iterations at every size")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("-c,--check", a->check, "check iterations (fresh data, after timing)")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("-d,--datatype", d, "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16, or all")
      ->capture_default_str();
  app.add_option("-o,--op", o, "sum prod min max avg mulsum, or all (reductions only)")->capture_default_str();
  app.add_option("-r,--root", a->root, "root rank (broadcast)")->capture_default_str();
  app.add_option("-a,--average", a->average, "time reported: 0 rank 0, 1 average over ranks, 2 min, 3 max")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  app.add_option("-z,--blocking", a->blocking,
                 "1: barrier after every call (timed); 3: barrier after every iteration of -m calls, not timed; "
                 "0, 2: none")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  app.add_option("-T,--timeout", a->timeout_s,
                 "seconds the whole run may take, then ranks are killed (0: self-launch "
                 "default 600, none under an external launcher)")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("-J,--json,--output_file", a->json, "write results as JSON to this file (rank 0)");
  app.add_flag("-v,--verbose", a->verbose, "print hicoll statistics (paths, inter/intra bytes)");
  app.add_option("--reps", a->reps,
                 "repeat each timing this many times, interleaving the variants, and report "
                 "the median")
      ->capture_default_str()
      ->check(kPositive);

  // nccl-tests' remaining flags.
  int nthreads = 1, parallel_init = 0, stream_null = 0, cudagraph = 0, local_register = 0, cta_policy = -1,
      device_impl = 0, device_ctas = 16;
  app.add_option("-t,--nthreads", nthreads, "threads per process: 1 (each rank is a process)")->capture_default_str();
  app.add_option("-g,--ngpus", a->ngpus,
                 "GPUs per thread, 0 or 1: agbench times host buffers whatever this says (the device path's "
                 "benchmark is tests/gpu/gpu_bench)")
      ->check(kNonNegative);
  app.add_option("-m,--agg_iters", a->agg_iters, "calls per timed iteration; the time is per call")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("-N,--run_cycles", a->run_cycles, "run the whole sweep this many times, printing each")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  app.add_option("-p,--parallel_init", parallel_init, "0/1: no effect (one thread per process)")
      ->check(CLI::Range(0, 1));
  app.add_option("-y,--stream_null", stream_null, "0/1: no effect (host calls take no stream)")
      ->check(CLI::Range(0, 1));
  app.add_option("-C,--report_cputime", a->report_cputime,
                 "0/1: label the time column cputime (a host call is complete when it returns: the same time)");
  app.add_option("-S,--report_timestamps", a->report_timestamps, "0/1: end each row with the time it was printed");
  app.add_option("-M,--memory", a->memory_report, "0/1: after the run, the ranks' peak resident memory");
  app.add_option("-u,--unalign", a->unalign, "the buffers start this many elements past a page (cache-line) boundary")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  app.add_option("-R,--local_register", local_register,
                 "0: heap buffers; 2 (symmetric memory): node memory, as --mem node; 1: refused (hicoll has no "
                 "registration)")
      ->check(CLI::Range(0, 2));
  app.add_option("-G,--cudagraph", cudagraph, "0 only (host calls are not captured)");
  app.add_option("-x,--cta_policy", cta_policy, "unset only (GPU)");
  app.add_option("-D,--device_implementation", device_impl, "0 only (GPU)");
  app.add_option("-V,--device_cta_count", device_ctas, "16 only (GPU)");
  app.add_option("-I,--per_iter_timing", a->per_iter,
                 "0/1: also time every iteration (its slowest rank); i_min, i_max, i_p99 and i_cv% after each "
                 "placement, every iteration in the JSON")
      ->check(CLI::Range(0, 1));
  app.add_option("-K,--per_iter_skip", a->per_iter_skip, "leading iterations of each timing left out of -I's figures")
      ->capture_default_str()
      ->check(kNonNegative);

  auto* np =
      app.add_option("--np", a->np, "ranks to self-launch (no launcher)")->capture_default_str()->check(kPositive);
  auto* nodes = app.add_option("--nodes", a->nodes, "emulated nodes (HICOLL_TOPO_NODE labels)")
                    ->capture_default_str()
                    ->check(kPositive);
  app.add_option("--layout", layout, "rank placement on nodes")
      ->capture_default_str()
      ->check(CLI::IsMember({"contiguous", "interleaved"}));
  app.add_option("--node-rank", a->node_rank,
                 "launch only this node's ranks (one agbench per node, e.g. per network "
                 "namespace); needs --master-addr and --master-port")
      ->check(kNonNegative);
  app.add_option("--master-addr", a->master_addr, "rendezvous address (rank 0's node)")->capture_default_str();
  app.add_option("--master-port", a->master_port, "rendezvous port (0: a free one)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--algo", a->algo, "hicoll path: sets HICOLL_ALGO")->check(CLI::IsMember({"hier", "ring"}));
  std::string mem = "heap";
  auto* mem_opt = app.add_option("--mem", mem,
                                 "where the measured buffers live: heap (private memory) or node (hcMemAlloc: "
                                 "node memory, read by the node's ranks where it lies; every variant uses them)")
                      ->capture_default_str()
                      ->check(CLI::IsMember({"heap", "node"}));
  app.add_option("--quant", a->quant_block,
                 "also measure hicoll-int8, hcAllGatherQuantized / hcReduceScatterQuantized "
                 "(sum, avg) with this many elements per scale (float types; checked against "
                 "the format's error bound), side by side with the exact call")
      ->check(CLI::Range(size_t{1}, size_t{1} << 24));
  app.add_option("--baseline", baselines,
                 "side by side: mpi (Open MPI on the same ranks), ring (hicoll flat ring), hier "
                 "(hicoll's fixed rules, HICOLL_ALGO=hier, against the model's auto), memcpy (single-core memcpy "
                 "bandwidth); repeat or comma-separate")
      ->delimiter(',')
      ->check(CLI::IsMember({"mpi", "ring", "hier", "memcpy"}));
  app.add_option("--mpirun", a->mpirun, "mpirun used to self-launch the MPI baseline")->capture_default_str();
  app.add_option("--mpirun-args", a->mpirun_args,
                 "extra mpirun arguments for the self-launched MPI baseline (e.g. '--mca "
                 "coll_han_priority 100')");

  try {
    app.parse(argc, av);
    for (const Refused& r :
         {Refused{nthreads, 1, "-t", "each rank is a process: run more ranks (--np, or the launcher's count)"},
          Refused{a->ngpus > 1 ? a->ngpus : 0, 0, "-g",
                  "each rank is a process with one buffer (nccl-tests' one GPU): run more ranks (--np, or the "
                  "launcher's count)"},
          Refused{cudagraph, 0, "-G", "host calls are not captured in CUDA graphs"},
          Refused{cta_policy, -1, "-x", "a GPU setting"}, Refused{device_impl, 0, "-D", "a GPU setting"},
          Refused{device_ctas, 16, "-V", "a GPU setting"},
          Refused{local_register == 1, 0, "-R 1",
                  "hicoll has no buffer registration (its single-copy reads need none); -R 2 or --mem node "
                  "puts the buffers in node memory"}})
      if (r.value != r.allowed) throw CLI::ValidationError(r.flag, std::to_string(r.value) + ": " + r.why);
    if (a->per_iter && a->per_iter_skip >= a->iters)
      throw CLI::ValidationError("-K", "skips every iteration of -n " + std::to_string(a->iters));
    if (local_register == 2 && mem_opt->count() && mem == "heap")
      throw CLI::ValidationError("-R 2", "asks for node memory, --mem heap for the heap");
    a->node_memory = mem == "node" || local_register == 2;
    a->calibrate = app.got_subcommand("calibrate") || calibrate_flag;
    if (app.get_subcommands().empty() && !calibrate_flag)
      throw CLI::RequiredError(
          "a subcommand (allgather, reducescatter, allreduce, broadcast, alltoall, sendrecv or calibrate)");
    if (calibrate_flag && !app.get_subcommands().empty() && !app.got_subcommand("calibrate"))
      throw CLI::ValidationError("--calibrate",
                                 "calibrates; it does not go with " + app.get_subcommands()[0]->get_name());
    for (const char* c : colls) {
      if (!app.got_subcommand(c)) continue;
      std::string name = c;
      a->coll = name == "allgather"       ? Coll::AllGather
                : name == "reducescatter" ? Coll::ReduceScatter
                : name == "allreduce"     ? Coll::AllReduce
                : name == "alltoall"      ? Coll::AllToAll
                : name == "sendrecv"      ? Coll::SendRecv
                                          : Coll::Broadcast;
    }
    a->min_bytes = parseBytes(b);
    if (!ib.empty()) a->iters_bytes = parseBytes(ib);
    a->max_bytes = parseBytes(e);
    a->step_bytes = parseBytes(i);
    if (a->min_bytes > a->max_bytes) throw CLI::ValidationError("-b/-e", "minbytes " + b + " > maxbytes " + e);
    if (a->step_factor <= 1 && a->step_bytes == 0)
      throw CLI::ValidationError("-i", "step 0 with factor 1 would never end");
    a->types.clear();
    if (d == "all") {
      a->types = allTypes();
    } else {
      const TypeDesc* t = findType(d);
      if (!t) throw CLI::ValidationError("-d", "unknown datatype '" + d + "'");
      a->types.push_back(*t);
    }
    a->ops.clear();
    if (!collReduces(a->coll)) {
      a->ops.push_back(kOpNone);
    } else if (o == "all") {
      a->ops = allOps();
    } else {
      a->ops.push_back(findOp(o));
    }
    a->layout = layout == "interleaved" ? hicoll::launch::Layout::Interleaved : hicoll::launch::Layout::Contiguous;
    a->nodes_given = nodes->count() > 0;
    a->np_given = np->count() > 0;
    if (a->nodes > a->np && a->nodes_given && np->count() > 0)
      throw CLI::ValidationError("--nodes", "more nodes than ranks");
    for (const std::string& s : baselines) {
      Baseline v = s == "mpi"    ? Baseline::Mpi
                   : s == "ring" ? Baseline::Ring
                   : s == "hier" ? Baseline::Hier
                                 : Baseline::Memcpy;
      if (!a->has(v)) a->baselines.push_back(v);
    }
    if (a->quant_block && a->coll != Coll::AllGather && a->coll != Coll::ReduceScatter)
      throw CLI::ValidationError("--quant", "only AllGather and ReduceScatter have a quantized form");
    if (a->has(Baseline::Ring) && a->algo == "ring")
      throw CLI::ValidationError("--baseline ring", "the main path is already the ring");
    if (a->has(Baseline::Hier) && a->algo == "hier")
      throw CLI::ValidationError("--baseline hier", "the main path is already hier");
    if (a->node_rank >= 0 && a->master_port == 0)
      throw CLI::ValidationError("--node-rank", "needs --master-port (and --master-addr)");
  } catch (const CLI::ParseError& err) {
    *exit_code = app.exit(err);
    return false;
  } catch (const std::exception& err) {
    std::fprintf(stderr, "agbench: %s\n", err.what());
    *exit_code = 2;
    return false;
  }
  for (int k = 0; k < given; ++k) a->argv.emplace_back(argv[k]);
  return true;
}

}  // namespace agbench
