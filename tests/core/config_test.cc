#include <gtest/gtest.h>

#include <map>

#include "core/config.h"
#include "core/error.h"

namespace hicoll {
namespace {

Config with(std::map<std::string, std::string> env) {
  return Config::from([&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string errorOf(std::map<std::string, std::string> env) {
  try {
    with(env);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAreTheSeedsValues) {
  Config c = with({});
  EXPECT_EQ(c.num(Knob::ScratchBytes), 16 << 20);
  EXPECT_EQ(c.num(Knob::SortBytes), 128 << 20);
  EXPECT_EQ(c.str(Knob::Algo), "auto");
  EXPECT_TRUE(c.isDefault(Knob::Algo));
}

TEST(Config, SizesAcceptBinarySuffixes) {
  EXPECT_EQ(parseSize("X", "8192"), 8192);
  EXPECT_EQ(parseSize("X", "16K"), 16384);
  EXPECT_EQ(parseSize("X", "2M"), 2 << 20);
  EXPECT_EQ(parseSize("X", "1GiB"), 1 << 30);
  EXPECT_EQ(with({{"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", "64M"}}).num(Knob::SortBytes), 64 << 20);
}

TEST(Config, InvalidValuesNameTheVariableAndTheValue) {
  for (const char* bad : {"12345", "abc", "-8192", "0", "8192x", ""}) {
    std::string msg = errorOf({{"SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", bad}});
    EXPECT_NE(msg.find("SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES"), std::string::npos) << bad;
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
  }
  EXPECT_NE(errorOf({{"HICOLL_ALGO", "tree"}}).find("auto|hier|ring"), std::string::npos);
  EXPECT_NE(errorOf({{"HICOLL_TIMEOUT_MS", "soon"}}).find("HICOLL_TIMEOUT_MS"), std::string::npos);
  EXPECT_NE(errorOf({{"HICOLL_FORCE_FALLBACK", "allgather,gossip"}}).find("gossip"), std::string::npos);
}

TEST(Config, EnumsAndListsAreNormalised) {
  Config c = with({{"HICOLL_ALGO", "RING"}, {"HICOLL_FORCE_FALLBACK", " AllGather , reducescatter"}});
  EXPECT_EQ(c.str(Knob::Algo), "ring");
  EXPECT_TRUE(c.listHas(Knob::ForceFallback, "allgather"));
  EXPECT_TRUE(c.listHas(Knob::ForceFallback, "reducescatter"));
  EXPECT_FALSE(c.listHas(Knob::ForceFallback, "allreduce"));
  EXPECT_TRUE(with({{"HICOLL_FORCE_FALLBACK", "all"}}).listHas(Knob::ForceFallback, "broadcast"));
}

TEST(Config, ConsistencyHashesCoverOnlyWhatSteersThePath) {
  auto a = with({}).consistencyHashes();
  EXPECT_NE(a, with({{"SMDDP_AG_SORT_BUFFER_SIZE_BYTES", "8192"}}).consistencyHashes());
  EXPECT_EQ(a, with({{"HICOLL_TOPO_NODE", "elsewhere"}, {"HICOLL_DEBUG", "INFO"}}).consistencyHashes());
}

}  // namespace
}  // namespace hicoll
