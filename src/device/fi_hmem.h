// Whether the libfabric provider in use can send from and receive into GPU memory (FI_HMEM
// with CUDA registration). Debian's libfabric 1.17 is built without CUDA support, so the
// device path stages inter-node traffic through pinned host memory; this probe says so.
#pragma once

#include <string>

namespace hicoll::dev {

struct HmemProbe {
  bool cuda_registration = false;  // the provider registered a CUDA buffer with FI_HMEM_CUDA
  std::string detail;              // one sentence for the log
};

// provider: HICOLL_OFI_PROVIDER (FI_PROVIDER wins when set); dev_buf: len bytes of device
// memory on cuda_device to try registering.
HmemProbe probeFiHmem(const std::string& provider, int cuda_device, void* dev_buf, size_t len);

}  // namespace hicoll::dev
