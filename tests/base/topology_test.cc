#include <gtest/gtest.h>

#include "base/topology.h"

namespace hicoll {
namespace {

TEST(Topology, InterleavedLayoutKeepsAnExplicitMap) {
  Topology t = Topology::build({"a", "b", "a", "b"}, {"h", "h", "h", "h"});
  EXPECT_EQ(t.nnodes, 2);
  EXPECT_TRUE(t.uniform);
  EXPECT_TRUE(t.single_host);
  EXPECT_EQ(t.node_of, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(t.local_of, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(t.rankAt(1, 1), 3);
  EXPECT_EQ(t.rankAt(0, 1), 2);
}

TEST(Topology, UnevenNodesAreNotUniform) {
  Topology t = Topology::build({"a", "a", "b"}, {"h1", "h1", "h2"});
  EXPECT_FALSE(t.uniform);
  EXPECT_FALSE(t.single_host);
  EXPECT_EQ(t.localSize(0), 2);
  EXPECT_EQ(t.localSize(1), 1);
}

}  // namespace
}  // namespace hicoll
