#include <gtest/gtest.h>

#include <map>

#include "base/config.h"
#include "base/error.h"

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

// Values that parse but make no sense are refused, not clamped or left to overflow later.
TEST(Config, RangesAreEnforced) {
  for (const char* bad : {"-1", "0", "9223372036854775807", "2147483648"}) {
    std::string msg = errorOf({{"HICOLL_TIMEOUT_MS", bad}});
    EXPECT_NE(msg.find("HICOLL_TIMEOUT_MS"), std::string::npos) << bad;
    EXPECT_NE(msg.find("range"), std::string::npos) << msg;
  }
  EXPECT_EQ(with({{"HICOLL_TIMEOUT_MS", "1"}}).num(Knob::TimeoutMs), 1);
  for (const char* bad : {"0", "-1", "1025"}) EXPECT_NE(errorOf({{"HICOLL_NET_WINDOW", bad}}), "") << bad;
  for (const char* knob : {"HICOLL_CHUNK_SIZE", "HICOLL_NET_CHUNK_SIZE", "HICOLL_DEVICE_CHUNK_SIZE"}) {
    EXPECT_NE(errorOf({{knob, "0"}}).find(knob), std::string::npos) << knob;
    EXPECT_NE(errorOf({{knob, "4095"}}).find(knob), std::string::npos) << knob;
    EXPECT_NE(errorOf({{knob, "8G"}}), "") << knob;
  }
}

// Which knobs must agree is part of the table, and the table says so for the ones that
// change a protocol.
TEST(Config, KnobsThatChangeTheProtocolMustAgree) {
  for (const KnobInfo& k : knobTable()) {
    const std::string n = k.name;
    if (n == "HICOLL_OFI_RXM_EAGER" || n == "HICOLL_ALGO" || n == "SMDDP_AG_SORT_BUFFER_SIZE_BYTES" ||
        n == "HICOLL_NET_CHUNK_SIZE" || n == "HICOLL_OFI_PROVIDER")
      EXPECT_EQ(k.scope, KnobScope::Agree) << n;
    if (n == "HICOLL_DEBUG" || n == "HICOLL_TOPO_NODE" || n == "HICOLL_TIMEOUT_MS")
      EXPECT_EQ(k.scope, KnobScope::Local) << n;
  }
  EXPECT_NE(with({}).consistencyHashes(), with({{"HICOLL_OFI_RXM_EAGER", "0"}}).consistencyHashes());
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
