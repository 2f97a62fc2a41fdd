#include "transport/ofi/fi_resources.h"

#include <cstdlib>
#include <cstring>

#include "base/log.h"

namespace hicoll::ofi {

std::string resolveProvider(const std::string& knob) {
  const char* env = std::getenv("FI_PROVIDER");
  if (env && *env && !std::strchr(env, ',') && env[0] != '^') return env;
  return knob.empty() ? kDefaultProvider : knob;
}

std::string fiStr(long rc) {
  return fmt::format("{} ({})", fabricLib().strerror(static_cast<int>(rc < 0 ? -rc : rc)), rc);
}

const char* fidClassName(size_t fclass) {
  switch (fclass) {
    case FI_CLASS_FABRIC: return "fabric";
    case FI_CLASS_DOMAIN: return "domain";
    case FI_CLASS_EP: return "endpoint";
    case FI_CLASS_CQ: return "cq";
    case FI_CLASS_AV: return "av";
    case FI_CLASS_MR: return "mr";
    default: return "fid";
  }
}

void closeFid(fid* f) {
  const char* cls = fidClassName(f->fclass);
  if (int rc = fi_close(f); rc != 0) HC_WARN("ofi: fi_close({}): {}", cls, fiStr(rc));
}

}  // namespace hicoll::ofi
