// Host-only builds: no device path. Calls with a stream fail with hcUnsupported (api.cc).
#include "core/device.h"

namespace hicoll {

std::unique_ptr<DeviceEngine> makeDeviceEngine(const DeviceParts&) {
  return nullptr;
}
bool isDevicePointer(const void*) {
  return false;
}

}  // namespace hicoll
