#include "transport/ofi/ofi_endpoint.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "base/log.h"
#include "transport/ofi/fabric_lib.h"
#include "transport/tags.h"

namespace hicoll::ofi {
namespace {

// rxm sends messages above its eager limit (its bounce buffers' size unless set) by SAR or
// rendezvous; hicoll's pipelines keep a few chunks in flight per peer, and measured on 1 Gbit/s
// netns links, chunks sent as rendezvous messages left the links idle part of the time
// (perf/results/2026-11-30.md). Over tcp, eager messages larger than rxm's bounce buffers are
// received straight into the posted buffer, so raising the limit costs no memory. hicoll sets it
// when it loads (fabric_lib.cc), with the receive buffers (HICOLL_OFI_RXM_LEAN); this says which
// values libfabric will run with.
void logRxmSettings(const std::string& provider) {
  static std::once_flag once;
  if (provider.find("rxm") == std::string::npos) return;
  std::call_once(once, [] {
    auto var = [](const char* name) {
      const char* v = std::getenv(name);
      return std::string(v ? v : "unset (rxm's default)");
    };
    HC_INFO("ofi: FI_OFI_RXM_MSG_RX_SIZE={} FI_OFI_RXM_BUFFER_SIZE={}", var("FI_OFI_RXM_MSG_RX_SIZE"),
            var("FI_OFI_RXM_BUFFER_SIZE"));
    const char* env = std::getenv("FI_OFI_RXM_EAGER_LIMIT");
    if (!env) return;
    HC_INFO("ofi: FI_OFI_RXM_EAGER_LIMIT={} ({})", env,
            ofi::rxmEagerLimitSetByHicoll()
                ? "set by hicoll from HICOLL_OFI_RXM_EAGER=1 and the net chunk: net chunks go eager; effective if "
                  "libfabric was not initialized earlier in this process"
                : "from the environment");
  });
}

}  // namespace

int tagBitsOf(uint64_t mem_tag_format) {
  // aws-ofi-nccl's reading: bits above the highest set bit are not carried.
  return mem_tag_format == 0 ? 64 : 64 - __builtin_clzll(mem_tag_format);
}

// The IPv4 address of a network interface (port 0); false for names that are not one (efa
// device names, for instance).
bool ifaceIpv4(const std::string& iface, sockaddr_in* out) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> guard(list, freeifaddrs);
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && iface == a->ifa_name) {
      std::memcpy(out, a->ifa_addr, sizeof(*out));
      out->sin_port = 0;
      return true;
    }
  }
  return false;
}

Endpoint::~Endpoint() {
  std::lock_guard<std::mutex> lk(mu);
  for (Op& op : ops)
    if (op.in_use && ep) fi_cancel(&ep.get()->fid, &op.ctx);
  ep.reset();
  cache.clear();
  orphan_mrs.clear();
  av.reset();
  cq.reset();
  int rc = domain.close();
  if (rc == -FI_EBUSY && ops_in_use > 0) {
    // libfabric 1.17's ofi_rxm keeps an unfinished rendezvous send (its peer never received it)
    // after the endpoint is closed, and with it the domain.
    HC_WARN("ofi: endpoint closed with {} operations unfinished; provider {} kept its domain busy, which is leaked",
            ops_in_use, provider);
  } else if (rc != 0) {
    HC_WARN("ofi: fi_close(domain): {}", fiStr(rc));
  }
  if (rc == 0) fabric.reset();
  else fabric.close();
}

namespace {

// One fi_getinfo attempt; nullptr when nothing fits. libfabric 1.17's tcp and net list every
// interface whatever domain_attr->name says, so the interface is also filtered here.
InfoPtr getInfo(int rank, const std::string& provider, const std::string& iface, const sockaddr_in* src,
                bool local_mr) {
  InfoPtr hints(ofi::fabricLib().dupinfo(nullptr));
  HC_CHECK(hints, hcSystemError, "rank {} ofi: fi_allocinfo failed", rank);
  hints->caps = FI_TAGGED | FI_SEND | FI_RECV | FI_DIRECTED_RECV;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;  // Endpoint::mu serialises every call
  hints->domain_attr->mr_mode =
      FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | (local_mr ? FI_MR_LOCAL : 0);
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  if (!iface.empty()) hints->domain_attr->name = strdup(iface.c_str());
  if (src) {  // bind to the interface's address, not to the host name's
    auto* copy = static_cast<sockaddr_in*>(std::malloc(sizeof(sockaddr_in)));
    HC_CHECK(copy, hcSystemError, "rank {} ofi: out of memory", rank);
    *copy = *src;
    hints->addr_format = FI_SOCKADDR_IN;
    hints->src_addr = copy;
    hints->src_addrlen = sizeof(sockaddr_in);
  }

  fi_info* list = nullptr;
  int rc = ofi::fabricLib().getinfo(kFiApiVersion, nullptr, nullptr, 0, hints.get(), &list);
  InfoPtr all(list);
  if (rc == -FI_ENODATA) return nullptr;
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_getinfo(provider '{}'): {}", rank, provider, fiStr(rc));

  // Prefer the exact provider name ("net" also lists "net;ofi_rxm"), then IPv4.
  fi_info* chosen = nullptr;
  int best = -1;
  for (fi_info* i = list; i; i = i->next) {
    if (!iface.empty() && (!i->domain_attr->name || iface != i->domain_attr->name)) continue;
    int score = (std::strcmp(i->fabric_attr->prov_name, provider.c_str()) == 0 ? 2 : 0) +
                (i->addr_format == FI_SOCKADDR_IN ? 1 : 0);
    if (score > best) best = score, chosen = i;
  }
  if (!chosen) return nullptr;
  InfoPtr info(ofi::fabricLib().dupinfo(chosen));
  HC_CHECK(info, hcSystemError, "rank {} ofi: fi_dupinfo failed", rank);
  return info;
}

}  // namespace

std::shared_ptr<Endpoint> openEndpoint(int rank, const OfiOptions& opt, const ofi_detail::OfiTuning& tuning,
                                       size_t av_count, const std::string& key) {
  auto e = std::make_shared<Endpoint>();
  e->key = key;
  e->provider = resolveProvider(opt.provider);
  logRxmSettings(e->provider);
  sockaddr_in src{};
  const bool have_src = !opt.iface.empty() && ifaceIpv4(opt.iface, &src);
  // FI_MR_LOCAL only when no provider works without it; the interface's address first.
  for (bool local_mr : {false, true}) {
    for (int s = have_src ? 0 : 1; s < 2 && !e->info; ++s)
      e->info = getInfo(rank, e->provider, opt.iface, s == 0 ? &src : nullptr, local_mr);
    if (e->info) break;
  }
  if (!e->info) {
    HC_THROW(hcUnsupported,
             "rank {} ofi: no libfabric provider '{}' with FI_EP_RDM, FI_TAGGED, FI_DIRECTED_RECV{}{} "
             "(see `fi_info -t FI_EP_RDM`; FI_PROVIDER / HICOLL_OFI_PROVIDER choose the provider, "
             "HICOLL_OFI_IFACE the interface)",
             rank, e->provider, opt.iface.empty() ? "" : " on interface ", opt.iface);
  }
  const fi_info* info = e->info.get();
  e->provider = info->fabric_attr->prov_name;

  const uint64_t mr_mode = info->domain_attr->mr_mode;
  e->local_mr = (mr_mode & FI_MR_LOCAL) || tuning.force_local_mr;
  e->mr_endpoint = mr_mode & FI_MR_ENDPOINT;
  e->prov_key = mr_mode & FI_MR_PROV_KEY;
  e->tag_bits = tagBitsOf(info->ep_attr->mem_tag_format);
  e->tag_mask = e->tag_bits >= 64 ? ~0ull : (1ull << e->tag_bits) - 1;
  e->channels = e->tag_bits > tags::kTagBits
                    ? std::min(kMaxChannels, size_t{1} << std::min(e->tag_bits - tags::kTagBits, 20))
                    : 0;
  e->max_chunk = info->ep_attr->max_msg_size ? info->ep_attr->max_msg_size : SIZE_MAX;
  if (tuning.max_msg_size) e->max_chunk = std::min(e->max_chunk, tuning.max_msg_size);

  int rc = ofi::fabricLib().fabric(info->fabric_attr, e->fabric.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_fabric({}): {}", rank, e->provider, fiStr(rc));
  rc = fi_domain(e->fabric.get(), e->info.get(), e->domain.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_domain({}): {}", rank, info->domain_attr->name, fiStr(rc));

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_NONE;
  rc = fi_cq_open(e->domain.get(), &cq_attr, e->cq.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_cq_open: {}", rank, fiStr(rc));

  fi_av_attr av_attr{};
  av_attr.type = info->domain_attr->av_type != FI_AV_UNSPEC ? info->domain_attr->av_type : FI_AV_TABLE;
  av_attr.count = av_count;
  rc = fi_av_open(e->domain.get(), &av_attr, e->av.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_av_open: {}", rank, fiStr(rc));

  rc = fi_endpoint(e->domain.get(), e->info.get(), e->ep.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_endpoint: {}", rank, fiStr(rc));
  rc = fi_ep_bind(e->ep.get(), &e->av.get()->fid, 0);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_ep_bind(av): {}", rank, fiStr(rc));
  rc = fi_ep_bind(e->ep.get(), &e->cq.get()->fid, FI_TRANSMIT | FI_RECV);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_ep_bind(cq): {}", rank, fiStr(rc));
  rc = fi_enable(e->ep.get());
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_enable: {}", rank, fiStr(rc));
  HC_INFO("ofi: opened {} endpoint: provider {} fabric {} domain {} (max_msg_size {}, tag bits {}, {} MRs{})",
          e->key.empty() ? "an own" : "the shared", e->provider, info->fabric_attr->name, info->domain_attr->name,
          info->ep_attr->max_msg_size, e->tag_bits, e->local_mr ? "local" : "no local",
          tuning.max_msg_size ? fmt::format(", split above {}", e->max_chunk) : "");
  return e;
}

namespace {

// The process's shared endpoints, by provider and interface (never destroyed: channels may
// close during exit, after static destructors ran).
std::mutex& sharedMu() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<std::string, std::weak_ptr<Endpoint>>& sharedEndpoints() {
  static auto* m = new std::map<std::string, std::weak_ptr<Endpoint>>;
  return *m;
}

}  // namespace

std::shared_ptr<Endpoint> sharedEndpoint(int rank, const OfiOptions& opt) {
  const std::string key = resolveProvider(opt.provider) + "|" + opt.iface;
  std::lock_guard<std::mutex> lk(sharedMu());
  std::weak_ptr<Endpoint>& slot = sharedEndpoints()[key];
  if (auto e = slot.lock(); e && e->pid == getpid()) return e;
  auto e = openEndpoint(rank, opt, ofi_detail::OfiTuning{}, 64, key);
  slot = e;
  return e;
}

void leaveSharing(Endpoint& e) {
  if (e.detached) return;
  e.detached = true;
  std::lock_guard<std::mutex> g(sharedMu());
  auto it = sharedEndpoints().find(e.key);
  if (it != sharedEndpoints().end() && it->second.lock().get() == &e) sharedEndpoints().erase(it);
}

}  // namespace hicoll::ofi
