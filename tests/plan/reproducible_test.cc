// HICOLL_REPRODUCIBLE (plan/plan.h, PlanContext::untimed): the figures a timing moved (the link
// measured at the first call, the refinement from timed calls) never decide how a reduction sums
// (its path, the AllReduce split) nor whether a quantized call quantizes; they still decide what
// only changes the time (the chunk, an AllGather's path). With 0 they decide everything.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan.h"
#include "plan_fixture.h"

namespace hicoll {
namespace {

using plantest::call;

// The communicators of these tests: 2 nodes x 2 ranks.
struct Comm : plantest::Comm {
  explicit Comm(std::map<std::string, std::string> env) : plantest::Comm(2, 2, std::move(env)) {}
};

// What a machine's calls were guessed at (a fast link, a fast sum) and what timing them taught
// (a slow link and a slow sum; or only a longer round trip, which moves the window): they
// disagree on the path and split of many calls.
MachineFigures guessed() {
  MachineFigures m = defaultFigures("tcp;ofi_rxm");
  m.net_Bps = 1.25e9;
  m.reduce_Bps = 8e9;
  return m;
}
MachineFigures timed() {
  MachineFigures m = guessed();
  m.net_Bps = 3e7;
  m.net_alpha_s *= 8;
  m.reduce_Bps = 2e7;
  m.quant_Bps = 4e9;
  return m;
}
MachineFigures longerRoundTrip() {
  MachineFigures m = guessed();
  m.net_alpha_s *= 40;
  return m;
}

struct Choice {
  hcPath_t path;
  bool small;
  bool operator==(const Choice& o) const { return path == o.path && small == o.small; }
};

// The plan of a on a communicator that planned by `base` and then timed calls taught it
// `learnt`: through the link measurement (unmeasured) or the refinement (refined).
enum class Taught { Nothing, Link, Refinement };
Choice planned(const CollArgs& a, const std::map<std::string, std::string>& env, Taught how,
               const MachineFigures& learnt = timed()) {
  Comm c(env);
  c.ctx.model = guessed();
  if (how == Taught::Link) {
    c.ctx.unmeasured = c.ctx.model;
    c.ctx.model = learnt;
  } else if (how == Taught::Refinement) {
    c.ctx.refined.assign(kSizeBands, learnt);
  }
  const CollPlan p = planCall(c.id, c.ctx, a, Capabilities{});
  EXPECT_TRUE(p.modelled);
  return {p.path, p.allreduce_small};
}
Choice plannedBy(const CollArgs& a, const MachineFigures& m) {
  Comm c({});
  c.ctx.model = m;
  const CollPlan p = planCall(c.id, c.ctx, a, Capabilities{});
  return {p.path, p.allreduce_small};
}

TEST(Reproducible, TimingsNeverDecideHowAReductionSums) {
  for (const MachineFigures& taught : {timed(), longerRoundTrip()}) {
    int differ = 0;
    for (hcColl_t coll : {hcCollReduceScatter, hcCollAllReduce})
      for (size_t count = 16; count <= (size_t{16} << 20); count = count * 3 / 2) {
        const CollArgs a = call(coll, count);
        const Choice untimed = plannedBy(a, guessed()), learnt = plannedBy(a, taught);
        differ += !(untimed == learnt);
        for (Taught how : {Taught::Link, Taught::Refinement}) {
          const std::string what = std::string(collName(coll)) + " of " + std::to_string(count) +
                                   " floats, taught by " + (how == Taught::Link ? "the link" : "the refinement") +
                                   " (round trip x" + std::to_string(taught.net_alpha_s / guessed().net_alpha_s) + ")";
          EXPECT_TRUE(planned(a, {}, how, taught) == untimed) << what;
          EXPECT_TRUE(planned(a, {{"HICOLL_REPRODUCIBLE", "0"}}, how, taught) == learnt)
              << what << ", HICOLL_REPRODUCIBLE=0";
        }
      }
    EXPECT_GT(differ, 0) << "the figures never disagree: the test would not see a timed choice";
  }
}

// The chunk sums alike whatever its size: the timed figures choose it for every collective.
TEST(Reproducible, TimingsStillChooseTheChunk) {
  MachineFigures fast = guessed();  // per-message work bounds the calls: a larger chunk pays
  fast.net_Bps = 50e9;
  fast.net_alpha_s = 15e-6;
  fast.net_cpu_s_per_B = 0;
  fast.net_msg_s = 15e-6;
  fast.copy_Bps = 100e9;
  fast.reduce_Bps = 100e9;
  MachineFigures slow = guessed();
  slow.net_Bps = 1.25e8;
  const size_t floor = 256u << 10, cap = 1u << 20;
  for (hcColl_t coll : {hcCollAllGather, hcCollReduceScatter, hcCollAllReduce}) {
    auto chunk = [&](bool refined) {
      Comm c({});
      c.ctx.model = slow;
      c.ctx.net_chunk_cap = cap;
      if (refined) c.ctx.refined.assign(kSizeBands, fast);
      return planCall(c.id, c.ctx, call(coll, 1u << 22), Capabilities{}).chunk_bytes;
    };
    EXPECT_EQ(chunk(false), floor) << collName(coll);
    EXPECT_EQ(chunk(true), cap) << collName(coll);
  }
}

TEST(Reproducible, TimingsNeverDecideWhetherACallQuantizes) {
  int differ = 0;
  for (hcColl_t coll : {hcCollAllGather, hcCollReduceScatter})
    for (size_t count = 1024; count <= (size_t{16} << 20); count *= 4) {
      const CollArgs a = call(coll, count, 256);
      auto quantizes = [&](const std::map<std::string, std::string>& env, Taught how, const MachineFigures& m) {
        Comm c(env);
        c.ctx.model = how == Taught::Nothing ? m : guessed();
        if (how == Taught::Refinement) c.ctx.refined.assign(kSizeBands, timed());
        return planQuantized(c.id, c.ctx, a, Capabilities{}).quantize;
      };
      const std::map<std::string, std::string> model_decides = {{"HICOLL_QUANT_MIN_NODES", "0"}};
      std::map<std::string, std::string> timed_decides = model_decides;
      timed_decides["HICOLL_REPRODUCIBLE"] = "0";
      const bool untimed = quantizes(model_decides, Taught::Nothing, guessed());
      const bool learnt = quantizes(model_decides, Taught::Nothing, timed());
      differ += untimed != learnt;
      const std::string what = std::string(collName(coll)) + " of " + std::to_string(count) + " floats";
      EXPECT_EQ(quantizes(model_decides, Taught::Refinement, {}), untimed) << what;
      EXPECT_EQ(quantizes(timed_decides, Taught::Refinement, {}), learnt) << what << ", HICOLL_REPRODUCIBLE=0";
    }
  EXPECT_GT(differ, 0) << "the figures never disagree on quantizing";
}

}  // namespace
}  // namespace hicoll
