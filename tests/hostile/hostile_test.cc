// The hostile-environment tier (issue 27): real jobs in the places users run them. Each case
// builds a "container" -- a forked child in its own mount namespace (as root; skipped where
// unshare/mount is not permitted) with its own /dev/shm: Docker's default 64 MB, 8 MB, absent
// (a private /dev without shm, so shm_open fails with ENOENT), read-only, or a fresh default
// tmpfs with `ulimit -n 256` or `ulimit -v`; or ranks that share a host name (one
// HICOLL_TOPO_NODE label) but each have their own /dev/shm, or each their own PID namespace --
// and runs in it a job of the hierarchical AllGather / ReduceScatter (2 nodes x 2 ranks and
// 1 x 2), hcAllGatherQuantized across 2 nodes, and hcMemAlloc + hcAllGather from it.
//
// Required of every case: correct results on every rank, or a clean error on every rank (a
// result other than hcSuccess whose message names the cause) within the timeout; no rank dies
// of a signal; and afterwards no hicoll-* name in the /dev/shm the job saw (nor, for node memory
// of the job's processes, in the machine's). Also: kill -9 of a rank holding node memory in use,
// five times: survivors fail, bounded, and /dev/shm is empty after each job; and hcMemAlloc of
// absurd sizes returns an error, never a success that a later touch turns into SIGBUS.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "../common/mp.h"
#include "../common/reference.h"

namespace hctest {
namespace {

// ------------------------------------------------------------------------------------------
// Environments

enum class Shm { Fresh, Mb64, Mb8, Absent, ReadOnly };
enum class PerRank { None, OwnShm, OwnPid };

struct Env {
  const char* name;
  Shm shm = Shm::Fresh;
  rlim_t nofile = 0;    // RLIMIT_NOFILE of the job (0: unchanged)
  rlim_t as_bytes = 0;  // RLIMIT_AS of the job (0: unchanged)
  PerRank per_rank = PerRank::None;
  const char* cause;  // what an error message must name here (ECMAScript regex, any case)
};

constexpr rlim_t kGiB = rlim_t{1} << 30;

// ulimit -v: libfabric, the segments (16 MiB scratch + 128 MiB sort per rank by default) and
// glibc's per-thread arenas reserve address space. These jobs' ranks run today under 512 MiB
// and fail under 300 MiB (rank 0 cannot map its segment): 2 GiB is generous (must simply
// work), 256 MiB is tight (may fail, but cleanly, naming the cause on every rank).
constexpr rlim_t kAsGenerous = 2 * kGiB, kAsTight = rlim_t{256} << 20;

// An error about /dev/shm must say it is about /dev/shm (or shared memory), not only which
// call failed ("shm_open failed: No such file or directory" does not tell a user what to do).
const char* const kShmCause = R"(/dev/shm|shared memory|--shm-size)";
const char* const kAsCause = R"(address space|RLIMIT_AS|ulimit -v|Cannot allocate memory|out of memory)";

const Env kEnvs[] = {
    {"FreshDevShm", Shm::Fresh, 0, 0, PerRank::None, "$^"},  // the control: must simply work
    {"DevShm64MB", Shm::Mb64, 0, 0, PerRank::None, kShmCause},
    {"DevShm8MB", Shm::Mb8, 0, 0, PerRank::None, kShmCause},
    {"DevShmAbsent", Shm::Absent, 0, 0, PerRank::None, kShmCause},
    {"DevShmReadOnly", Shm::ReadOnly, 0, 0, PerRank::None, kShmCause},
    {"Nofile256", Shm::Fresh, 256, 0, PerRank::None, R"(open files|file descriptors|RLIMIT_NOFILE|ulimit -n|EMFILE)"},
    {"AddressSpace2GiB", Shm::Fresh, 0, kAsGenerous, PerRank::None, kAsCause},
    {"AddressSpace256MiB", Shm::Fresh, 0, kAsTight, PerRank::None, kAsCause},
    {"OneHostOwnDevShmPerRank", Shm::Fresh, 0, 0, PerRank::OwnShm,
     R"(namespace|cannot (map|share)|/dev/shm|same node|node-local)"},
    {"OneHostOwnPidNamespacePerRank", Shm::Fresh, 0, 0, PerRank::OwnPid,
     R"(namespace|cannot (map|share)|/dev/shm|same node|node-local|/proc)"},
};

// ------------------------------------------------------------------------------------------
// What the ranks and the container report (in memory shared with the forked processes)

constexpr int kMaxRanks = 4;
constexpr int kCorrect = 0, kWrong = 1, kCleanError = 3, kPeerError = 5;  // also the exit statuses

struct RankOut {
  int code;            // kCorrect / kWrong / kCleanError / kPeerError (exit status is the same)
  int pid;             // as the launcher's namespace sees it
  char msg[1024];      // the error or the first wrong value
  char shm_left[512];  // hicoll-* names left in the rank's own /dev/shm (OwnShm)
};

struct CaseOut {
  char setup[512];  // non-empty: the container could not be built (skipped if not permitted)
  bool not_permitted;
  int status[kMaxRanks];
  int nranks;
  int container_status;
  char shm_left[1024];  // hicoll-* names left in the job's /dev/shm after the job
  double seconds;
  RankOut rank[kMaxRanks];
  // The direct allocation checks
  int alloc_result[4];
  char alloc_msg[4][512];
  int alloc_touched[4];
};

void putf(char* dst, size_t n, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(dst, n, fmt, ap);
  va_end(ap);
}

std::string shmLeft(const char* dir = "/dev/shm") {
  std::string s;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d))
      if (std::strncmp(e->d_name, "hicoll", 6) == 0) s += std::string(s.empty() ? "" : " ") + e->d_name;
    closedir(d);
  }
  return s;
}

// ------------------------------------------------------------------------------------------
// Building the container (in a forked child; returns "" or what failed)

bool g_not_permitted = false;

std::string sysFail(const char* what) {
  const int e = errno;
  if (e == EPERM || e == EACCES) g_not_permitted = true;
  return std::string(what) + ": " + std::strerror(e);
}

std::string mountTmpfs(const char* where, const char* opts) {
  if (mount("tmpfs", where, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0)
    return sysFail((std::string("mount tmpfs on ") + where).c_str());
  return "";
}

// A private /dev without shm: a tmpfs holding binds of the few device nodes a process needs,
// moved over /dev. shm_open then fails with ENOENT, as on a system without /dev/shm.
std::string devWithoutShm() {
  char tmpl[] = "/tmp/hctest-dev-XXXXXX";
  if (!mkdtemp(tmpl)) return sysFail("mkdtemp");
  const std::string d = tmpl;
  std::string err = mountTmpfs(d.c_str(), "mode=755");
  for (const char* n : {"null", "zero", "random", "urandom", "full"}) {
    if (!err.empty()) break;
    const std::string f = d + "/" + n, src = std::string("/dev/") + n;
    int fd = open(f.c_str(), O_CREAT | O_WRONLY, 0666);
    if (fd >= 0) close(fd);
    if (mount(src.c_str(), f.c_str(), nullptr, MS_BIND, nullptr) != 0) err = sysFail(("bind " + src).c_str());
  }
  if (err.empty()) {
    symlink("/proc/self/fd", (d + "/fd").c_str());
    symlink("/proc/self/fd/0", (d + "/stdin").c_str());
    symlink("/proc/self/fd/1", (d + "/stdout").c_str());
    symlink("/proc/self/fd/2", (d + "/stderr").c_str());
    if (mount(d.c_str(), "/dev", nullptr, MS_MOVE, nullptr) != 0) err = sysFail("move the private /dev over /dev");
  }
  rmdir(d.c_str());
  if (!err.empty()) return err;
  int fd = shm_open("/hctest-probe", O_CREAT | O_RDWR, 0600);
  if (fd >= 0 || errno != ENOENT) {
    if (fd >= 0) close(fd), shm_unlink("/hctest-probe");
    return "the private /dev still lets shm_open create a name";
  }
  return "";
}

std::string enterContainer(const Env& e) {
  if (unshare(CLONE_NEWNS) != 0) return sysFail("unshare(CLONE_NEWNS)");
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return sysFail("mount --make-rprivate /");
  std::string err;
  switch (e.shm) {
    case Shm::Fresh: err = mountTmpfs("/dev/shm", "mode=1777"); break;
    case Shm::Mb64: err = mountTmpfs("/dev/shm", "mode=1777,size=64m"); break;
    case Shm::Mb8: err = mountTmpfs("/dev/shm", "mode=1777,size=8m"); break;
    case Shm::ReadOnly:
      err = mountTmpfs("/dev/shm", "mode=1777");
      if (err.empty() &&
          mount(nullptr, "/dev/shm", nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0)
        err = sysFail("remount /dev/shm read-only");
      if (err.empty()) {
        int fd = shm_open("/hctest-probe", O_CREAT | O_RDWR, 0600);
        if (fd >= 0) close(fd), err = "the read-only /dev/shm accepted a name";
      }
      break;
    case Shm::Absent: err = devWithoutShm(); break;
  }
  if (!err.empty()) return err;
  if (e.nofile) {
    rlimit r{e.nofile, e.nofile};
    if (setrlimit(RLIMIT_NOFILE, &r) != 0) return sysFail("setrlimit(RLIMIT_NOFILE)");
  }
  if (e.as_bytes) {
    rlimit r{e.as_bytes, e.as_bytes};
    if (setrlimit(RLIMIT_AS, &r) != 0) return sysFail("setrlimit(RLIMIT_AS)");
  }
  return "";
}

// Runs fn in a forked container for e; fills out.setup / container_status / shm_left.
void inContainer(const Env& e, CaseOut* out, const std::function<void()>& fn, int timeout_s) {
  std::fflush(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::string err = enterContainer(e);
    if (!err.empty()) {
      putf(out->setup, sizeof out->setup, "%s", err.c_str());
      out->not_permitted = g_not_permitted;
      _exit(0);
    }
    fn();
    putf(out->shm_left, sizeof out->shm_left, "%s", shmLeft().c_str());
    std::fflush(nullptr);
    _exit(0);
  }
  int st = 0;
  const auto end = t0 + std::chrono::seconds(timeout_s);
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      st = 124 << 8;
      break;
    }
    usleep(20000);
  }
  out->container_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ------------------------------------------------------------------------------------------
// The ranks' side

CaseOut* g_out = nullptr;  // shared with the forked processes

int rankError(int rank, const char* what, hcResult_t r, hcComm_t comm) {
  RankOut& o = g_out->rank[rank];
  putf(o.msg, sizeof o.msg, "%s: %s: %s", what, hcGetErrorString(r), hcGetLastError(comm));
  std::fprintf(stderr, "[rank %d] %s\n", rank, o.msg);
  return o.code = kCleanError;
}

int rankWrong(int rank, const std::string& what) {
  RankOut& o = g_out->rank[rank];
  putf(o.msg, sizeof o.msg, "%s", what.c_str());
  std::fprintf(stderr, "[rank %d] wrong: %s\n", rank, o.msg);
  return o.code = kWrong;
}

struct Ctx {
  int rank = 0, W = 0;
  explicit Ctx(hcComm_t c) {
    hcCommUserRank(c, &rank);
    hcCommCount(c, &W);
  }
};

// AllGather of count elements of t, in or out of place; checked element by element.
int agCheck(int rank, hcComm_t comm, hcDataType_t t, size_t count, bool in_place, int salt) {
  Ctx x(comm);
  const size_t e = hcTypeSize(t);
  std::vector<char> out(count * x.W * e, 0x5a), in(count * e);
  void* send = in_place ? out.data() + x.rank * count * e : in.data();
  for (size_t i = 0; i < count; ++i) store(send, t, i, inputValue(t, hcSum, x.rank, i, salt));
  const std::string what =
      std::string("hcAllGather ") + typeName(t) + " count " + std::to_string(count) + (in_place ? " in place" : "");
  if (hcResult_t r = hcAllGather(send, out.data(), count, t, comm, nullptr); r != hcSuccess)
    return rankError(rank, what.c_str(), r, comm);
  for (int q = 0; q < x.W; ++q)
    for (size_t i = 0; i < count; ++i)
      if (!matches(t, load(out.data(), t, q * count + i), inputValue(t, hcSum, q, i, salt)))
        return rankWrong(rank, what + ": element " + std::to_string(i) + " of rank " + std::to_string(q));
  return kCorrect;
}

int rsCheck(int rank, hcComm_t comm, hcDataType_t t, hcRedOp_t op, size_t count, int salt) {
  Ctx x(comm);
  const size_t e = hcTypeSize(t);
  std::vector<char> in(count * x.W * e), out(count * e, 0x5a);
  for (size_t i = 0; i < count * x.W; ++i) store(in.data(), t, i, inputValue(t, op, x.rank, i, salt));
  const std::string what =
      std::string("hcReduceScatter ") + typeName(t) + " " + opName(op) + " count " + std::to_string(count);
  if (hcResult_t r = hcReduceScatter(in.data(), out.data(), count, t, op, comm, nullptr); r != hcSuccess)
    return rankError(rank, what.c_str(), r, comm);
  std::vector<double> vals(x.W);
  for (size_t i = 0; i < count; ++i) {
    for (int q = 0; q < x.W; ++q) vals[q] = inputValue(t, op, q, x.rank * count + i, salt);
    if (!matches(t, load(out.data(), t, i), expectedReduce(t, op, vals, 1.0)))
      return rankWrong(rank, what + ": element " + std::to_string(i));
  }
  return kCorrect;
}

// The hierarchical AllGather and ReduceScatter: one chunk and several, both placements; then
// 12 MB per rank, the size of a large layer's shard, which fills most of the scratch buffer and
// 2 x 12 MB of the sort buffer on every rank (more than a 64 MB /dev/shm holds for 4 ranks).
int hierarchical(int rank, hcComm_t comm) {
  int salt = 0;
  for (size_t count : {size_t{1000}, size_t{600000}}) {
    for (bool ip : {false, true})
      if (int c = agCheck(rank, comm, hcFloat32, count, ip, ++salt)) return c;
    if (int c = rsCheck(rank, comm, hcFloat32, hcSum, count, ++salt)) return c;
    if (int c = rsCheck(rank, comm, hcBfloat16, hcMax, count, ++salt)) return c;
  }
  if (int c = agCheck(rank, comm, hcFloat32, 3000000, false, ++salt)) return c;
  return rsCheck(rank, comm, hcFloat32, hcSum, 3000000, ++salt);
}

double quantInput(int rank, size_t i) {
  const uint64_t h = (rank * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
  return (static_cast<double>((h >> 11) % 2001) / 1000.0 - 1.0) * std::ldexp(1.0, static_cast<int>((i / 300) % 9) - 4);
}

// hcAllGatherQuantized (float32, blocks of 256): every element within absmax/254 of its block.
int quantized(int rank, hcComm_t comm) {
  Ctx x(comm);
  for (size_t count : {size_t{70000}, size_t{600000}}) {
    std::vector<float> in(count), out(count * x.W);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(quantInput(x.rank, i));
    hcQuant q = HC_QUANT_INITIALIZER;
    const std::string what = "hcAllGatherQuantized float count " + std::to_string(count);
    if (hcResult_t r = hcAllGatherQuantized(in.data(), out.data(), count, hcFloat32, &q, comm, nullptr); r != hcSuccess)
      return rankError(rank, what.c_str(), r, comm);
    const size_t block = q.block ? q.block : 256;
    for (int p = 0; p < x.W; ++p)
      for (size_t lo = 0; lo < count; lo += block) {
        const size_t n = std::min(block, count - lo);
        double absmax = 0;
        for (size_t k = 0; k < n; ++k)
          absmax = std::max(absmax, std::abs(static_cast<double>(static_cast<float>(quantInput(p, lo + k)))));
        for (size_t k = 0; k < n; ++k) {
          const double want = static_cast<float>(quantInput(p, lo + k)), got = out[p * count + lo + k];
          if (!(std::abs(got - want) <= absmax / 254 * (1 + 1e-6) + std::abs(got) * 0x1p-24))
            return rankWrong(rank, what + ": rank " + std::to_string(p) + " element " + std::to_string(lo + k) +
                                       " sent " + std::to_string(want) + " got " + std::to_string(got));
        }
      }
  }
  return kCorrect;
}

// hcMemAlloc (send and receive buffers, as FSDP2's --pg-alloc does) + hcAllGather from it. A
// rank whose allocation fails says why; its peers learn it (an AllReduce of the flags on the
// heap) and stop too, as a program would.
int memAllGather(int rank, hcComm_t comm) {
  Ctx x(comm);
  const size_t count = size_t{1} << 20;  // 4 MiB per rank
  float *send = nullptr, *recv = nullptr;
  int failed = 0;
  hcResult_t r = hcMemAlloc(reinterpret_cast<void**>(&send), count * sizeof(float));
  if (r == hcSuccess) r = hcMemAlloc(reinterpret_cast<void**>(&recv), count * x.W * sizeof(float));
  if (r != hcSuccess) {
    rankError(rank, "hcMemAlloc", r, nullptr);
    failed = 1;
  }
  int any = 0;
  if (hcResult_t a = hcAllReduce(&failed, &any, 1, hcInt32, hcMax, comm, nullptr); a != hcSuccess) {
    hcMemFree(send);
    hcMemFree(recv);
    return failed ? kCleanError : rankError(rank, "hcAllReduce of the allocation flags", a, comm);
  }
  if (any) {
    hcMemFree(send);
    hcMemFree(recv);
    if (failed) return kCleanError;
    putf(g_out->rank[rank].msg, sizeof g_out->rank[rank].msg, "a peer's hcMemAlloc failed");
    return g_out->rank[rank].code = kPeerError;
  }
  // Touch every byte, as a user may once hcMemAlloc has succeeded.
  std::memset(recv, 0x5a, count * x.W * sizeof(float));
  for (size_t i = 0; i < count; ++i) send[i] = static_cast<float>(inputValue(hcFloat32, hcSum, x.rank, i, 7));
  int code = kCorrect;
  if (hcResult_t a = hcAllGather(send, recv, count, hcFloat32, comm, nullptr); a != hcSuccess) {
    code = rankError(rank, "hcAllGather from hcMemAlloc memory", a, comm);
  } else {
    for (int q = 0; q < x.W && code == kCorrect; ++q)
      for (size_t i = 0; i < count; ++i)
        if (recv[q * count + i] != static_cast<float>(inputValue(hcFloat32, hcSum, q, i, 7))) {
          code = rankWrong(rank, "hcAllGather from hcMemAlloc memory: element " + std::to_string(i) + " of rank " +
                                     std::to_string(q));
          break;
        }
  }
  hcMemFree(send);
  hcMemFree(recv);
  return code;
}

// One rank: communicator, body, destroy; the outcome in g_out->rank[rank].
int rankMain(int rank, const std::function<int(int, hcComm_t)>& body) {
  hcComm_t comm = nullptr;
  if (hcResult_t r = hcCommInitFromEnv(&comm); r != hcSuccess) return rankError(rank, "hcCommInitFromEnv", r, nullptr);
  int code = body(rank, comm);
  if (hcResult_t r = hcCommDestroy(comm); r != hcSuccess && code == kCorrect)
    code = rankError(rank, "hcCommDestroy", r, nullptr);
  return code;
}

// Per-rank namespaces: this rank gets its own mount namespace (OwnShm: with its own tmpfs on
// /dev/shm) or its own PID namespace (and /proc); the rank runs in a forked child, and this
// process reports what the child left in its /dev/shm.
int rankInNamespace(int rank, PerRank how, const std::function<int(int, hcComm_t)>& body) {
  RankOut& o = g_out->rank[rank];
  const int flags = how == PerRank::OwnPid ? CLONE_NEWNS | CLONE_NEWPID : CLONE_NEWNS;
  if (unshare(flags) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    putf(o.msg, sizeof o.msg, "test setup: per-rank unshare: %s", std::strerror(errno));
    return 99;
  }
  if (how == PerRank::OwnShm && mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) {
    putf(o.msg, sizeof o.msg, "test setup: per-rank /dev/shm: %s", std::strerror(errno));
    return 99;
  }
  std::fflush(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent && how != PerRank::OwnPid) _exit(1);
    if (how == PerRank::OwnPid &&
        (unshare(CLONE_NEWNS) != 0 || mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)) {
      putf(o.msg, sizeof o.msg, "test setup: /proc of the PID namespace: %s", std::strerror(errno));
      _exit(99);
    }
    int rc = rankMain(rank, body);
    std::fflush(nullptr);
    _exit(rc);
  }
  if (pid < 0) return 99;
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (how == PerRank::OwnShm) putf(o.shm_left, sizeof o.shm_left, "%s", shmLeft().c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// ------------------------------------------------------------------------------------------
// The cases

enum class Work { HierarchicalTwoNodes, HierarchicalOneNode, QuantizedTwoNodes, MemAllocAllGather };
const char* workName(Work w) {
  switch (w) {
    case Work::HierarchicalTwoNodes: return "AgRs2x2";
    case Work::HierarchicalOneNode: return "AgRs1x2";
    case Work::QuantizedTwoNodes: return "Quantized2x2";
    case Work::MemAllocAllGather: return "MemAllocAllGather2x2";
  }
  return "?";
}

void PrintTo(Work w, std::ostream* os) {
  *os << workName(w);
}

constexpr int kJobTimeoutS = 40;  // each job; HICOLL_TIMEOUT_MS is 5 s

Job jobFor(Work w) {
  Job job;
  job.nranks = w == Work::HierarchicalOneNode ? 2 : 4;
  job.node = w == Work::HierarchicalOneNode ? contiguous(1, 2) : contiguous(2, 2);
  job.env["HICOLL_TIMEOUT_MS"] = "5000";
  job.timeout_s = kJobTimeoutS;
  return job;
}

std::function<int(int, hcComm_t)> bodyFor(Work w) {
  switch (w) {
    case Work::HierarchicalTwoNodes:
    case Work::HierarchicalOneNode: return hierarchical;
    case Work::QuantizedTwoNodes: return quantized;
    case Work::MemAllocAllGather: return memAllGather;
  }
  return nullptr;
}

// hicoll-mem-<pid>-... names of these pids in the machine's /dev/shm.
std::string hostNamesOf(const std::vector<int>& pids) {
  std::string s;
  for (const std::string& n : [] {
         std::vector<std::string> v;
         if (DIR* d = opendir("/dev/shm")) {
           while (dirent* e = readdir(d)) v.push_back(e->d_name);
           closedir(d);
         }
         return v;
       }())
    for (int pid : pids)
      if (pid > 0 && n.rfind("hicoll-mem-" + std::to_string(pid) + "-", 0) == 0) s += n + " ";
  return s;
}

const char* describe(int status) {
  static thread_local char buf[64];
  if (status == 0) return "correct";
  if (status == kCleanError) return "error";
  if (status == kPeerError) return "stopped (a peer's allocation failed)";
  if (status == kWrong) return "WRONG RESULTS";
  if (status == 124) return "TIMED OUT (killed by the job's timeout)";
  if (status == 99) return "test setup failed";
  if (status > 128) {
    std::snprintf(buf, sizeof buf, "KILLED BY SIGNAL %d (%s)", status - 128, strsignal(status - 128));
    return buf;
  }
  std::snprintf(buf, sizeof buf, "exit %d", status);
  return buf;
}

class Hostile : public ::testing::TestWithParam<std::tuple<int, Work>> {};

TEST_P(Hostile, CorrectOrCleanErrorNoSignalNothingLeft) {
  const Env& e = kEnvs[std::get<0>(GetParam())];
  const Work w = std::get<1>(GetParam());
  Shared<CaseOut> out;
  g_out = &*out;
  const Job job = jobFor(w);
  out->nranks = job.nranks;
  const auto body = bodyFor(w);
  inContainer(
      e, &*out,
      [&] {
        std::vector<int> st = runRaw(job, [&](int rank) {
          g_out->rank[rank].pid = getpid();
          return e.per_rank == PerRank::None ? rankMain(rank, body) : rankInNamespace(rank, e.per_rank, body);
        });
        for (int r = 0; r < job.nranks; ++r) g_out->status[r] = st[r];
      },
      kJobTimeoutS + 20);
  if (out->setup[0]) {
    if (out->not_permitted) GTEST_SKIP() << "namespaces or mounts not permitted here: " << out->setup;
    FAIL() << "building the container: " << out->setup;
  }
  // The report of the case, whatever its outcome.
  std::string report =
      std::string(e.name) + " / " + workName(w) + " (" + std::to_string(out->seconds).substr(0, 5) + " s):";
  for (int r = 0; r < job.nranks; ++r) {
    report += "\n  rank " + std::to_string(r) + ": " + describe(out->status[r]);
    if (out->rank[r].msg[0]) report += std::string(" -- ") + out->rank[r].msg;
    if (out->rank[r].shm_left[0]) report += std::string(" [left in its /dev/shm: ") + out->rank[r].shm_left + "]";
  }
  report +=
      std::string("\n  job's /dev/shm afterwards: ") + (out->shm_left[0] ? out->shm_left : "(nothing of hicoll's)");
  std::printf("%s\n", report.c_str());
  ASSERT_EQ(out->container_status, 0) << "the container itself did not finish\n" << report;

  const std::regex cause(e.cause, std::regex::ECMAScript | std::regex::icase);
  int correct = 0, errors = 0, named = 0;
  for (int r = 0; r < job.nranks; ++r) {
    const int s = out->status[r];
    EXPECT_LT(s, 128) << "rank " << r << " died of a signal\n" << report;
    EXPECT_NE(s, 124) << "rank " << r << " did not finish within the job's timeout\n" << report;
    EXPECT_NE(s, kWrong) << "rank " << r << " returned success with wrong results\n" << report;
    EXPECT_NE(s, 99) << "rank " << r << ": test setup\n" << report;
    correct += s == kCorrect;
    if (s == kCleanError) {
      ++errors;
      const bool names = std::regex_search(out->rank[r].msg, cause);
      named += names;
      EXPECT_TRUE(names) << "rank " << r << "'s error does not name the cause (" << e.cause << "): " << out->rank[r].msg
                         << "\n"
                         << report;
    }
    if (s == kPeerError) ++errors;
    EXPECT_STREQ(out->rank[r].shm_left, "") << "left in rank " << r << "'s own /dev/shm\n" << report;
  }
  EXPECT_TRUE(correct == job.nranks || (errors == job.nranks && named > 0))
      << "want correct results on every rank or a clean error on every rank\n"
      << report;
  EXPECT_STREQ(out->shm_left, "") << "hicoll's names left in the job's /dev/shm\n" << report;
  std::vector<int> pids;
  for (int r = 0; r < job.nranks; ++r) pids.push_back(out->rank[r].pid);
  EXPECT_EQ(hostNamesOf(pids), "") << "the job's names in the machine's /dev/shm\n" << report;
}

INSTANTIATE_TEST_SUITE_P(Containers, Hostile,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(sizeof kEnvs / sizeof kEnvs[0])),
                                            ::testing::Values(Work::HierarchicalTwoNodes, Work::HierarchicalOneNode,
                                                              Work::QuantizedTwoNodes, Work::MemAllocAllGather)),
                         [](const ::testing::TestParamInfo<std::tuple<int, Work>>& i) {
                           return std::string(kEnvs[std::get<0>(i.param)].name) + "_" + workName(std::get<1>(i.param));
                         });

// ------------------------------------------------------------------------------------------
// kill -9 of a rank that holds node memory in use, five times (each time later in its loop of
// AllGathers from node memory): the survivors fail within the timeout, no one else dies of a
// signal, and the job's /dev/shm holds nothing of hicoll's after each job.

TEST(HostileKill, KilledHolderOfNodeMemoryLeavesNothing) {
  constexpr int kReps = 5;
  struct Rep {
    int status[kMaxRanks];
    char msg[kMaxRanks][512];
    char shm_left[512];
  };
  Shared<CaseOut> out;
  Shared<std::array<Rep, kReps>> reps;
  g_out = &*out;
  const Env fresh{"FreshDevShm", Shm::Fresh, 0, 0, PerRank::None, ""};
  inContainer(
      fresh, &*out,
      [&] {
        for (int rep = 0; rep < kReps; ++rep) {
          Job job = jobFor(Work::MemAllocAllGather);
          Rep& rp = (*reps)[rep];
          std::vector<int> st = run(job, [&](int rank, hcComm_t comm) {
            const size_t count = size_t{1} << 18;  // 1 MiB per rank
            float *send = nullptr, *recv = nullptr;
            if (hcMemAlloc(reinterpret_cast<void**>(&send), count * 4) != hcSuccess ||
                hcMemAlloc(reinterpret_cast<void**>(&recv), count * 4 * 4) != hcSuccess) {
              putf(rp.msg[rank], sizeof rp.msg[rank], "hcMemAlloc: %s", hcGetLastError(nullptr));
              return 4;
            }
            for (size_t i = 0; i < count; ++i) send[i] = static_cast<float>(rank + i % 7);
            for (int it = 0; it < 2000; ++it) {
              if (rank == 1 && it == 1)  // the victim, once its node memory was read: killed a
                std::thread([rep] {      // little later in its loop each time
                  std::this_thread::sleep_for(std::chrono::milliseconds(1 + 15 * rep));
                  raise(SIGKILL);
                })
                    .detach();
              if (hcResult_t r = hcAllGather(send, recv, count, hcFloat32, comm, nullptr); r != hcSuccess) {
                putf(rp.msg[rank], sizeof rp.msg[rank], "call %d: %s: %s", it, hcGetErrorString(r),
                     hcGetLastError(comm));
                hcMemFree(send);
                hcMemFree(recv);
                return kCleanError;
              }
            }
            putf(rp.msg[rank], sizeof rp.msg[rank], "2000 AllGathers succeeded although rank 1 was killed");
            hcMemFree(send);
            hcMemFree(recv);
            return 0;
          });
          for (int r = 0; r < job.nranks; ++r) rp.status[r] = st[r];
          putf(rp.shm_left, sizeof rp.shm_left, "%s", shmLeft().c_str());
        }
      },
      kReps * (kJobTimeoutS + 5));
  if (out->setup[0]) {
    if (out->not_permitted) GTEST_SKIP() << "namespaces or mounts not permitted here: " << out->setup;
    FAIL() << "building the container: " << out->setup;
  }
  ASSERT_EQ(out->container_status, 0);
  std::printf("kill -9 of a rank holding node memory, %d jobs of 2x2 (%.1f s):\n", kReps, out->seconds);
  for (int rep = 0; rep < kReps; ++rep) {
    const Rep& rp = (*reps)[rep];
    std::string line = "  job " + std::to_string(rep) + ":";
    for (int r = 0; r < 4; ++r) line += std::string(" rank ") + std::to_string(r) + " " + describe(rp.status[r]) + ";";
    std::printf("%s\n    /dev/shm after: %s\n", line.c_str(), rp.shm_left[0] ? rp.shm_left : "(nothing of hicoll's)");
    for (int r = 0; r < 4; ++r)
      if (rp.msg[r][0]) std::printf("    rank %d: %s\n", r, rp.msg[r]);
    EXPECT_EQ(rp.status[1], 128 + SIGKILL) << "job " << rep << ": the victim";
    for (int r : {0, 2, 3}) {
      EXPECT_EQ(rp.status[r], kCleanError)
          << "job " << rep << ", survivor rank " << r << ": " << describe(rp.status[r]) << " -- " << rp.msg[r];
    }
    EXPECT_STREQ(rp.shm_left, "") << "job " << rep << ": hicoll's names left in /dev/shm";
  }
  EXPECT_STREQ(out->shm_left, "") << "after all the jobs";
}

// ------------------------------------------------------------------------------------------
// hcMemAlloc of sizes the machine cannot back. Direct: each allocation in a forked process of a
// container (so that a signal is seen, and nothing it leaves outlives the case).

size_t memTotalBytes() {
  std::ifstream f("/proc/meminfo");
  std::string k;
  size_t v = 0, total = 0;
  std::string unit;
  while (f >> k >> v >> unit)
    if (k == "MemTotal:" || k == "SwapTotal:") total += v * 1024;
  return total;
}

// Allocates size in a forked child; on success touches every page when touch is set (a user
// may, once hcMemAlloc succeeded), else frees at once. Returns the child's status.
int allocInChild(size_t size, bool touch, int* result, char* msg, size_t msg_n, int* touched) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    void* p = nullptr;
    hcResult_t r = hcMemAlloc(&p, size);
    *result = r;
    putf(msg, msg_n, "%s", r == hcSuccess ? "" : hcGetLastError(nullptr));
    if (r == hcSuccess && touch) {
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      for (size_t o = 0; o < size; o += page) static_cast<volatile char*>(p)[o] = 1;
      *touched = 1;
    }
    if (r == hcSuccess) hcMemFree(p);
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string sizeName(size_t b) {
  if (b >= (size_t{1} << 40)) return std::to_string(b >> 40) + " TiB";
  return std::to_string(b >> 30) + " GiB";
}

// 64 GiB (or more, on a machine whose memory and swap exceed it) and 64 TiB: an error naming
// the size, on the calling rank; never success (nothing could back it).
TEST(HostileAlloc, AbsurdSizesFail) {
  const size_t mem = memTotalBytes();
  size_t big = size_t{64} << 30;
  while (big <= mem) big *= 2;
  const size_t sizes[2] = {big, size_t{64} << 40};
  Shared<CaseOut> out;
  const Env fresh{"FreshDevShm", Shm::Fresh, 0, 0, PerRank::None, ""};
  inContainer(
      fresh, &*out,
      [&] {
        for (int i = 0; i < 2; ++i)
          out->status[i] = allocInChild(sizes[i], false, &out->alloc_result[i], out->alloc_msg[i],
                                        sizeof out->alloc_msg[i], &out->alloc_touched[i]);
      },
      60);
  if (out->setup[0]) {
    if (out->not_permitted) GTEST_SKIP() << "namespaces or mounts not permitted here: " << out->setup;
    FAIL() << out->setup;
  }
  for (int i = 0; i < 2; ++i) {
    const int exit_status = out->status[i];
    std::printf("hcMemAlloc(%s) on a machine of %.1f GiB: %s%s%s (process: %s)\n", sizeName(sizes[i]).c_str(),
                mem / double(kGiB), hcGetErrorString(static_cast<hcResult_t>(out->alloc_result[i])),
                out->alloc_msg[i][0] ? ": " : "", out->alloc_msg[i], describe(exit_status));
    EXPECT_EQ(exit_status, 0) << sizeName(sizes[i]);
    EXPECT_NE(out->alloc_result[i], hcSuccess)
        << "hcMemAlloc(" << sizeName(sizes[i]) << ") succeeded on a machine of " << mem / double(kGiB) << " GiB";
    EXPECT_NE(out->alloc_msg[i][0], '\0') << "an error without a message";
  }
  EXPECT_STREQ(out->shm_left, "");
}

// 1 GiB with a /dev/shm of 8 MB or 64 MB: either an error that names the cause, or memory that
// is really there (every page touched without a signal); never success and then SIGBUS.
class HostileSmallShmAlloc : public ::testing::TestWithParam<int> {};

TEST_P(HostileSmallShmAlloc, OneGiBFailsCleanlyOrIsUsable) {
  const Env& e = kEnvs[GetParam()];
  Shared<CaseOut> out;
  inContainer(
      e, &*out,
      [&] {
        out->status[0] = allocInChild(size_t{1} << 30, true, &out->alloc_result[0], out->alloc_msg[0],
                                      sizeof out->alloc_msg[0], &out->alloc_touched[0]);
      },
      60);
  if (out->setup[0]) {
    if (out->not_permitted) GTEST_SKIP() << "namespaces or mounts not permitted here: " << out->setup;
    FAIL() << out->setup;
  }
  std::printf("%s: hcMemAlloc(1 GiB): %s%s%s; %s; process: %s\n", e.name,
              hcGetErrorString(static_cast<hcResult_t>(out->alloc_result[0])), out->alloc_msg[0][0] ? ": " : "",
              out->alloc_msg[0], out->alloc_touched[0] ? "every page touched" : "not touched",
              describe(out->status[0]));
  EXPECT_EQ(out->status[0], 0) << "the process died: " << describe(out->status[0]);
  if (out->alloc_result[0] != hcSuccess)
    EXPECT_TRUE(std::regex_search(out->alloc_msg[0], std::regex(kShmCause, std::regex::icase)))
        << "the error does not name /dev/shm: " << out->alloc_msg[0];
  else EXPECT_EQ(out->alloc_touched[0], 1) << "success, but the memory could not be touched";
  EXPECT_STREQ(out->shm_left, "");
}

INSTANTIATE_TEST_SUITE_P(Containers, HostileSmallShmAlloc, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) { return std::string(kEnvs[i.param].name); });

}  // namespace
}  // namespace hctest
