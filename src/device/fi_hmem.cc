#include "device/fi_hmem.h"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <sys/uio.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "transport/ofi/fi_resources.h"

namespace hicoll::dev {
namespace {

using ofi::FidPtr;
using ofi::InfoPtr;
using ofi::kFiApiVersion;

std::string libVersion() {
  const uint32_t v = ofi::fabricLib().version();
  return fmt::format("{}.{}", FI_MAJOR(v), FI_MINOR(v));
}

}  // namespace

HmemProbe probeFiHmem(const std::string& provider_knob, int cuda_device, void* dev_buf, size_t len) {
  HmemProbe out;
  const std::string provider = ofi::resolveProvider(provider_knob);  // as the transport asks
  InfoPtr hints(ofi::fabricLib().dupinfo(nullptr));
  if (!hints) {
    out.detail = "fi_allocinfo failed";
    return out;
  }
  hints->caps = FI_TAGGED | FI_MSG | FI_HMEM;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_HMEM | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(provider.c_str());  // freed by fi_freeinfo
  fi_info* raw = nullptr;
  int rc = ofi::fabricLib().getinfo(kFiApiVersion, nullptr, nullptr, 0, hints.get(), &raw);
  InfoPtr info(raw);
  if (rc != 0 || !info) {
    out.detail = fmt::format("provider '{}' of libfabric {} offers no FI_HMEM endpoint ({})", provider, libVersion(),
                             ofi::fabricLib().strerror(-rc));
    return out;
  }
  FidPtr<fid_fabric> fabric;
  rc = ofi::fabricLib().fabric(info->fabric_attr, fabric.out(), nullptr);
  if (rc != 0) {
    out.detail = fmt::format("provider '{}' advertises FI_HMEM but fi_fabric failed: {}", provider,
                             ofi::fabricLib().strerror(-rc));
    return out;
  }
  FidPtr<fid_domain> domain;
  rc = fi_domain(fabric.get(), info.get(), domain.out(), nullptr);
  if (rc != 0) {
    out.detail = fmt::format("provider '{}' advertises FI_HMEM but fi_domain failed: {}", provider,
                             ofi::fabricLib().strerror(-rc));
    return out;
  }
  iovec iov{dev_buf, len};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_SEND | FI_RECV;
  attr.iface = FI_HMEM_CUDA;
  attr.device.cuda = cuda_device;
  FidPtr<fid_mr> mr;
  rc = fi_mr_regattr(domain.get(), &attr, 0, mr.out());
  if (rc != 0) {
    out.detail = fmt::format(
        "provider '{}' of libfabric {} advertises FI_HMEM but cannot register CUDA memory ({}); "
        "libfabric was built without CUDA support",
        provider, libVersion(), ofi::fabricLib().strerror(-rc));
    return out;
  }
  mr.reset();
  out.cuda_registration = true;
  out.detail =
      fmt::format("provider '{}' of libfabric {} registers CUDA memory (FI_HMEM_CUDA)", provider, libVersion());
  return out;
}

}  // namespace hicoll::dev
