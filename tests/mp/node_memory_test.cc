// Tier 3: collectives on node memory (hcMemAlloc). Every collective stays exact with its
// buffers there, in and out of place, across the sizes where the paths change (the eager
// size, one chunk, several); the node's ranks read each other's buffers where they lie (the
// stats say so), also where single-copy reads (CMA) are off; and the allocator's own contract.
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../common/mp.h"
#include "checks.h"

namespace hctest {
namespace {

uint64_t nodeMemoryBytes(hcComm_t comm, hcColl_t c) {
  hcStats s = HC_STATS_INITIALIZER;
  hcCommGetStats(comm, &s);
  return s.bytes_node_memory[c];
}

// Every collective, every size, both placements, on node memory; then the stats must show
// the AllGather and ReduceScatter read peers' node memory (on one node: all of it).
int allOnNodeMemory(int rank, hcComm_t comm, bool one_node) {
  useNodeMemory(true);
  int f = 0;
  for (size_t count : {size_t{7}, size_t{1000}, size_t{70000}, size_t{600000}})
    for (bool ip : {false, true}) {
      f += checkAllGather(comm, hcFloat32, count, ip, 1);
      f += checkReduceScatter(comm, hcFloat32, hcSum, count, ip, 2);
      f += checkReduceScatter(comm, hcBfloat16, hcMax, count, ip, 3);
      f += checkAllReduce(comm, hcFloat32, hcSum, count, ip, 4);
      f += checkBroadcast(comm, hcInt32, count, 1, ip, 5);
    }
  const uint64_t ag = nodeMemoryBytes(comm, hcCollAllGather), rs = nodeMemoryBytes(comm, hcCollReduceScatter);
  std::fprintf(stderr, "[rank %d] read from peers' node memory: AllGather %llu, ReduceScatter %llu bytes\n", rank,
               (unsigned long long)ag, (unsigned long long)rs);
  if (ag == 0) ++f;
  if (one_node && rs == 0) ++f;
  return f;
}

TEST(NodeMemory, CollectivesExactOnOneNode) {
  Job job;
  job.nranks = 4;
  auto st = run(job, [](int rank, hcComm_t comm) { return allOnNodeMemory(rank, comm, true); });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

// Without CMA the heap path stages every block through the shared segment; node memory is
// read where it lies.
TEST(NodeMemory, NeedsNoSingleCopyReads) {
  Job job;
  job.nranks = 3;
  job.env["HICOLL_SHM_CMA"] = "0";
  auto st = run(job, [](int rank, hcComm_t comm) { return allOnNodeMemory(rank, comm, true); });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

TEST(NodeMemory, CollectivesExactAcrossNodes) {
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  auto st = run(job, [](int rank, hcComm_t comm) { return allOnNodeMemory(rank, comm, false); });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

// Some ranks on node memory, some on the heap: still exact (each peer is read the way its
// buffer allows).
TEST(NodeMemory, MixedWithHeapBuffers) {
  Job job;
  job.nranks = 4;
  job.node = contiguous(2, 2);
  auto st = run(job, [](int rank, hcComm_t comm) {
    useNodeMemory(rank % 2 == 0);
    int f = 0;
    for (size_t count : {size_t{1000}, size_t{600000}})
      for (bool ip : {false, true}) {
        f += checkAllGather(comm, hcFloat32, count, ip, 1);
        f += checkReduceScatter(comm, hcFloat32, hcSum, count, ip, 2);
        f += checkAllReduce(comm, hcFloat32, hcSum, count, ip, 4);
      }
    return f;
  });
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

bool nameExists(const std::string& prefix) {
  DIR* d = opendir("/dev/shm");
  bool found = false;
  while (d && !found)
    if (dirent* e = readdir(d)) found = std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0;
    else break;
  if (d) closedir(d);
  return found;
}

TEST(NodeMemory, AllocatorContract) {
  void* p = nullptr;
  EXPECT_EQ(hcMemAlloc(nullptr, 64), hcInvalidArgument);
  EXPECT_EQ(hcMemAlloc(&p, 0), hcInvalidArgument);
  ASSERT_EQ(hcMemAlloc(&p, 3 << 20), hcSuccess);
  std::memset(p, 1, 3 << 20);  // writable, all of it
  const std::string mine = "hicoll-mem-" + std::to_string(getpid()) + "-";
  EXPECT_TRUE(nameExists(mine)) << "a live allocation keeps its name for peers to map";
  char x = 0;
  EXPECT_EQ(hcMemFree(&x), hcInvalidArgument);
  EXPECT_NE(std::string(hcGetLastError(nullptr)).find("hcMemFree"), std::string::npos);
  EXPECT_EQ(hcMemFree(static_cast<char*>(p) + 8), hcInvalidArgument);
  EXPECT_EQ(hcMemFree(nullptr), hcSuccess);
  EXPECT_EQ(hcMemFree(p), hcSuccess);
  EXPECT_EQ(hcMemFree(p), hcInvalidArgument) << "double free";
  // The freed block is kept and comes back for the same size.
  void* q = nullptr;
  ASSERT_EQ(hcMemAlloc(&q, 3 << 20), hcSuccess);
  EXPECT_EQ(q, p);
  EXPECT_EQ(hcMemFree(q), hcSuccess);
}

// A process killed while it holds node memory leaves its names behind; the next allocation on
// the machine removes them.
TEST(NodeMemory, NamesOfDeadOwnersAreRemoved) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    void* p = nullptr;
    if (hcMemAlloc(&p, 1 << 20) != hcSuccess) _exit(1);
    _exit(0);  // no hcMemFree: as if killed
  }
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_EQ(st, 0);
  const std::string dead = "hicoll-mem-" + std::to_string(pid) + "-";
  ASSERT_TRUE(nameExists(dead));
  // A fresh process (the sweep runs at a process's first allocation).
  pid_t pid2 = fork();
  if (pid2 == 0) {
    void* p = nullptr;
    _exit(hcMemAlloc(&p, 4096) == hcSuccess && hcMemFree(p) == hcSuccess ? 0 : 1);
  }
  waitpid(pid2, &st, 0);
  EXPECT_EQ(st, 0);
  EXPECT_FALSE(nameExists(dead));
}

}  // namespace
}  // namespace hctest
