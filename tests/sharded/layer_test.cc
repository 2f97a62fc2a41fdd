// Tier 3: the sharded layer on 2-4 forked ranks over 1-2 simulated nodes, against references
// computed in double on every rank. Ranks check and throw; the parent sees exit statuses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "hicoll/hicoll.h"
#include "hicoll/sharded.hpp"
#include "launch/launch.h"
#include "sharded/convert.h"

namespace sh = hicoll::sharded;
namespace fs = std::filesystem;

namespace {

#define REQUIRE(cond, ...)                                                                               \
  do {                                                                                                   \
    if (!(cond))                                                                                         \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #cond " " + \
                               std::string(__VA_ARGS__));                                                \
  } while (0)

// Runs body(comm, rank) on np forked ranks over `nodes` simulated nodes; 0 when all passed.
int onRanks(int np, int nodes, const std::function<void(hcComm_t, int)>& body) {
  hicoll::launch::Options o;
  o.np = np;
  o.nodes = nodes;
  o.timeout_s = 180;
  return hicoll::launch::selfLaunch(o, [&]() -> int {
    const int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "-1");
    hcComm_t comm = nullptr;
    try {
      const hcResult_t r = hcCommInitFromEnv(&comm);
      if (r != hcSuccess)
        throw std::runtime_error(std::string("hcCommInitFromEnv: ") + hcGetErrorString(r) + ": " +
                                 hcGetLastError(nullptr));
      body(comm, rank);
      hcCommDestroy(comm);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      if (comm) hcCommAbort(comm);
      return 1;
    }
  });
}

// Units with uneven sizes, small (persistent) parameters and a unit without sharded ones.
std::vector<sh::UnitSpec> testUnits() {
  return {
      {"u0", {{"w", {37, 11}}, {"b", {11}, false}}},
      {"u1", {{"x", {5}}, {"y", {64, 3}}, {"z", {101}}}},
      {"u2", {{"small", {7}, false}}},
      {"u3", {{"big", {1000}}}},
  };
}
constexpr size_t kThreshold = 20;

double initValue(int u, int p, size_t i) {
  return std::sin(0.1 * i + u + 0.37 * p);
}
// Gradient that rank r contributes in micro-batch m (rank_free: the same on every rank).
double gradValue(int r, int m, int u, int p, size_t i, bool rank_free = false) {
  if (rank_free) r = 0;
  return std::cos(0.05 * i + r * 0.3 + m * 0.7 + u + p) * (1 + r);
}

sh::Options baseOptions(int degree) {
  sh::Options o;
  o.sharded_data_parallel_degree = degree;
  o.sdp_param_persistence_threshold = kThreshold;
  o.weight_decay = 0.1;
  o.beta2 = 0.95;
  o.sdp_gradient_clipping = 1.0;
  return o;
}

void initialize(sh::ShardedParams& sp) {
  sp.initialize([](int u, int p, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(initValue(u, p, i));
  });
}

// One micro-batch: every unit's gradients written (in the compute dtype) and reduced.
void writeGrads(sh::ShardedParams& sp, int rank, int micro, bool rank_free = false) {
  const sh::DType dt = sp.options().compute_dtype;
  for (int u = sp.numUnits() - 1; u >= 0; --u) {
    for (size_t p = 0; p < sp.spec(u).params.size(); ++p) {
      const size_t n = sp.spec(u).params[p].numel();
      std::vector<float> g(n);
      for (size_t i = 0; i < n; ++i)
        g[i] = static_cast<float>(gradValue(rank, micro, u, static_cast<int>(p), i, rank_free) * sp.lossScale());
      sh::fromFloat(dt, g.data(), sp.grad(u, static_cast<int>(p)), n);
    }
    sp.reduceGrad(u);
  }
  sp.finishMicroStep();
}

uint64_t calls(hcComm_t c, hcColl_t coll, hcPath_t path) {
  hcStats s = HC_STATS_INITIALIZER;
  if (hcCommGetStats(c, &s) != hcSuccess) throw std::runtime_error("hcCommGetStats failed");
  return s.coll[coll].calls[path];
}
uint64_t allCalls(hcComm_t c, hcColl_t coll) {
  return calls(c, coll, hcPathHierarchical) + calls(c, coll, hcPathRing) + calls(c, coll, hcPathFallback);
}

std::string where(int u, int p, size_t i) {
  return "unit " + std::to_string(u) + " param " + std::to_string(p) + " [" + std::to_string(i) + "]";
}

struct Case {
  int degree;
  sh::DType dtype;
  bool hierarchical;
  size_t bucket;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "degree " << c.degree << " " << sh::dtypeName(c.dtype) << (c.hierarchical ? " hierarchical" : " ring")
      << " bucket " << c.bucket;
}

std::string caseName(const testing::TestParamInfo<Case>& i) {
  return "degree" + std::to_string(i.param.degree) + "_" + sh::dtypeName(i.param.dtype) +
         (i.param.hierarchical ? "_hier" : "_ring") + "_bucket" + std::to_string(i.param.bucket);
}

class Layer : public testing::TestWithParam<Case> {};

// Gather returns the initial values; two accumulated micro-batches reduce to the global mean
// (replication AllReduce only at the boundary); one step equals clip + AdamW in double.
TEST_P(Layer, GatherReduceAndStepMatchTheReference) {
  const Case c = GetParam();
  const int W = 4, A = 2;
  const int rc = onRanks(W, 2, [&](hcComm_t world, int rank) {
    sh::Options o = baseOptions(c.degree);
    o.compute_dtype = c.dtype;
    o.sdp_hierarchical_allgather = c.hierarchical;
    o.sdp_reduce_bucket_size = c.bucket;
    o.gradient_accumulation_steps = A;
    if (c.dtype == sh::DType::Float16) o.initial_loss_scale = 1024;  // |grad| * scale < 65504
    auto sp = sh::ShardedParams::create(world, testUnits(), o);
    REQUIRE(sp->partitionRank() == rank % c.degree && sp->replicationRank() == rank / c.degree);
    initialize(*sp);
    const bool fp32 = c.dtype == sh::DType::Float32;
    for (int u = 0; u < sp->numUnits(); ++u) {
      sp->unshard(u);
      sp->prefetch(u + 1 < sp->numUnits() ? u + 1 : 0);
      for (size_t p = 0; p < sp->spec(u).params.size(); ++p) {
        const size_t n = sp->spec(u).params[p].numel();
        std::vector<float> got(n);
        sh::toFloat(c.dtype, sp->param(u, static_cast<int>(p)), got.data(), n);
        for (size_t i = 0; i < n; ++i) {
          // Gathering copies: exactly the initial value rounded to the compute dtype.
          const float init = static_cast<float>(initValue(u, static_cast<int>(p), i));
          uint32_t tmp = 0;
          float want = 0;
          sh::fromFloat(c.dtype, &init, &tmp, 1);
          sh::toFloat(c.dtype, &tmp, &want, 1);
          REQUIRE(got[i] == want, where(u, static_cast<int>(p), i));
        }
      }
      sp->reshard(u);
    }
    sp->reshard(0);  // the wrapped-around prefetch
    if (c.degree > 1) {
      hcComm_t ag = sp->communicator(sh::ShardedParams::Group::PartitionAllGather);
      const uint64_t ring = calls(ag, hcCollAllGather, hcPathRing);
      const uint64_t hier = calls(ag, hcCollAllGather, hcPathHierarchical);
      if (c.hierarchical) REQUIRE(hier > 0 && ring == 0, "hierarchical AllGather expected");
      else REQUIRE(ring > 0 && hier == 0, "sdp_hierarchical_allgather=false must use the ring");
    }

    hcComm_t repl = sp->communicator(sh::ShardedParams::Group::Replication);
    for (int m = 0; m < A; ++m) writeGrads(*sp, rank, m);
    REQUIRE(allCalls(repl, hcCollAllReduce) == 0, "replication AllReduce before the boundary");
    sp->synchronizeGradients();
    if (W / c.degree > 1) REQUIRE(allCalls(repl, hcCollAllReduce) > 0);

    // Reference: the mean over ranks and micro-batches, clipped, AdamW, in double.
    double sq = 0;
    std::vector<std::vector<std::vector<double>>> mean(sp->numUnits());
    for (int u = 0; u < sp->numUnits(); ++u)
      for (size_t p = 0; p < sp->spec(u).params.size(); ++p) {
        const size_t n = sp->spec(u).params[p].numel();
        mean[u].emplace_back(n, 0.0);
        for (size_t i = 0; i < n; ++i) {
          for (int r = 0; r < W; ++r)
            for (int m = 0; m < A; ++m) mean[u][p][i] += gradValue(r, m, u, static_cast<int>(p), i);
          mean[u][p][i] /= W * A;
          sq += mean[u][p][i] * mean[u][p][i];
        }
      }
    const double gtol = fp32 ? 1e-5 : 3e-2;  // bf16: each rank's gradient is rounded first
    for (int u = 0; u < sp->numUnits(); ++u)
      for (size_t p = 0; p < sp->spec(u).params.size(); ++p) {
        auto g = sp->gatherGrad(u, static_cast<int>(p));
        for (size_t i = 0; i < g.size(); ++i)
          REQUIRE(std::fabs(g[i] - mean[u][p][i]) <= gtol * (1 + std::fabs(mean[u][p][i])),
                  where(u, static_cast<int>(p), i) + " grad " + std::to_string(g[i]) + " want " +
                      std::to_string(mean[u][p][i]));
      }

    const double lr = 1e-2;
    const sh::StepResult res = sp->step(lr);
    const double norm = std::sqrt(sq);
    REQUIRE(std::fabs(res.grad_norm - norm) <= (fp32 ? 1e-5 : 3e-2) * norm,
            "norm " + std::to_string(res.grad_norm) + " want " + std::to_string(norm));
    const double coef = std::min(1.0, o.sdp_gradient_clipping / (norm + 1e-6));
    REQUIRE(coef < 1, "the test wants clipping to be active");
    for (int u = 0; u < sp->numUnits(); ++u)
      for (size_t p = 0; p < sp->spec(u).params.size(); ++p) {
        auto w = sp->gatherMaster(u, static_cast<int>(p));
        const bool decay = sp->spec(u).params[p].weight_decay;
        for (size_t i = 0; i < w.size(); ++i) {
          const double g = mean[u][p][i] * coef;
          // Step 1: m = (1-b1) g, v = (1-b2) g^2, bias-corrected m/sqrt(v) = g/|g|.
          double want = initValue(u, static_cast<int>(p), i) * (1 - (decay ? lr * o.weight_decay : 0));
          want -= lr * g / (std::fabs(g) + o.eps);
          // The first AdamW step moves by lr * sign(g): near g = 0 a rounding error of the
          // reduced gradient may flip the sign.
          const double tol = std::fabs(mean[u][p][i]) < (fp32 ? 1e-4 : 5e-2) ? 2.1 * lr : 1e-5;
          REQUIRE(std::fabs(w[i] - want) <= tol, where(u, static_cast<int>(p), i) + " master " + std::to_string(w[i]) +
                                                     " want " + std::to_string(want));
        }
      }
  });
  EXPECT_EQ(rc, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Degrees, Layer,
    testing::Values(Case{1, sh::DType::Float32, true, 500000000}, Case{2, sh::DType::Float32, true, 500000000},
                    Case{4, sh::DType::Float32, true, 500000000}, Case{2, sh::DType::Float32, false, 500000000},
                    Case{4, sh::DType::Float32, true, 40},  // many buckets, ragged last one
                    Case{2, sh::DType::BFloat16, true, 64}, Case{4, sh::DType::Float16, false, 500000000}),
    caseName);

// A checkpoint written at world 4 / degree 2 loads bit-exactly at degree 4 and at world 2,
// including the optimizer state (the next step agrees).
TEST(Checkpoint, LoadsAtAnotherDegreeAndWorldSize) {
  const fs::path dir = fs::temp_directory_path() / ("hicoll_sharded_ckpt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const fs::path ckpt = dir / "ckpt";
  auto dumpMasters = [](sh::ShardedParams& sp) {
    std::vector<float> all;
    for (int u = 0; u < sp.numUnits(); ++u)
      for (size_t p = 0; p < sp.spec(u).params.size(); ++p) {
        auto w = sp.gatherMaster(u, static_cast<int>(p));
        all.insert(all.end(), w.begin(), w.end());
      }
    return all;
  };
  auto writeVec = [](const fs::path& f, const std::vector<float>& v) {
    std::ofstream(f, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  };
  auto readVec = [](const fs::path& f) {
    std::ifstream in(f, std::ios::binary);
    std::vector<float> v;
    float x;
    while (in.read(reinterpret_cast<char*>(&x), 4)) v.push_back(x);
    return v;
  };

  ASSERT_EQ(onRanks(4, 2,
                    [&](hcComm_t world, int rank) {
                      auto sp = sh::ShardedParams::create(world, testUnits(), baseOptions(2));
                      initialize(*sp);
                      for (int s = 0; s < 2; ++s) {
                        writeGrads(*sp, rank, s);
                        sp->step(1e-2);
                      }
                      sp->save(ckpt.string(), R"({"step": 2, "note": "x"})");
                      const auto saved = dumpMasters(*sp);
                      writeGrads(*sp, rank, 5, /*rank_free=*/true);
                      sp->step(1e-2);
                      const auto next = dumpMasters(*sp);
                      if (rank == 0) {
                        writeVec(dir / "saved.bin", saved);
                        writeVec(dir / "next.bin", next);
                      }
                    }),
            0);
  ASSERT_TRUE(fs::exists(ckpt / "meta.json"));
  ASSERT_TRUE(fs::exists(ckpt / "shard-1-of-2.bin"));

  for (auto [np, nodes, degree] : {std::tuple{4, 2, 4}, std::tuple{2, 1, 2}, std::tuple{2, 2, 1}}) {
    EXPECT_EQ(onRanks(np, nodes,
                      [&](hcComm_t world, int rank) {
                        auto sp = sh::ShardedParams::create(world, testUnits(), baseOptions(degree));
                        initialize(*sp);  // overwritten by the load
                        const std::string extra = sp->load(ckpt.string());
                        REQUIRE(extra.find("\"note\":\"x\"") != std::string::npos, extra);
                        const auto saved = readVec(dir / "saved.bin"), got = dumpMasters(*sp);
                        REQUIRE(got == saved, "masters differ after loading at degree " + std::to_string(degree));
                        writeGrads(*sp, rank, 5, /*rank_free=*/true);
                        sp->step(1e-2);
                        const auto want = readVec(dir / "next.bin"), after = dumpMasters(*sp);
                        REQUIRE(after.size() == want.size());
                        for (size_t i = 0; i < want.size(); ++i)
                          REQUIRE(std::fabs(after[i] - want[i]) <= 1e-6 * (1 + std::fabs(want[i])),
                                  "element " + std::to_string(i) + " after the resumed step");
                      }),
              0)
        << "world " << np << " degree " << degree;
  }

  // A different model is refused with a message naming the mismatch, on every rank.
  EXPECT_EQ(onRanks(2, 1,
                    [&](hcComm_t world, int) {
                      auto units = testUnits();
                      units[1].params[2].shape = {102};
                      auto sp = sh::ShardedParams::create(world, units, baseOptions(2));
                      try {
                        sp->load(ckpt.string());
                      } catch (const sh::Error& e) {
                        REQUIRE(std::string(e.what()).find("'z'") != std::string::npos, e.what());
                        return;
                      }
                      REQUIRE(false, "a mismatched checkpoint was accepted");
                    }),
            0);
  fs::remove_all(dir);
}

TEST(Layer, MaxLiveParametersPausesPrefetch) {
  EXPECT_EQ(onRanks(2, 2,
                    [&](hcComm_t world, int) {
                      sh::Options o = baseOptions(2);
                      o.shard_alignment = 1;
                      // u0 gathers 408 elements, u1 294, u3 1000: room for u0 + u1 but not u1 + u3.
                      o.sdp_max_live_parameters = 1100;
                      auto sp = sh::ShardedParams::create(world, testUnits(), o);
                      initialize(*sp);
                      sp->unshard(0);
                      sp->prefetch(1);  // fits
                      sp->reshard(0);
                      sp->unshard(1);
                      sp->prefetch(3);  // would exceed: paused
                      REQUIRE(sp->stats().prefetches_paused == 1);
                      try {
                        sp->unshard(3);
                        REQUIRE(false, "unshard beyond the cap was accepted");
                      } catch (const sh::Error& e) {
                        REQUIRE(std::string(e.what()).find("sdp_max_live_parameters") != std::string::npos, e.what());
                      }
                      sp->reshard(1);
                      sp->unshard(3);
                      sp->reshard(3);
                      REQUIRE(sp->stats().live_params_peak <= 1100, std::to_string(sp->stats().live_params_peak));
                    }),
            0);
}

// Parameters + gradients + optimizer state per rank shrink as 1/degree (measured by the
// layer's allocator; the persistent parameters are the only replicated part).
TEST(Layer, StateMemoryShrinksWithTheDegree) {
  EXPECT_EQ(onRanks(4, 2,
                    [&](hcComm_t world, int rank) {
                      std::vector<sh::UnitSpec> units;
                      for (int u = 0; u < 6; ++u)
                        units.push_back({"u" + std::to_string(u), {{"w", {64, 64}}, {"b", {64}, false}}});
                      double base = 0;
                      for (int degree : {1, 2, 4}) {
                        sh::Options o = baseOptions(degree);
                        o.sdp_param_persistence_threshold = 100;
                        o.compute_dtype = sh::DType::BFloat16;
                        auto sp = sh::ShardedParams::create(world, units, o);
                        const sh::Stats s = sp->stats();
                        const double state = static_cast<double>(s.param_bytes + s.grad_bytes + s.optim_bytes);
                        REQUIRE(s.state_bytes_peak >= state);
                        if (degree == 1) base = state;
                        const double ratio = state / base;
                        if (rank == 0)
                          std::printf("degree %d: state %.0f bytes per rank, %.3f of degree 1\n", degree, state, ratio);
                        REQUIRE(ratio <= 1.0 / degree + 0.03 && ratio >= 1.0 / degree - 0.01,
                                "degree " + std::to_string(degree) + " ratio " + std::to_string(ratio));
                      }
                    }),
            0);
}

// fp16: an overflow on one rank skips the step on every rank and halves the loss scale.
TEST(Layer, Fp16OverflowSkipsTheStepEverywhere) {
  EXPECT_EQ(onRanks(2, 2,
                    [&](hcComm_t world, int rank) {
                      sh::Options o = baseOptions(2);
                      o.compute_dtype = sh::DType::Float16;
                      o.initial_loss_scale = 1024;
                      o.loss_scale_window = 2;
                      auto sp = sh::ShardedParams::create(world, testUnits(), o);
                      initialize(*sp);
                      const auto before = sp->gatherMaster(3, 0);
                      for (int u = sp->numUnits() - 1; u >= 0; --u) {
                        if (u == 3 && rank == 1)
                          sh::fromFloat(sh::DType::Float16, std::vector<float>{INFINITY}.data(), sp->grad(3, 0), 1);
                        sp->reduceGrad(u);
                      }
                      sp->finishMicroStep();
                      auto r = sp->step(1e-2);
                      REQUIRE(r.skipped && r.loss_scale == 512, std::to_string(r.loss_scale));
                      REQUIRE(sp->gatherMaster(3, 0) == before, "a skipped step changed the weights");
                      writeGrads(*sp, rank, 0);
                      r = sp->step(1e-2);
                      REQUIRE(!r.skipped && std::isfinite(r.grad_norm));
                      writeGrads(*sp, rank, 1);
                      r = sp->step(1e-2);
                      REQUIRE(r.loss_scale == 1024, "two finite steps (window 2) double the scale");
                      REQUIRE(sp->stats().skipped_steps == 1);
                    }),
            0);
}

TEST(Layer, DegreeThatDoesNotDivideTheWorldIsAClearError) {
  EXPECT_EQ(
      onRanks(4, 2,
              [&](hcComm_t world, int) {
                try {
                  sh::ShardedParams::create(world, testUnits(), baseOptions(3));
                } catch (const sh::Error& e) {
                  REQUIRE(std::string(e.what()).find("sharded_data_parallel_degree=3 must divide") != std::string::npos,
                          e.what());
                  return;
                }
                REQUIRE(false, "degree 3 on world 4 was accepted");
              }),
      0);
}

}  // namespace
