#include "device/cuda_ipc.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "base/log.h"
#include "device/cuda_check.h"

namespace hicoll {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "cudaIpcMemHandle_t size changed");

IpcHandle ipcExport(void* base) {
  cudaIpcMemHandle_t h;
  HC_CUDA(cudaIpcGetMemHandle(&h, base));
  IpcHandle out;
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

void* IpcMappings::open(const IpcHandle& h) {
  auto it = open_.find(h);
  if (it != open_.end()) return it->second;
  cudaIpcMemHandle_t ch;
  std::memcpy(&ch, h.data(), sizeof ch);
  void* p = nullptr;
  HC_CUDA(cudaIpcOpenMemHandle(&p, ch, cudaIpcMemLazyEnablePeerAccess));
  open_.emplace(h, p);
  return p;
}

IpcMappings::~IpcMappings() {
  for (auto& [h, p] : open_) {
    cudaError_t e = cudaIpcCloseMemHandle(p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      HC_WARN("cudaIpcCloseMemHandle: {}", cudaGetErrorString(e));
    }
  }
}

}  // namespace hicoll
