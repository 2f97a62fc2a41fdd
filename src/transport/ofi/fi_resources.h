// The one home of libfabric's RAII wrappers and of which provider hicoll asks for, shared by the
// transport and the device path's FI_HMEM probe (so both ask libfabric for the same provider).
#pragma once

#include <rdma/fabric.h>

#include <memory>
#include <string>
#include <utility>

#include "transport/ofi/fabric_lib.h"

namespace hicoll::ofi {

constexpr uint32_t kFiApiVersion = FI_VERSION(1, 14);
constexpr const char* kDefaultProvider = "tcp;ofi_rxm";

// The provider to ask for: FI_PROVIDER when it names one provider, else knob (HICOLL_OFI_PROVIDER),
// else tcp;ofi_rxm. A list ("tcp,net") or an exclusion ("^psm2") is libfabric's own filter over
// the providers it lists, not a name: it is left to libfabric, and the knob is asked for.
std::string resolveProvider(const std::string& knob);

// "<text> (<rc>)" for a libfabric return code.
std::string fiStr(long rc);
const char* fidClassName(size_t fclass);
// fi_close with a WARN naming the class when it fails.
void closeFid(fid* f);

// Owns one fid_* (every one starts with its struct fid).
template <class T>
class FidPtr {
 public:
  FidPtr() = default;
  ~FidPtr() { reset(); }
  FidPtr(const FidPtr&) = delete;
  FidPtr& operator=(const FidPtr&) = delete;
  FidPtr(FidPtr&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  FidPtr& operator=(FidPtr&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  T* get() const { return p_; }
  T** out() {
    reset();
    return &p_;
  }
  explicit operator bool() const { return p_ != nullptr; }
  void reset() {
    if (p_) closeFid(&std::exchange(p_, nullptr)->fid);
  }
  // Closes without logging; on failure the object is abandoned (libfabric keeps it).
  int close() {
    int rc = p_ ? fi_close(&p_->fid) : 0;
    p_ = nullptr;
    return rc;
  }

 private:
  T* p_ = nullptr;
};

struct InfoDeleter {
  void operator()(fi_info* i) const { fabricLib().freeinfo(i); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

}  // namespace hicoll::ofi
