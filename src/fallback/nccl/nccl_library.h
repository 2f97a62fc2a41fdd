// libnccl loaded with dlopen into a function table. Every symbol is resolved when the library
// is opened, so a library that lacks one (too old, or not NCCL) is refused up front with an
// error status naming the symbols, never an exit() or a crash at the first collective.
#pragma once

#include <memory>
#include <string>

#include "fallback/nccl/nccl_abi.h"

namespace hicoll::nccl {

// NCCL 2.13 is the oldest with every symbol below (ncclGetLastError came last).
constexpr int kMinVersion = 21300;

struct Functions {
  GetVersionFn getVersion = nullptr;
  GetUniqueIdFn getUniqueId = nullptr;
  CommInitRankFn commInitRank = nullptr;
  CommDestroyFn commDestroy = nullptr;
  CommAbortFn commAbort = nullptr;
  CommGetAsyncErrorFn commGetAsyncError = nullptr;
  GetErrorStringFn getErrorString = nullptr;
  GetLastErrorFn getLastError = nullptr;
  AllGatherFn allGather = nullptr;
  ReduceScatterFn reduceScatter = nullptr;
  AllReduceFn allReduce = nullptr;
  BroadcastFn broadcast = nullptr;
  RedOpCreatePreMulSumFn redOpCreatePreMulSum = nullptr;
  RedOpDestroyFn redOpDestroy = nullptr;
  SendFn send = nullptr;
  RecvFn recv = nullptr;
  GroupStartFn groupStart = nullptr;
  GroupEndFn groupEnd = nullptr;
};

class Library {
 public:
  // dlopen(path) and resolve every symbol. Throws hicoll::Error: hcSystemError when the
  // library cannot be loaded (dlerror's text), hcUnsupported when symbols are missing (all of
  // them named) or the version is older than kMinVersion.
  static std::shared_ptr<Library> open(const std::string& path);
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  const Functions& fn() const { return fn_; }
  const std::string& path() const { return path_; }
  int version() const { return version_; }  // NCCL_VERSION_CODE, e.g. 22809
  // "ncclAllGather: invalid argument (<ncclGetLastError text>)"
  std::string describe(Result r, CommHandle comm) const;

 private:
  Library() = default;
  void* handle_ = nullptr;
  std::string path_;
  int version_ = 0;
  Functions fn_;
};

// The symbol names, in Functions order (tests build stand-ins that omit one).
const char* const* symbolNames(size_t* count);

}  // namespace hicoll::nccl
