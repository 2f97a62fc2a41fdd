#include "fallback/nccl/nccl_library.h"

#include <dlfcn.h>

#include <vector>

#include "base/error.h"

namespace hicoll::nccl {
namespace {

const char* const kSymbols[] = {
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommGetAsyncError",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclSend",
    "ncclRecv",
    "ncclGroupStart",
    "ncclGroupEnd",
};

std::string versionString(int code) {
  // NCCL_VERSION_CODE is X*10000 + Y*100 + Z since 2.9 (X*1000 + Y*100 + Z before).
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);
}

}  // namespace

const char* const* symbolNames(size_t* count) {
  *count = sizeof kSymbols / sizeof kSymbols[0];
  return kSymbols;
}

std::shared_ptr<Library> Library::open(const std::string& path) {
  HC_CHECK(!path.empty(), hcInvalidArgument, "NCCL fallback: HICOLL_NCCL_LIB is empty");
  dlerror();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* why = dlerror();
    HC_THROW(hcSystemError, "NCCL fallback: cannot load '{}' (set HICOLL_NCCL_LIB to libnccl.so.2): {}", path,
             why ? why : "unknown dlopen error");
  }
  std::shared_ptr<Library> lib(new Library());
  lib->handle_ = h;
  lib->path_ = path;

  std::vector<void*> addr(sizeof kSymbols / sizeof kSymbols[0], nullptr);
  std::string missing;
  for (size_t i = 0; i < addr.size(); ++i) {
    addr[i] = dlsym(h, kSymbols[i]);
    if (!addr[i]) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", kSymbols[i]);
  }
  HC_CHECK(missing.empty(), hcUnsupported, "NCCL fallback: '{}' lacks {} (NCCL >= {} is required)", path, missing,
           versionString(kMinVersion));
  Functions& f = lib->fn_;
  size_t i = 0;
  // Same order as kSymbols.
  f.getVersion = reinterpret_cast<GetVersionFn>(addr[i++]);
  f.getUniqueId = reinterpret_cast<GetUniqueIdFn>(addr[i++]);
  f.commInitRank = reinterpret_cast<CommInitRankFn>(addr[i++]);
  f.commDestroy = reinterpret_cast<CommDestroyFn>(addr[i++]);
  f.commAbort = reinterpret_cast<CommAbortFn>(addr[i++]);
  f.commGetAsyncError = reinterpret_cast<CommGetAsyncErrorFn>(addr[i++]);
  f.getErrorString = reinterpret_cast<GetErrorStringFn>(addr[i++]);
  f.getLastError = reinterpret_cast<GetLastErrorFn>(addr[i++]);
  f.allGather = reinterpret_cast<AllGatherFn>(addr[i++]);
  f.reduceScatter = reinterpret_cast<ReduceScatterFn>(addr[i++]);
  f.allReduce = reinterpret_cast<AllReduceFn>(addr[i++]);
  f.broadcast = reinterpret_cast<BroadcastFn>(addr[i++]);
  f.redOpCreatePreMulSum = reinterpret_cast<RedOpCreatePreMulSumFn>(addr[i++]);
  f.redOpDestroy = reinterpret_cast<RedOpDestroyFn>(addr[i++]);
  f.send = reinterpret_cast<SendFn>(addr[i++]);
  f.recv = reinterpret_cast<RecvFn>(addr[i++]);
  f.groupStart = reinterpret_cast<GroupStartFn>(addr[i++]);
  f.groupEnd = reinterpret_cast<GroupEndFn>(addr[i++]);

  int v = 0;
  Result r = f.getVersion(&v);
  HC_CHECK(r == Success, hcSystemError, "NCCL fallback: ncclGetVersion in '{}' failed with code {}", path,
           static_cast<int>(r));
  HC_CHECK(v >= kMinVersion, hcUnsupported, "NCCL fallback: '{}' is NCCL {}; NCCL >= {} is required", path,
           versionString(v), versionString(kMinVersion));
  lib->version_ = v;
  return lib;
}

Library::~Library() {
  if (handle_) dlclose(handle_);
}

std::string Library::describe(Result r, CommHandle comm) const {
  std::string s = fn_.getErrorString ? fn_.getErrorString(r) : "";
  if (s.empty()) s = fmt::format("NCCL error {}", static_cast<int>(r));
  const char* last = comm && fn_.getLastError ? fn_.getLastError(comm) : nullptr;
  if (last && *last) s += fmt::format(" ({})", last);
  return s;
}

}  // namespace hicoll::nccl
