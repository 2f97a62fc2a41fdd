// Tier 3: the rendezvous against strangers. With the launchers' random secret a stranger who
// knows the port cannot join; with a guessable (derived) secret it can log in, but it cannot
// grow rank 0's memory without bound or hold rank 0's teardown past HICOLL_TIMEOUT_MS; and
// strangers that never authenticate are read no further than their greeting.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/mp.h"
#include "checks.h"

namespace hctest {
namespace {

// The wire format of the rendezvous (src/bootstrap/tcp_store.cc), as a stranger would learn it.
struct Hello {
  uint64_t magic;
  uint8_t secret[16];
  int32_t rank, nranks;
};
struct ReqHeader {
  uint32_t op, keylen;
  uint64_t vallen;
};
constexpr uint64_t kMagic = 0x68636f6c6c763031ULL;

// The secret hcCommInitFromEnv derives when it has neither HICOLL_COMM_SECRET nor a launcher
// job id: the same in every build, so anybody can compute it (src/bootstrap/env.cc).
void derivedSecret(uint8_t out[16]) {
  auto fnv = [](const std::string& s, uint64_t h) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
  };
  const std::string job = "hicoll-secret-v1;";
  const uint64_t h1 = fnv(job, 1469598103934665603ull), h2 = fnv(job + "#", h1);
  std::memcpy(out, &h1, 8);
  std::memcpy(out + 8, &h2, 8);
}

int connectLoopback(int port) {
  for (int i = 0; i < 400; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

bool sendAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

long rssKiB(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  return -1;
}

// Rank 0 waits (bounded) until the stranger is done, then reports how much it grew.
int waitAndMeasure(int rank, hcComm_t comm, const char* done_path, long max_growth_kib) {
  const long before = rssKiB("VmRSS:");
  if (rank == 0) {
    for (int i = 0; i < 3000 && access(done_path, F_OK) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const long after = rssKiB("VmHWM:");
    std::fprintf(stderr, "[rank 0] RSS %ld KiB before the stranger, peak %ld KiB after\n", before, after);
    if (after - before > max_growth_kib) return 20;
  }
  return checkAllReduce(comm, hcInt32, hcSum, 1000, false, 1);
}

std::string tempPath() {
  char p[] = "/tmp/hicoll-stranger-XXXXXX";
  int fd = mkstemp(p);
  close(fd);
  unlink(p);
  return p;
}

// With the launcher's random secret, a stranger with the guessable one is refused, every time.
TEST(Rendezvous, RandomSecretKeepsStrangersOut) {
  Job job;
  job.nranks = 3;
  job.node = contiguous(3, 1);
  const int port = freePort();
  job.comm_id = "127.0.0.1:" + std::to_string(port);
  struct Counts {
    std::atomic<int> refused{0}, tries{0};
    std::atomic<bool> stop{false};
  };
  Shared<Counts> c;
  Helper stranger([&] {
    while (!c->stop) {
      int fd = connectLoopback(port);
      if (fd < 0) break;
      Hello h{kMagic, {}, 1, 3};
      derivedSecret(h.secret);
      uint32_t status = 99;
      ++c->tries;
      if (sendAll(fd, &h, sizeof h) && recv(fd, &status, 4, MSG_WAITALL) == 4 && status != 0) ++c->refused;
      if (recv(fd, &status, 4, 0) == 0) ++c->refused;  // or simply closed
      close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  auto st = run(job, [&](int, hcComm_t comm) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return checkAllReduce(comm, hcInt32, hcSum, 1000, false, 1);
  });
  c->stop = true;
  stranger.join();
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
  EXPECT_GT(c->tries.load(), 0);
}

// Eight strangers each send 64 MiB of garbage without a greeting: the server reads 32 bytes of
// each, and rank 0's memory stays where it was (it grew by 264 MB before).
TEST(Rendezvous, GarbageBeforeTheGreetingIsNotBuffered) {
  Job job;
  job.nranks = 2;
  job.node = contiguous(2, 1);
  const int port = freePort();
  job.comm_id = "127.0.0.1:" + std::to_string(port);
  const std::string done = tempPath();
  Helper strangers([&] {
    std::vector<std::thread> ts;
    for (int i = 0; i < 8; ++i)
      ts.emplace_back([&] {
        int fd = connectLoopback(port);
        if (fd < 0) return;
        std::vector<char> junk(1 << 20, 'x');
        for (int k = 0; k < 64 && sendAll(fd, junk.data(), junk.size()); ++k) {
        }
        close(fd);
      });
    for (auto& t : ts) t.join();
    std::ofstream(done) << "done\n";
  });
  auto st = run(job, [&](int rank, hcComm_t comm) { return waitAndMeasure(rank, comm, done.c_str(), 32 << 10); });
  strangers.join();
  unlink(done.c_str());
  for (int r = 0; r < job.nranks; ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
}

// No secret at all: a stranger computes the derived secret and logs in as rank 2 before the
// real rank 2 does.
struct StrangerRun {
  std::vector<int> status;
  bool logged_in = false;
  size_t stored = 0;
};

// greedy: the stranger tries to store 1 GiB under fresh keys; otherwise it only holds the slot.
StrangerRun strangerTakesRankTwo(bool greedy) {
  Job job;
  job.nranks = 3;
  job.node = contiguous(3, 1);
  job.no_secret = true;
  job.env["HICOLL_TIMEOUT_MS"] = "3000";
  job.timeout_s = 60;
  const int port = freePort();
  job.comm_id = "127.0.0.1:" + std::to_string(port);
  struct Seen {
    std::atomic<size_t> stored{0};
    std::atomic<bool> logged_in{false};
  };
  Shared<Seen> seen;
  Helper stranger([&] {
    int fd = connectLoopback(port);
    if (fd < 0) return;
    Hello h{kMagic, {}, 2, 3};
    derivedSecret(h.secret);
    uint32_t status = 99;
    if (!sendAll(fd, &h, sizeof h) || recv(fd, &status, 4, MSG_WAITALL) != 4 || status != 0) {
      close(fd);
      return;
    }
    seen->logged_in = true;
    std::vector<char> value(1 << 20, 'v');
    for (int i = 0; greedy && i < 1024; ++i) {
      std::string key = "junk/" + std::to_string(i);
      ReqHeader r{1, static_cast<uint32_t>(key.size()), value.size()};
      uint32_t ok = 1;
      if (!sendAll(fd, &r, sizeof r) || !sendAll(fd, key.data(), key.size()) ||
          !sendAll(fd, value.data(), value.size()) || recv(fd, &ok, 4, MSG_WAITALL) != 4)
        break;
      seen->stored += value.size();
    }
    std::this_thread::sleep_for(std::chrono::seconds(5));  // stays connected through teardown
    close(fd);
  });
  StrangerRun out;
  out.status = runRaw(job, [&](int rank) {
    if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the stranger is first
    const long before = rssKiB("VmRSS:");
    auto t0 = std::chrono::steady_clock::now();
    hcComm_t comm = nullptr;
    hcResult_t r = hcCommInitFromEnv(&comm);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string msg = hcGetLastError(nullptr);
    const long peak = rssKiB("VmHWM:");
    std::fprintf(stderr, "[%s stranger, rank %d] %s after %.2f s (RSS %ld -> peak %ld KiB): %s\n",
                 greedy ? "greedy" : "quiet", rank, hcGetErrorString(r), took, before, peak, msg.c_str());
    if (rank == 0 && peak - before > (200 << 10)) return 12;  // the communicator itself is ~90 MB of it
    if (greedy) {
      // Cut off at its quota, its keys dropped, its slot free again: the real rank 2 joins.
      if (r != hcSuccess) return 10;
      int rc = checkAllReduce(comm, hcInt32, hcSum, 1000, false, 1);
      t0 = std::chrono::steady_clock::now();
      hcCommDestroy(comm);
      const double teardown = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return rc ? rc : teardown > 3.5 ? 14 : 0;
    }
    // It keeps the slot: the real rank 2 is refused, and everybody fails within the timeout
    // (3 s) plus a teardown bounded by it.
    if (r == hcSuccess) return 10;
    if (rank == 2 && msg.find("already taken") == std::string::npos) return 11;
    return took > 7.5 ? 13 : 0;
  });
  stranger.join();
  out.logged_in = seen->logged_in;
  out.stored = seen->stored;
  std::fprintf(stderr, "%s stranger logged in: %d, stored %zu bytes before it was cut off\n",
               greedy ? "greedy" : "quiet", out.logged_in, out.stored);
  return out;
}

TEST(Rendezvous, GuessedSecretGreedyStrangerIsCutOff) {
  StrangerRun s = strangerTakesRankTwo(true);
  EXPECT_TRUE(s.logged_in) << "the derived secret is guessable: the stranger gets in (and must be contained)";
  EXPECT_LE(s.stored, size_t{4} << 20);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(s.status[r], 0) << "rank " << r;
}

TEST(Rendezvous, GuessedSecretQuietStrangerFailsTheJobCleanly) {
  StrangerRun s = strangerTakesRankTwo(false);
  EXPECT_TRUE(s.logged_in);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(s.status[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace hctest
