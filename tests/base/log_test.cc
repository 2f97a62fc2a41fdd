// A communicator's log level (ScopedLogRank) shows its lines whatever HICOLL_DEBUG says, on its
// thread only, and only while it is in force: HC_LOG's one-load skip (the ceiling) must never
// hide a line the thread's level asks for.
#include "base/log.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

namespace hicoll {
namespace {

std::string traced(const char* what) {
  testing::internal::CaptureStderr();
  HC_TRACE("{}", what);
  HC_INFO("{} (info)", what);
  return testing::internal::GetCapturedStderr();
}

TEST(Log, ACommunicatorsLevelShowsItsLinesOnItsThreadWhileInForce) {
  if (logLevel() >= LogLevel::kInfo) GTEST_SKIP() << "HICOLL_DEBUG asks for INFO or more already";
  EXPECT_EQ(traced("before"), "");
  {
    ScopedLogRank comm(3, static_cast<int>(LogLevel::kTrace), "tp");
    const std::string out = traced("inside");
    EXPECT_NE(out.find("[rank 3 'tp' pid"), std::string::npos) << out;
    EXPECT_NE(out.find("TRACE inside"), std::string::npos) << out;
    EXPECT_NE(out.find("INFO inside (info)"), std::string::npos) << out;
    // Another thread keeps HICOLL_DEBUG's level.
    std::string other = "unset";
    std::thread([&] { other = traced("other thread"); }).join();
    EXPECT_EQ(other, "");
    {
      ScopedLogRank inner(4);  // a rank without a level keeps the thread's
      EXPECT_NE(traced("inner").find("[rank 4 'tp' pid"), std::string::npos);
    }
  }
  EXPECT_EQ(traced("after"), "");
  {
    ScopedLogRank info(5, static_cast<int>(LogLevel::kInfo));
    const std::string out = traced("info level");
    EXPECT_EQ(out.find("TRACE"), std::string::npos) << out;
    EXPECT_NE(out.find("INFO info level (info)"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace hicoll
