// hicoll_info: every configuration knob with its current value (like ucc_info -caf), the
// generator of env.md (--markdown), and the table of paths with what each would cost for one
// call and which the planner takes (--algorithms, like ucc_info -A).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "base/config.h"
#include "base/error.h"
#include "base/identity.h"
#include "base/machine_figures.h"
#include "hicoll/hicoll.h"
#include "plan/paths.h"

using namespace hicoll;

static void markdown() {
  std::printf("# hicoll environment variables\n\n");
  std::printf(
      "Generated from `src/base/config_table.h` by `hicoll_info --markdown`; a test checks that\n"
      "this file and the table agree. Every value is parsed strictly: an invalid value fails\n"
      "communicator creation with a message naming the variable. Variables marked \"same on\n"
      "every rank\" are compared across ranks when a communicator is created: a difference fails\n"
      "creation on every rank, naming the variable and the ranks' values.\n\n");
  std::printf("| Variable | Type | Default | Range | Same on every rank | Description |\n|---|---|---|---|---|---|\n");
  for (const KnobInfo& k : knobTable()) {
    std::string type = knobTypeName(k.type);
    if (k.type == KnobType::Enum || k.type == KnobType::List) {
      std::string allowed = k.allowed;
      for (char& c : allowed)
        if (c == '|') c = ',';
      type += std::string(" `") + allowed + "`";
    }
    std::string range = "";
    if (k.type == KnobType::Int || k.type == KnobType::Size || k.type == KnobType::Size8K)
      range = std::to_string(k.min) + " .. " + std::to_string(k.max);
    std::printf("| `%s` | %s | `%s` | %s | %s | %s |\n", k.name, type.c_str(), *k.def ? k.def : "(empty)",
                range.c_str(), k.scope == KnobScope::Agree ? "yes" : "", k.doc);
  }
  std::printf(
      "\n## Build-time variables\n\n"
      "Read when the torch plugin is built (`pip install`: plugins/torch/CMakeLists.txt and "
      "plugins/torch/cmake/torch_flags.py), not by the library:\n\n"
      "| Variable | Meaning |\n|---|---|\n"
      "| `HICOLL_BUILD_DIR` | a CMake build directory of this repository: libhicoll.so is taken from it |\n"
      "| `HICOLL_PREFIX` | an installed prefix (include/hicoll, lib/libhicoll.so) instead |\n"
      "| `HICOLL_PLUGIN_CUDA` | 0: build the plugin without CUDA; 1: a missing CUDA toolkit is an error; "
      "auto (unset): CUDA when torch has it and a matching toolkit is usable |\n"
      "| `HICOLL_TORCH_SITE` | set by the build backend under pip's isolation: the site-packages of the "
      "environment pip installs into, whose torch the plugin is built against |\n"
      "\nCMake options: `-DHICOLL_USE_CCACHE=OFF` (compile without ccache where it is installed), "
      "`-DHICOLL_PLUGIN_PCH=OFF` (the plugin without precompiled torch headers).\n"
      "\nThe build derives CMake variables of its own from the interpreter's torch (torch_flags.py; not "
      "for users to set): `HICOLL_TORCH_VERSION`, `HICOLL_TORCH_PACKAGE_DIR`, `HICOLL_TORCH_INCLUDE_DIRS`, "
      "`HICOLL_TORCH_LIBRARY_DIR`, "
      "`HICOLL_TORCH_LIBRARIES`, `HICOLL_TORCH_CXX11_ABI`, `HICOLL_TORCH_CXX_STANDARD`, "
      "`HICOLL_PLUGIN_WITH_CUDA`, `HICOLL_PLUGIN_CUDA_WHY`, `HICOLL_PLUGIN_CUDA_HOME`.\n");
  std::printf(
      "\nThe sharded-parameter layer's knobs (`sharded_data_parallel_degree`, `sdp_*`) are\n"
      "fields of `hicoll::sharded::Options` and flags of the training examples, not\n"
      "environment variables.\n");
}

namespace {

struct CallSpec {
  std::string coll;  // empty: print the table only
  size_t bytes = 1 << 20;
  int nodes = 2, local = 2;
  std::string dtype = "float32";
  size_t quant_block = 0;
  bool device = false;
  int host_ranks = 0, cores = 0;  // 0: one host per node; this machine's cores
};

std::string collsOf(uint32_t mask) {
  std::string out;
  for (int c = 0; c < hcNumColls; ++c)
    if (mask & (1u << c)) out += std::string(out.empty() ? "" : ",") + collName(static_cast<hcColl_t>(c));
  return out;
}

int algorithms(const CallSpec& spec) {
  if (spec.coll.empty()) {
    std::printf("%-18s %-7s %-12s %-44s %s\n", "path", "buffers", "model", "collectives", "what");
    for (const PathInfo& p : pathTable())
      std::printf("%-18s %-7s %-12s %-44s %s\n", p.name,
                  p.host && p.device ? "both"
                  : p.host           ? "host"
                                     : "device",
                  p.modelled ? algoName(p.algo) : "-", collsOf(p.colls).c_str(), p.what);
    std::printf("\nFor one call: hicoll_info --algorithms --coll allgather --bytes 64M --nodes 2 --ranks-per-node 2\n");
    return 0;
  }
  hcColl_t coll = hcNumColls;
  for (int c = 0; c < hcNumColls; ++c) {
    std::string name = collName(static_cast<hcColl_t>(c));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (name == spec.coll) coll = static_cast<hcColl_t>(c);
  }
  static const std::map<std::string, hcDataType_t> dtypes = {
      {"int8", hcInt8},       {"uint8", hcUint8},       {"int32", hcInt32},     {"int64", hcInt64},
      {"float16", hcFloat16}, {"bfloat16", hcBfloat16}, {"float32", hcFloat32}, {"float64", hcFloat64}};
  HC_CHECK(coll != hcNumColls, hcInvalidArgument,
           "--coll {}: not a collective (allgather, reducescatter, allreduce, "
           "broadcast, barrier, alltoall)",
           spec.coll);
  HC_CHECK(dtypes.count(spec.dtype), hcInvalidArgument, "--dtype {}: not a datatype", spec.dtype);
  Identity id;
  std::vector<std::string> labels, hosts;
  for (int n = 0; n < spec.nodes; ++n)
    for (int l = 0; l < spec.local; ++l) {
      labels.push_back(fmt::format("n{}", n));
      hosts.push_back(spec.host_ranks ? "h" : fmt::format("h{}", n));
    }
  id.nranks = spec.nodes * spec.local;
  id.topo = Topology::build(labels, hosts);
  PlanContext ctx;
  ctx.cfg = Config::fromEnv();
  const std::string model_file = ctx.cfg.str(Knob::ModelFile);
  ctx.model = model_file.empty() ? defaultFigures(ctx.cfg.str(Knob::OfiProvider)) : loadFigures(model_file);
  ctx.host_ranks = spec.host_ranks ? spec.host_ranks : spec.local;
  ctx.host_cores = spec.cores ? spec.cores : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ctx.ring_cross = 1;  // ranks in node order: the ring leaves each node once
  if (ctx.cfg.algoAuto() && ctx.cfg.isDefault(Knob::NetChunkBytes))
    ctx.net_chunk_cap = static_cast<size_t>(std::max(ctx.cfg.num(Knob::NetChunkBytes), ctx.cfg.num(Knob::ChunkBytes)));
  CollArgs a;
  a.coll = coll;
  a.dtype = dtypes.at(spec.dtype);
  const size_t e = hcTypeSize(a.dtype), W = static_cast<size_t>(id.nranks);
  const bool per_rank = coll == hcCollAllGather || coll == hcCollReduceScatter;
  a.count = per_rank ? spec.bytes / e / W : spec.bytes / e;
  a.quant.block = spec.quant_block;
  a.quant.dtype = a.dtype;
  a.quant.count = a.count;
  Capabilities caps;
  caps.device = spec.device;
  CollPlan plan;
  const std::vector<PathVerdict> verdicts = explainCall(id, ctx, a, caps, &plan);
  std::printf("# %s of %zu bytes (%s, %zu per rank), %d node(s) x %d rank(s), %s buffers\n", collName(coll),
              per_rank ? a.count * e * W : a.count * e, spec.dtype.c_str(), a.count * e, spec.nodes, spec.local,
              spec.device ? "device" : "host");
  std::printf("# model figures: %s; %d rank(s) share %d core(s) per host; chunk %zu bytes, window %zu\n",
              ctx.model.source.c_str(), ctx.host_ranks, ctx.host_cores, plan.chunk_bytes, plan.net_window);
  std::printf("%-2s %-18s %-8s %13s %-8s %s\n", "", "path", "applies", "predicted_us", "bound", "why not");
  for (const PathVerdict& v : verdicts)
    std::printf("%-2s %-18s %-8s %13s %-8s %s\n", v.chosen ? "*" : "", v.path->name, v.why_not.empty() ? "yes" : "no",
                v.predicted ? fmt::format("{:.1f}", v.prediction.total() * 1e6).c_str() : "-",
                v.predicted ? v.prediction.bound() : "-", v.why_not.c_str());
  const PathVerdict* chosen = nullptr;
  for (const PathVerdict& v : verdicts)
    if (v.chosen) chosen = &v;
  if (chosen && chosen->path->id == PathId::Quantized)
    std::printf("# the plan takes quantized (its images are gathered piece by piece by exact calls)\n");
  else
    std::printf("# the plan takes %s (rule: %s)%s%s\n", chosen ? chosen->path->name : "?", ruleName(plan.rule),
                plan.reason.empty() ? "" : ": ", plan.reason.c_str());
  if (plan.path == hcPathHierarchical && plan.block_bytes)
    std::printf(
        "# pieces: %zu of up to %zu bytes per rank (a block larger than the scratch or sort buffer streams "
        "through them)\n",
        plan.pieces, plan.piece_bytes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "hicoll_info: every knob with its current value and where it came from (no options); env.md "
      "(--markdown); the paths and, for one call, what each would cost and which the plan takes "
      "(--algorithms)"};
  bool md = false, algos = false;
  CallSpec spec;
  app.add_flag("--markdown", md, "print env.md (the knob table as Markdown)");
  app.add_flag("--algorithms,-A", algos, "print the table of paths; with --coll, the verdict for one call");
  app.add_option("--coll", spec.coll, "allgather, reducescatter, allreduce, broadcast, barrier or alltoall");
  app.add_option("--bytes", spec.bytes, "nccl-tests' size of the call (AllGather: the whole output), e.g. 64M")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--nodes", spec.nodes, "nodes")->check(CLI::PositiveNumber);
  app.add_option("--ranks-per-node", spec.local, "ranks per node")->check(CLI::PositiveNumber);
  app.add_option("--dtype", spec.dtype, "int8, uint8, int32, int64, float16, bfloat16, float32, float64");
  app.add_option("--quant-block", spec.quant_block, "a quantized call (elements per scale)");
  app.add_flag("--device", spec.device, "device buffers");
  app.add_option("--host-ranks", spec.host_ranks, "ranks sharing one host's cores (emulated nodes: all)");
  app.add_option("--cores", spec.cores, "cores of a host (default: this machine's)");
  CLI11_PARSE(app, argc, argv);
  if (md) {
    markdown();
    return 0;
  }
  if (algos) {
    try {
      return algorithms(spec);
    } catch (const Error& e) {
      std::fprintf(stderr, "hicoll_info: %s\n", e.what());
      return 2;
    }
  }
  int version = 0;
  hcGetVersion(&version);
  std::printf("# hicoll %d.%d.%d\n", version / 10000, version / 100 % 100, version % 100);
  int rc = 0;
  for (const KnobInfo& k : knobTable()) {
    const char* env = std::getenv(k.name);
    std::string value = env ? env : k.def;
    std::string status = env ? "set" : "default";
    try {
      Config::from([&](const char* name) -> const char* { return std::string(name) == k.name ? env : nullptr; });
    } catch (const Error& e) {
      status = std::string("INVALID: ") + e.what();
      rc = 1;
    }
    std::printf("%s=%s  # %s\n", k.name, value.c_str(), status.c_str());
  }
  return rc;
}
