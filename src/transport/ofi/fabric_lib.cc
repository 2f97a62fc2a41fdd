#include "transport/ofi/fabric_lib.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "transport/ofi/fi_resources.h"

namespace hicoll::ofi {
namespace {

constexpr const char* kLibName = "libfabric.so.1";
bool g_eager_set_by_hicoll = false;

template <class F>
void resolve(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  HC_CHECK(out != nullptr, hcUnsupported, "ofi: {} has no symbol {}: {}", kLibName, name, dlerror());
}

// setenv is not safe while other threads read the environment (glibc reallocates environ
// under a concurrent getenv: a SIGSEGV seen with threads as ranks), so hicoll writes every
// variable it sets once, when the library loads, before any thread of its own exists.
__attribute__((constructor)) void setProcessEnvironment() {
  // The PSM libraries honour these; without them they take over the process's signals.
  setenv("IPATH_NO_BACKTRACE", "1", 0);
  setenv("HFI_NO_BACKTRACE", "1", 0);
  try {
    const Config cfg = Config::fromEnv();
    if (resolveProvider(cfg.str(Knob::OfiProvider)).find("rxm") == std::string::npos) return;
    if (cfg.str(Knob::OfiRxmLean) == "1") {  // overwrite = 0: the user's values win
      setenv("FI_OFI_RXM_MSG_RX_SIZE", "1024", 0);
      setenv("FI_OFI_RXM_BUFFER_SIZE", "8192", 0);
    }
    if (std::getenv("FI_OFI_RXM_EAGER_LIMIT") || cfg.str(Knob::OfiRxmEager) != "1") return;
    setenv("FI_OFI_RXM_EAGER_LIMIT", std::to_string(cfg.netChunkCap()).c_str(), 0);
    g_eager_set_by_hicoll = true;
  } catch (...) {
    // A knob that does not parse is reported, naming it, when a communicator is created.
  }
}

}  // namespace

bool rxmEagerLimitSetByHicoll() {
  return g_eager_set_by_hicoll;
}

const FabricLib& fabricLib() {
  static std::once_flag once;
  static FabricLib lib{};
  static std::string error;
  std::call_once(once, [] {
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
