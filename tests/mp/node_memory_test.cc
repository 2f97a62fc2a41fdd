// Tier 3: collectives on node memory (hcMemAlloc). Every collective stays exact with its
// buffers there, in and out of place, across the sizes where the paths change (the eager
// size, one chunk, several); the node's ranks read each other's buffers where they lie (the
// stats say so), also where single-copy reads (CMA) are off; and the allocator's own contract.
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <fstream>
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

// Every copy into an output with streaming stores (HICOLL_STREAM_COPY_BYTES=0: base/copy.h),
// on one node and across nodes, node memory and (without CMA) the heap's staged blocks: exact.
TEST(NodeMemory, CollectivesExactWithStreamingCopies) {
  for (bool across : {false, true}) {
    Job job;
    job.nranks = 4;
    if (across) job.node = contiguous(2, 2);
    job.env["HICOLL_STREAM_COPY_BYTES"] = "0";
    job.env["HICOLL_SHM_CMA"] = "0";
    auto st = run(job, [&](int rank, hcComm_t comm) {
      int f = allOnNodeMemory(rank, comm, !across);
      useNodeMemory(false);
      for (size_t count : {size_t{7}, size_t{70000}})
        for (bool ip : {false, true}) {
          f += checkAllGather(comm, hcFloat32, count, ip, 6);
          f += checkBroadcast(comm, hcInt32, count, 2, ip, 7);
        }
      return f;
    });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << (across ? "2x2" : "1x4") << " rank " << r;
  }
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

// Names in /dev/shm that carry pid, as hicoll's node memory once had ("hicoll-mem-<pid>-..."):
// there should be none, its shared memory is anonymous. (Only pid's: other jobs on the machine
// may have left names of their own.)
std::vector<std::string> hicollNamesOf(int pid) {
  std::vector<std::string> names;
  const std::string mine = "-" + std::to_string(pid) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::strncmp(e->d_name, "hicoll", 6) == 0 && std::strstr(e->d_name, mine.c_str()))
        names.emplace_back(e->d_name);
    closedir(d);
  }
  return names;
}

long statusKiB(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line))
    if (line.compare(0, n, field) == 0 && line[n] == ':') return std::stol(line.substr(n + 1));
  return -1;
}

TEST(NodeMemory, AllocatorContract) {
  void* p = nullptr;
  EXPECT_EQ(hcMemAlloc(nullptr, 64), hcInvalidArgument);
  EXPECT_EQ(hcMemAlloc(&p, 0), hcInvalidArgument);
  ASSERT_EQ(hcMemAlloc(&p, 3 << 20), hcSuccess);
  std::memset(p, 1, 3 << 20);  // writable, all of it
  EXPECT_EQ(hicollNamesOf(getpid()), std::vector<std::string>{}) << "node memory has no name in /dev/shm";
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

// More than the machine has is an error when it is asked for (naming the sizes), not a success
// followed by a signal at the first touch; so is a size that overflows.
TEST(NodeMemory, MoreThanTheMachineHasIsAnError) {
  for (size_t n : {size_t{64} << 40, size_t{64} << 30, SIZE_MAX - 100}) {
    void* p = reinterpret_cast<void*>(1);
    const hcResult_t r = hcMemAlloc(&p, n);
    if (r == hcSuccess) {  // a machine with 64 GiB free may grant that one
      EXPECT_LT(n, size_t{1} << 40);
      hcMemFree(p);
      continue;
    }
    EXPECT_TRUE(r == hcSystemError || r == hcInvalidArgument) << n << ": " << hcGetErrorString(r);
    EXPECT_EQ(p, nullptr);
    const std::string why = hcGetLastError(nullptr);
    EXPECT_NE(why.find(std::to_string(n)), std::string::npos) << why;
  }
}

// A process killed while it holds node memory leaves nothing behind: no name, and the memory
// goes with the process.
TEST(NodeMemory, KilledOwnerLeavesNothing) {
  for (int i = 0; i < 3; ++i) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      void* p = nullptr;
      if (hcMemAlloc(&p, 1 << 20) != hcSuccess) _exit(1);
      std::memset(p, 7, 1 << 20);
      raise(SIGKILL);
      _exit(2);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
    EXPECT_EQ(hicollNamesOf(pid), std::vector<std::string>{});
  }
}

// Allocate, gather from it, free, 300 times with sizes of 1-8 MiB: what each rank maps of its
// own and its peer's node memory stays bounded by the cache (HICOLL_MEM_CACHE_BYTES) plus the
// live buffers, because a peer unmaps what the owner released.
int churn(int rank, hcComm_t comm, long bound_kib) {
  int W = 0;
  hcCommCount(comm, &W);
  std::vector<char> out(size_t{8} << 20 << 1);
  long most = 0;
  for (int i = 0; i < 300; ++i) {
    const size_t bytes = (size_t{1} << 20) + (size_t(i) * 2654435761u) % (size_t{7} << 20);  // alike on every rank
    void* p = nullptr;
    if (hcMemAlloc(&p, bytes) != hcSuccess) return std::fprintf(stderr, "hcMemAlloc: %s\n", hcGetLastError(nullptr)), 1;
    std::memset(p, rank + i, bytes);
    const size_t count = bytes / static_cast<size_t>(W) & ~size_t{3};
    if (hcAllGather(p, out.data(), count, hcUint8, comm, nullptr) != hcSuccess)
      return std::fprintf(stderr, "hcAllGather: %s\n", hcGetLastError(comm)), 1;
    for (int r = 0; r < W; ++r)
      if (out[r * count] != static_cast<char>(r + i) || out[(r + 1) * count - 1] != static_cast<char>(r + i))
        return std::fprintf(stderr, "[rank %d] wrong block from rank %d at %d\n", rank, r, i), 1;
    most = std::max(most, statusKiB("RssShmem"));
    if (hcMemFree(p) != hcSuccess) return 1;
  }
  std::fprintf(stderr, "[rank %d] RssShmem at most %ld KiB over 300 allocations (bound %ld KiB)\n", rank, most,
               bound_kib);
  return most > bound_kib;
}

TEST(NodeMemory, PeersViewsBoundedUnderChurn) {
  for (const char* cache : {"0", "16777216"}) {
    Job job;
    job.nranks = 2;
    job.env["HICOLL_MEM_CACHE_BYTES"] = cache;
    // One rank's live 8 MiB, its peer's, the cache, and the segment's pages in use.
    const long bound = (16 << 10) + std::stol(cache) / 1024 + (24 << 10);
    auto st = run(job, [&](int rank, hcComm_t comm) { return churn(rank, comm, bound); });
    for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r << " cache " << cache;
  }
}

}  // namespace
}  // namespace hctest
