// The staged layout of small calls on one node (algorithms/node_small.h), ranks as threads over
// the shared-memory transport: a wait prefetches exactly the lines its reads come from.
#include <gtest/gtest.h>

#include "../transport/shm/shm_test_util.h"
#include "algorithms/node_small.h"

namespace hicoll {
namespace {

using namespace shmtest;

// Staged::lines() names, relative to each peer's scratch buffer, the bytes Staged::of() reads
// there; staged data that rides in the post (or in a ring phase's slot) has none to prefetch.
TEST(NodeSmall, TheLinesAWaitPrefetchesAreWhereItsReadsLie) {
  ShmOptions opt;
  opt.scratch_bytes = 64 << 10;
  opt.timeout_ms = kTimeoutMs;
  runRanks(
      3,
      [&](Rank& r) {
        ShmTransport& t = r.t();
        const size_t half = opt.scratch_bytes / 2;
        for (uint64_t seq : {1, 2, 7, 300})
          for (size_t bytes : {size_t{8}, Board::Post::kData, Board::Post::kData + 1, size_t{200}, size_t{4096}}) {
            SCOPED_TRACE(testing::Message() << "phase " << seq << ", " << bytes << " bytes staged");
            const Staged s(t, seq, half, bytes, /*one_node=*/true);
            for (size_t off : {size_t{0}, bytes / 3}) {
              const PeerLines pl = s.lines(off, bytes - off);
              if (bytes <= Board::Post::kData) {
                EXPECT_EQ(pl.len, 0u);
                continue;
              }
              EXPECT_EQ(pl.len, bytes - off);
              for (int l = 0; l < t.localSize(); ++l) EXPECT_EQ(t.scratch(l) + pl.offset, s.of(l) + off);
            }
            EXPECT_EQ(Staged(t, seq, half, bytes, true, /*ring=*/true).lines(0, bytes).len, 0u);
          }
      },
      opt);
}

}  // namespace
}  // namespace hicoll
