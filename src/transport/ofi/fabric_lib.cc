#include "transport/ofi/fabric_lib.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "base/error.h"
#include "base/log.h"

namespace hicoll::ofi {
namespace {

constexpr const char* kLibName = "libfabric.so.1";

template <class F>
void resolve(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  HC_CHECK(out != nullptr, hcUnsupported, "ofi: {} has no symbol {}: {}", kLibName, name, dlerror());
}

}  // namespace

const FabricLib& fabricLib() {
  static std::once_flag once;
  static FabricLib lib{};
  static std::string error;
  std::call_once(once, [] {
    // The PSM libraries honour these; without them they take over the process's signals.
    // libfabric's own variables (FI_*) are left to the user.
    setenv("IPATH_NO_BACKTRACE", "1", 0);
    setenv("HFI_NO_BACKTRACE", "1", 0);
    void* h = dlopen(kLibName, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      error = fmt::format("ofi: cannot load {} ({}): install libfabric (Debian: libfabric1) to run across nodes",
                          kLibName, dlerror());
      return;
    }
    try {
      resolve(h, "fi_getinfo", lib.getinfo);
      resolve(h, "fi_freeinfo", lib.freeinfo);
      resolve(h, "fi_dupinfo", lib.dupinfo);
      resolve(h, "fi_fabric", lib.fabric);
      resolve(h, "fi_strerror", lib.strerror);
      resolve(h, "fi_version", lib.version);
    } catch (const Error& e) {
      error = e.what();
      lib = FabricLib{};
      return;
    }
    const uint32_t v = lib.version();
    HC_INFO("ofi: loaded {} (libfabric {}.{})", kLibName, FI_MAJOR(v), FI_MINOR(v));
  });
  HC_CHECK(error.empty(), hcUnsupported, "{}", error);
  return lib;
}

}  // namespace hicoll::ofi
