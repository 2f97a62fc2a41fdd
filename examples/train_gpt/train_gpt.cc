// train_gpt: trains a small GPT-style decoder on a byte-level corpus through hicoll's sharded
// parameter layer (MiCS: partition groups of --sdp-degree ranks, replication across them).
//
//   train_gpt --np 4 --nodes 2 --sdp-degree 2 --steps 30 --seed 7   self-launched, 2 "nodes"
//   torchrun --nproc-per-node 4 train_gpt --sdp-degree 2 ...        under a launcher
//   train_gpt --reference --steps 30 --seed 7                       plain libtorch, no hicoll
//
// Every rank takes its slice of the same global batch and the gradient is the mean over the
// global batch, so the loss curve does not depend on the world size or the degree. Rank 0
// prints one JSON line per step and a summary.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data.h"
#include "hicoll/hicoll.h"
#include "hicoll/sharded.hpp"
#include "launch/launch.h"
#include "model.h"

namespace sh = hicoll::sharded;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace train_gpt {
namespace {

struct Args {
  int np = 1, nodes = 1;
  std::string layout = "contiguous";
  int launch_timeout_s = 600;
  int node_rank = -1;  // one train_gpt per node (network namespaces): this node's ranks only
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  long steps = 30;
  uint64_t seed = 1;
  int sdp_degree = 1;
  std::string precision = "fp32";
  std::string data, checkpoint_dir, resume;
  long save_every = 0;
  size_t bucket = 500000000;
  size_t persistence = 1000;  // the seed's 1e6 would replicate every tensor of this tiny model
  size_t max_live = 1000000000;
  bool hierarchical = true;
  bool quantized_allgather = false;
  bool quantized_reducescatter = false;
  size_t quant_block = 256;
  double clip = 1.0;
  int grad_accum = 1, batch = 16;
  GptConfig model;
  double lr = 2e-3, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double loss_scale = 65536.0;
  int threads = 1;
  bool reference = false;
};

at::ScalarType torchType(sh::DType t) {
  switch (t) {
    case sh::DType::Float32: return torch::kFloat32;
    case sh::DType::BFloat16: return torch::kBFloat16;
    case sh::DType::Float16: return torch::kFloat16;
  }
  return torch::kFloat32;
}

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

long maxRssKb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

// Rows [row0, row0+rows) of the global batch of (step, micro): tokens and next-byte targets.
std::pair<torch::Tensor, torch::Tensor> makeBatch(const Args& a, const std::vector<uint8_t>& corpus, long step,
                                                  int micro, int row0, int rows) {
  const int T = a.model.ctx;
  auto starts = batchStarts(a.seed, step, micro, a.batch, corpus.size(), T);
  auto x = torch::empty({rows, T}, torch::kInt64), y = torch::empty({rows, T}, torch::kInt64);
  auto xa = x.accessor<int64_t, 2>(), ya = y.accessor<int64_t, 2>();
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < T; ++t) {
      xa[r][t] = corpus[starts[row0 + r] + t];
      ya[r][t] = corpus[starts[row0 + r] + t + 1];
    }
  return {x, y};
}

json stepLine(long step, double loss, double tokens, double dt) {
  return {{"step", step}, {"loss", loss}, {"tokens_per_s", tokens / dt}, {"step_s", dt}};
}

void emit(const json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// ---- the sharded run -----------------------------------------------------------------------

// The libtorch adapter: the layer's buffers seen as tensors (no copies).
class TorchUnits {
 public:
  TorchUnits(sh::ShardedParams& sp, at::ScalarType dt) : sp_(sp), dt_(dt) {}

  std::vector<torch::Tensor> params(int u, bool leaves) {
    const sh::UnitSpec& s = sp_.spec(u);
    std::vector<torch::Tensor> P;
    for (size_t p = 0; p < s.params.size(); ++p) {
      auto t = torch::from_blob(const_cast<void*>(sp_.param(u, static_cast<int>(p))), s.params[p].shape,
                                torch::TensorOptions().dtype(dt_));
      if (leaves) t.requires_grad_(true);
      P.push_back(t);
    }
    return P;
  }

  void storeGrads(int u, const std::vector<torch::Tensor>& P) {
    const sh::UnitSpec& s = sp_.spec(u);
    for (size_t p = 0; p < P.size(); ++p) {
      if (!P[p].grad().defined()) continue;  // the layer's buffer starts at zero
      torch::from_blob(sp_.grad(u, static_cast<int>(p)), s.params[p].shape, torch::TensorOptions().dtype(dt_))
          .copy_(P[p].grad());
    }
  }

 private:
  sh::ShardedParams& sp_;
  at::ScalarType dt_;
};

// One micro-batch. Forward unit by unit without autograd, keeping only unit inputs; backward
// unit by unit in reverse, recomputing each unit from its input while it is gathered. So a
// unit's parameters are alive only while it runs (plus the one prefetched), and its gradients
// are handed to the ReduceScatter as soon as its backward ends.
double microStep(sh::ShardedParams& sp, TorchUnits& tu, const Args& a, const torch::Tensor& tokens,
                 const torch::Tensor& targets, at::ScalarType dt) {
  const int U = sp.numUnits(), head = U - 1;
  std::vector<torch::Tensor> inputs(U);  // inputs[u]: activation entering unit u (u >= 1)
  {
    torch::NoGradGuard no_grad;
    torch::Tensor h;
    for (int u = 0; u < head; ++u) {
      sp.unshard(u);
      sp.prefetch(u + 1);
      auto P = tu.params(u, false);
      h = u == 0 ? embedForward(P, tokens).to(dt) : blockForward(P, h, a.model.heads);
      inputs[u + 1] = h;
      sp.reshard(u);
    }
  }
  sp.unshard(head);
  sp.prefetch(head - 1);
  auto x = inputs[head].detach().requires_grad_(true);
  auto P = tu.params(head, true);
  auto loss = headLoss(P, x, targets);
  (loss * sp.lossScale()).backward();
  tu.storeGrads(head, P);
  sp.reduceGrad(head);
  sp.reshard(head);
  torch::Tensor g = x.grad();
  for (int u = head - 1; u >= 0; --u) {
    sp.unshard(u);
    if (u > 0) sp.prefetch(u - 1);
    P = tu.params(u, true);
    if (u == 0) {
      embedForward(P, tokens).to(dt).backward(g);
    } else {
      auto xin = inputs[u].detach().requires_grad_(true);
      blockForward(P, xin, a.model.heads).backward(g);
      g = xin.grad();
    }
    tu.storeGrads(u, P);
    sp.reduceGrad(u);
    sp.reshard(u);
    inputs[u] = torch::Tensor();
  }
  sp.finishMicroStep();
  return loss.item<double>();
}

int shardedMain(const Args& a, const std::vector<uint8_t>& corpus, const std::string& corpus_desc) {
  torch::set_num_threads(a.threads);
  hcComm_t world = nullptr;
  if (hcResult_t r = hcCommInitFromEnv(&world); r != hcSuccess)
    throw std::runtime_error(std::string("hcCommInitFromEnv failed: ") + hcGetErrorString(r) + ": " +
                             hcGetLastError(nullptr));
  std::unique_ptr<hcComm, decltype(&hcCommDestroy)> world_guard(world, &hcCommDestroy);
  int rank = 0, W = 1;
  hcCommUserRank(world, &rank);
  hcCommCount(world, &W);
  if (a.batch % W != 0)
    throw std::runtime_error("--batch " + std::to_string(a.batch) + " is not a multiple of the " + "world size " +
                             std::to_string(W) + ": every rank takes an equal slice of the global batch");

  sh::Options o;
  o.sharded_data_parallel_degree = a.sdp_degree;
  o.sdp_reduce_bucket_size = a.bucket;
  o.sdp_param_persistence_threshold = a.persistence;
  o.sdp_max_live_parameters = a.max_live;
  o.sdp_hierarchical_allgather = a.hierarchical;
  o.sdp_quantized_allgather = a.quantized_allgather;
  o.sdp_quantized_reducescatter = a.quantized_reducescatter;
  o.sdp_quant_block = a.quant_block;
  o.sdp_gradient_clipping = a.clip;
  o.compute_dtype = sh::parseDType(a.precision);
  o.gradient_accumulation_steps = a.grad_accum;
  o.beta1 = a.beta1;
  o.beta2 = a.beta2;
  o.eps = a.eps;
  o.weight_decay = a.weight_decay;
  o.initial_loss_scale = a.loss_scale;
  const auto units = gptUnits(a.model);
  auto sp = sh::ShardedParams::create(world, units, o);
  sp->initialize([&](int u, int p, float* out, size_t n) { initParam(a.model, units, u, p, a.seed, out, n); });

  long first = 1;
  if (!a.resume.empty()) {
    json extra = json::parse(sp->load(a.resume));
    if (extra.value("seed", a.seed) != a.seed)
      throw std::runtime_error("the checkpoint in " + a.resume + " was trained with --seed " +
                               std::to_string(extra.value("seed", 0ULL)) + ", this run has --seed " +
                               std::to_string(a.seed) + " (the data order would differ)");
    first = extra.at("step").get<long>() + 1;
  }

  const at::ScalarType dt = torchType(o.compute_dtype);
  TorchUnits tu(*sp, dt);
  const int rows = a.batch / W;
  const double tokens_per_step = static_cast<double>(a.batch) * a.model.ctx * a.grad_accum;
  if (rank == 0)
    emit({{"config",
           {{"world", W},
            {"sdp_degree", a.sdp_degree},
            {"precision", a.precision},
            {"corpus", corpus_desc},
            {"corpus_bytes", corpus.size()},
            {"layers", a.model.layers},
            {"width", a.model.width},
            {"heads", a.model.heads},
            {"ctx", a.model.ctx},
            {"batch", a.batch},
            {"grad_accum", a.grad_accum},
            {"first_step", first}}}});

  double sum_tok_s = 0, sum_dt = 0, sum_busy = 0, sum_wait = 0, last_loss = 0;
  long timed = 0;
  for (long step = first; step <= a.steps; ++step) {
    const auto t0 = Clock::now();
    const sh::Stats s0 = sp->stats();
    double loss = 0;
    for (int m = 0; m < a.grad_accum; ++m) {
      auto [x, y] = makeBatch(a, corpus, step, m, rank * rows, rows);
      loss += microStep(*sp, tu, a, x, y, dt) / a.grad_accum;
    }
    const sh::StepResult res = sp->step(a.lr);
    double loss_sum = loss;
    sp->allReduceSum(&loss_sum, 1);
    const double dts = seconds(t0, Clock::now());
    const sh::Stats s1 = sp->stats();
    last_loss = loss_sum / W;
    if (step > first || a.steps == first) {  // the first step includes warm-up
      sum_tok_s += tokens_per_step / dts;
      sum_dt += dts;
      sum_busy += s1.comm_busy_s - s0.comm_busy_s;
      sum_wait += s1.comm_wait_s - s0.comm_wait_s;
      ++timed;
    }
    if (rank == 0) {
      json j = stepLine(step, last_loss, tokens_per_step, dts);
      j["grad_norm"] = res.grad_norm;
      j["comm_s"] = s1.comm_busy_s - s0.comm_busy_s;
      j["comm_wait_s"] = s1.comm_wait_s - s0.comm_wait_s;
      if (o.compute_dtype == sh::DType::Float16) j["loss_scale"] = res.loss_scale;
      if (res.skipped) j["skipped"] = true;
      emit(j);
    }
    const bool last = step == a.steps;
    if (!a.checkpoint_dir.empty() && (last || (a.save_every > 0 && step % a.save_every == 0)))
      sp->save(a.checkpoint_dir, json{{"step", step}, {"seed", a.seed}, {"loss", last_loss}}.dump());
  }

  // Per-rank figures, gathered with one sum (each rank fills its own slots).
  const sh::Stats st = sp->stats();
  constexpr int K = 7;
  std::vector<double> v(static_cast<size_t>(W) * K, 0.0);
  double* mine = v.data() + static_cast<size_t>(rank) * K;
  mine[0] = static_cast<double>(st.state_bytes_peak);
  mine[1] = static_cast<double>(st.transient_bytes_peak);
  mine[2] = static_cast<double>(st.total_bytes_peak);
  mine[3] = static_cast<double>(st.live_params_peak);
  mine[4] = static_cast<double>(maxRssKb());
  mine[5] = st.comm_busy_s;
  mine[6] = st.comm_wait_s;
  sp->allReduceSum(v.data(), v.size());
  if (rank == 0) {
    json ranks = json::array();
    for (int r = 0; r < W; ++r) {
      const double* x = v.data() + static_cast<size_t>(r) * K;
      ranks.push_back({{"rank", r},
                       {"state_bytes_peak", x[0]},
                       {"transient_bytes_peak", x[1]},
                       {"layer_bytes_peak", x[2]},
                       {"live_params_peak", x[3]},
                       {"max_rss_kb", x[4]},
                       {"comm_busy_s", x[5]},
                       {"comm_wait_s", x[6]}});
    }
    emit({{"summary",
           {{"world", W},
            {"sdp_degree", a.sdp_degree},
            {"precision", a.precision},
            {"steps", a.steps - first + 1},
            {"final_loss", last_loss},
            {"tokens_per_s", timed ? sum_tok_s / timed : 0.0},
            {"comm_share", sum_dt > 0 ? sum_busy / sum_dt : 0.0},
            {"comm_wait_share", sum_dt > 0 ? sum_wait / sum_dt : 0.0},
            {"allgathers", st.allgathers},
            {"reducescatters", st.reducescatters},
            {"allreduces", st.allreduces},
            {"prefetches", st.prefetches},
            {"prefetches_paused", st.prefetches_paused},
            {"skipped_steps", st.skipped_steps},
            {"ranks", ranks}}}});
  }
  sp.reset();  // before the world communicator it was split from
  return 0;
}

// ---- the reference: plain libtorch, one process, no hicoll -----------------------------------

int referenceMain(const Args& a, const std::vector<uint8_t>& corpus) {
  if (a.precision != "fp32" || !a.checkpoint_dir.empty() || !a.resume.empty())
    throw std::runtime_error("--reference runs fp32 without checkpoints");
  torch::set_num_threads(a.threads);
  const auto units = gptUnits(a.model);
  std::vector<std::vector<torch::Tensor>> P(units.size());
  std::vector<torch::Tensor> all, decay, no_decay;
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t p = 0; p < units[u].params.size(); ++p) {
      auto t = torch::empty(units[u].params[p].shape, torch::kFloat32);
      initParam(a.model, units, static_cast<int>(u), static_cast<int>(p), a.seed, t.data_ptr<float>(),
                static_cast<size_t>(t.numel()));
      t.requires_grad_(true);
      P[u].push_back(t);
      all.push_back(t);
      (units[u].params[p].weight_decay ? decay : no_decay).push_back(t);
    }
  auto group = [&](std::vector<torch::Tensor> ps, double wd) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(a.lr);
    o->betas({a.beta1, a.beta2}).eps(a.eps).weight_decay(wd);
    return torch::optim::OptimizerParamGroup(std::move(ps), std::move(o));
  };
  torch::optim::AdamW opt({group(decay, a.weight_decay), group(no_decay, 0.0)}, torch::optim::AdamWOptions(a.lr));
  const double tokens_per_step = static_cast<double>(a.batch) * a.model.ctx * a.grad_accum;
  for (long step = 1; step <= a.steps; ++step) {
    const auto t0 = Clock::now();
    opt.zero_grad();
    double loss_sum = 0;
    for (int m = 0; m < a.grad_accum; ++m) {
      auto [x, y] = makeBatch(a, corpus, step, m, 0, a.batch);
      auto h = embedForward(P[0], x);
      for (size_t u = 1; u + 1 < units.size(); ++u) h = blockForward(P[u], h, a.model.heads);
      auto loss = headLoss(P.back(), h, y);
      (loss / a.grad_accum).backward();
      loss_sum += loss.item<double>() / a.grad_accum;
    }
    double norm = 0;
    if (a.clip > 0) norm = torch::nn::utils::clip_grad_norm_(all, a.clip);
    opt.step();
    json j = stepLine(step, loss_sum, tokens_per_step, seconds(t0, Clock::now()));
    j["grad_norm"] = norm;
    emit(j);
  }
  return 0;
}

}  // namespace
}  // namespace train_gpt

int main(int argc, char** argv) {
  using namespace train_gpt;
  Args a;
  CLI::App app{"Train a small GPT on a byte-level corpus through hicoll's sharded layer"};
  app.add_option("--np", a.np, "ranks to self-launch on this machine")->check(CLI::PositiveNumber);
  app.add_option("--nodes", a.nodes, "simulated nodes for --np (HICOLL_TOPO_NODE)")->check(CLI::PositiveNumber);
  app.add_option("--layout", a.layout, "rank -> node: contiguous | interleaved")
      ->check(CLI::IsMember({"contiguous", "interleaved"}));
  app.add_option("--launch-timeout", a.launch_timeout_s, "seconds before self-launched ranks are killed");
  app.add_option("--node-rank", a.node_rank,
                 "launch only this node's ranks (one train_gpt per node, e.g. per network namespace: "
                 "perf/netns_emulate.sh -a); needs --master-addr and --master-port")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr", a.master_addr, "rendezvous address (rank 0's node)");
  app.add_option("--master-port", a.master_port, "rendezvous port (0: a free one)")->check(CLI::Range(0, 65535));
  app.add_option("--steps", a.steps, "last step to run (a resumed run continues up to it)")->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "initialisation and data order");
  app.add_option("--sdp-degree,--sharded-data-parallel-degree", a.sdp_degree,
                 "sharded_data_parallel_degree: partition group size (divides the world)");
  app.add_option("--precision", a.precision, "fp32 | bf16 | fp16 (fp16 uses dynamic loss scaling)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--data", a.data, "text file (default: the fortunes corpus)");
  app.add_option("--checkpoint-dir", a.checkpoint_dir, "save a sharded checkpoint here at the end");
  app.add_option("--save-every", a.save_every, "also save every N steps");
  app.add_option("--resume", a.resume, "load this checkpoint (any degree or world size) and continue");
  app.add_option("--sdp-reduce-bucket-size", a.bucket, "elements per gradient ReduceScatter");
  app.add_option("--sdp-param-persistence-threshold", a.persistence,
                 "parameters with fewer elements are replicated, not sharded");
  app.add_option("--sdp-max-live-parameters", a.max_live, "gathered elements alive at once");
  app.add_option("--sdp-hierarchical-allgather", a.hierarchical, "true | false");
  app.add_flag("--sdp-quantized-allgather", a.quantized_allgather,
               "parameter gathers as int8 + one fp32 scale per block (hcAllGatherQuantized)");
  app.add_flag("--sdp-quantized-reducescatter", a.quantized_reducescatter,
               "gradient ReduceScatters with int8 partials across nodes (hcReduceScatterQuantized)");
  app.add_option("--sdp-quant-block", a.quant_block, "elements per scale of the quantized collectives")
      ->check(CLI::Range(size_t{1}, size_t{1} << 24));
  app.add_option("--sdp-gradient-clipping", a.clip, "global L2 norm clip (0: off)");
  app.add_option("--grad-accum", a.grad_accum, "micro-batches per step")->check(CLI::PositiveNumber);
  app.add_option("--batch", a.batch, "global batch (sequences per micro-batch)")->check(CLI::PositiveNumber);
  app.add_option("--ctx", a.model.ctx, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--layers", a.model.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--heads", a.model.heads, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--width", a.model.width, "embedding width")->check(CLI::PositiveNumber);
  app.add_option("--lr", a.lr, "AdamW learning rate");
  app.add_option("--weight-decay", a.weight_decay, "AdamW weight decay (matrices only)");
  app.add_option("--loss-scale", a.loss_scale, "initial fp16 loss scale");
  app.add_option("--threads", a.threads, "torch intra-op threads per rank")->check(CLI::PositiveNumber);
  app.add_flag("--reference", a.reference, "plain single-process libtorch run (no hicoll)");
  CLI11_PARSE(app, argc, argv);

  try {
    std::string desc;
    // Read before forking; the children share it. No torch work happens before the fork.
    const std::vector<uint8_t> corpus = loadCorpus(a.data, &desc);
    if (a.reference) return referenceMain(a, corpus);
    auto body = [&]() -> int {
      try {
        return shardedMain(a, corpus, desc);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "train_gpt: rank %s: %s\n", std::getenv("RANK") ? std::getenv("RANK") : "?", e.what());
        return 1;
      }
    };
    if (hicoll::launch::underLauncher()) return body();
    hicoll::launch::Options lo;
    lo.np = a.np;
    lo.nodes = a.nodes;
    lo.layout = a.layout == "interleaved" ? hicoll::launch::Layout::Interleaved : hicoll::launch::Layout::Contiguous;
    lo.timeout_s = a.launch_timeout_s;
    lo.node_rank = a.node_rank;
    lo.master_addr = a.master_addr;
    lo.master_port = a.master_port;
    return hicoll::launch::selfLaunch(lo, body);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 1;
  }
}
