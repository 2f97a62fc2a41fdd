// copyStreaming copies exactly what memcpy does: every length around its 32-byte head and
// 128-byte body, from and to every alignment, and nothing outside the destination range.
#include "base/copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace hicoll {
namespace {

TEST(Copy, StreamingCopiesEveryLengthAndAlignmentExactly) {
  std::vector<uint8_t> src(4096 + 64), dst(4096 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t len : {0, 1, 31, 32, 33, 127, 128, 129, 255, 256, 300, 1000, 4095, 4096})
    for (size_t so : {0, 1, 17, 32})
      for (size_t doff : {0, 3, 16, 31, 64}) {
        std::fill(dst.begin(), dst.end(), 0xee);
        copyStreaming(dst.data() + 64 + doff, src.data() + so, len);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= 64 + doff && i < 64 + doff + len;
          const uint8_t want = inside ? src[so + i - 64 - doff] : 0xee;
          ASSERT_EQ(dst[i], want) << "len " << len << " src offset " << so << " dst offset " << doff << " byte " << i;
        }
      }
}

// Large enough to take the streaming loop many times over.
TEST(Copy, StreamingCopiesMegabytes) {
  const size_t n = (3u << 20) + 77;
  std::vector<uint32_t> src(n / 4 + 1), dst(n / 4 + 1, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint32_t>(i * 2654435761u);
  copyStreaming(dst.data(), src.data(), n);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), n), 0);
}

}  // namespace
}  // namespace hicoll
