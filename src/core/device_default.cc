// Host-only defaults of the device hooks. Weak: src/device/ provides the real ones in CUDA
// builds, and the linker prefers them.
#include "core/device.h"

namespace hicoll {

__attribute__((weak)) std::unique_ptr<DeviceEngine> makeDeviceEngine(hcComm&) { return nullptr; }
__attribute__((weak)) bool isDevicePointer(const void*) { return false; }

}  // namespace hicoll
