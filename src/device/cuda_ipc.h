// CUDA IPC between the ranks (processes) of one node: a rank exports a device allocation as
// a cudaIpcMemHandle_t, its peers map it once and keep the mapping. The device path maps each
// local peer's sort buffer this way and then moves data with cudaMemcpyAsync peer copies
// (copy engines; over NVLink when the peers sit on different GPUs).
#pragma once

#include <array>
#include <cstddef>
#include <map>

namespace hicoll {

constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
using IpcHandle = std::array<char, kIpcHandleBytes>;

// The handle of a cudaMalloc'd allocation (ptr must be its base). Throws hicoll::Error.
IpcHandle ipcExport(void* base);

// Mappings of peers' allocations, opened once per distinct handle and closed together. A
// handle names one allocation of one process, so a cached mapping never goes stale while the
// exporter keeps the allocation (the device path keeps it for the communicator's life).
class IpcMappings {
 public:
  IpcMappings() = default;
  ~IpcMappings();
  IpcMappings(const IpcMappings&) = delete;
  IpcMappings& operator=(const IpcMappings&) = delete;

  // The peer's allocation mapped in this process (cudaIpcOpenMemHandle with lazy peer access).
  void* open(const IpcHandle& h);
  size_t size() const { return open_.size(); }

 private:
  std::map<IpcHandle, void*> open_;
};

}  // namespace hicoll
