// The link probe's figure from the ranks' start and end times (core/net_probe.h): ranks that
// start at different times, and rails of a node that do not overlap, give the link's rate.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/topology.h"
#include "core/net_probe.h"

namespace {

using namespace hicoll;

Topology nodes(const std::vector<std::string>& label_of_rank) {
  return Topology::build(label_of_rank, label_of_rank);
}

// One round on a ring of nodes, one rank each: every rank sends to the next node while it
// receives from the previous one, each link taking T. A rank's receive ends T after its
// sender started (its own send is buffered at once), whenever the rank itself started.
std::vector<double> ring(const std::vector<double>& start, double T) {
  const size_t N = start.size();
  std::vector<double> ends(2 * N);
  for (size_t r = 0; r < N; ++r) {
    ends[2 * r] = start[r];
    ends[2 * r + 1] = std::max(start[r], start[(r + N - 1) % N] + T);
  }
  return ends;
}

TEST(NetProbe, RanksThatStartAtDifferentTimesGiveTheLinksRate) {
  const double T = 0.010, bytes = 1.25e6;  // 125 MB/s
  // A rank that starts 3 ms after its sender measures 7 ms, its sender 13: neither is the link.
  const Topology two = nodes({"a", "b"});
  const std::vector<double> ends = ring({100.000, 100.003}, T);
  EXPECT_NEAR(ends[3] - ends[2], 0.007, 1e-12);
  EXPECT_NEAR(roundFigure(two, 1250000, ends), bytes / T, 1e-3);
  const Topology four = nodes({"a", "b", "c", "d"});
  EXPECT_NEAR(roundFigure(four, 1250000, ring({5.0, 5.004, 5.001, 5.0025}, T)), bytes / T, 1e-3);
}

TEST(NetProbe, ANodesRailsThatDoNotOverlapShareItsSpan) {
  // Ranks 0 and 2 on node a, 1 and 3 on node b. Rail 0 (ranks 0, 1) runs 0-5 ms, rail 1 (ranks
  // 2, 3) 5-10 ms: each rail alone had the link, moving its bytes in 5 ms, so the link carried
  // 2 x bytes in the node's 10 ms, not in a rank's 5.
  const Topology t = nodes({"a", "b", "a", "b"});
  const std::vector<double> ends = {0, 0.005, 0, 0.005, 0.005, 0.010, 0.005, 0.010};
  const std::vector<double> span = nodeSpans(t, ends);
  ASSERT_EQ(span.size(), 2u);
  EXPECT_NEAR(span[0], 0.010, 1e-12);
  EXPECT_NEAR(span[1], 0.010, 1e-12);
  EXPECT_NEAR(roundFigure(t, 1000000, ends), 2e6 / 0.010, 1e-3);
}

TEST(NetProbe, NoTimeNoFigure) {
  const Topology two = nodes({"a", "b"});
  EXPECT_EQ(roundFigure(two, 1000, {1.0, 1.0, 1.0, 1.0}), 0);
}

}  // namespace
