// The NCCL fallback of the device path: hicoll's collectives forwarded to NCCL on the user's
// stream. The NCCL communicator is created on first use, with its unique id passed over
// hicoll's bootstrap, so a communicator that never falls back never loads NCCL.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/coll.h"
#include "fallback/nccl/nccl_library.h"

namespace hicoll::nccl {

// hicoll -> NCCL mappings (throw hcInvalidArgument for values NCCL has no match for).
DataType toNccl(hcDataType_t t);
RedOp toNccl(OpKind k);  // built-in ops only; PreMulSum is created per call; bitwise: hcUnsupported
// How many leading elements of a one-rank reduction NCCL 2.19.1-2.29.2's oneRankReduce kernel
// writes (the rest, fewer than 32, it skips); count itself for counts it covers.
size_t oneRankKernelCovers(size_t count, size_t esize);

// The bootstrap collectives the fallback needs (all ranks call them in the same order).
struct BootstrapOps {
  std::function<void(const void* mine, void* all, size_t len)> allgather;
  std::function<void(void* data, size_t len, int root)> broadcast;
};

class Fallback {
 public:
  Fallback(std::string lib_path, int rank, int nranks, BootstrapOps ops);
  ~Fallback();  // ncclCommDestroy, or ncclCommAbort after abort()
  Fallback(const Fallback&) = delete;
  Fallback& operator=(const Fallback&) = delete;

  // Enqueues a on NCCL (a.stream is the cudaStream_t). The first call on every rank creates
  // the NCCL communicator (collective). Throws hicoll::Error naming the NCCL function, its
  // error string and ncclGetLastError's text; hcUnsupported for a bitwise op (before any
  // NCCL call).
  void run(const CollArgs& a);
  // Point-to-point on device buffers: ncclSend / ncclRecv of count elements with peer on
  // stream, enqueued (the first call creates the communicator, as run() does). grouped: the
  // first such call opens an NCCL group (after the communicator exists: a creation inside a
  // group would wait for its end), which endGroup closes.
  void sendRecv(bool send, void* buf, size_t count, hcDataType_t dtype, int peer, Stream stream, bool grouped);
  // ncclGroupEnd of the group sendRecv opened; nothing when none is open.
  void endGroup();
  // The communicator is unusable: destroy it with ncclCommAbort.
  void abort() { aborted_ = true; }
  bool initialized() const { return comm_ != nullptr; }
  const Library* library() const { return lib_.get(); }

 private:
  void init();
  // Creates the communicator at the first call, then checks NCCL's asynchronous error; what
  // describes the call for messages.
  void ready(const std::function<std::string()>& what);
  void check(Result r, const char* fn, const CollArgs& a);
  // what(): the call, formatted only on an error.
  void check(Result r, const char* fn, const std::function<std::string()>& what);

  std::string lib_path_;
  int rank_, nranks_;
  BootstrapOps ops_;
  std::shared_ptr<Library> lib_;
  CommHandle comm_ = nullptr;
  bool aborted_ = false;
  bool group_open_ = false;           // sendRecv opened an NCCL group that endGroup has not closed
  hcResult_t init_code_ = hcSuccess;  // a failed creation is repeated to later calls
  std::string init_error_;
};

}  // namespace hicoll::nccl
