// libfabric transport: one RDM endpoint per communicator, tagged messages, one CQ, manual
// progress by the calling thread. See ofi_transport.h for the matching rules.
#include "transport/ofi/ofi_transport.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "base/deadline.h"
#include "base/error.h"
#include "base/log.h"
#include "transport/ofi/fabric_lib.h"
#include "transport/ofi/fi_resources.h"
#include "transport/ofi/ofi_detail.h"

namespace hicoll {
namespace {

using ofi::FidPtr;
using ofi::fiStr;
using ofi::InfoPtr;
using ofi::kFiApiVersion;
constexpr size_t kPage = 4096;

// ---- the endpoint name every rank publishes (fixed size for bs.allgather) ----

struct WireAddr {
  uint32_t magic;
  uint32_t name_len;
  uint32_t addr_format;
  uint32_t tag_bits;
  char provider[64];
  uint8_t name[240];
};
static_assert(sizeof(WireAddr) == 320 && offsetof(WireAddr, name) == 80, "wire layout");
constexpr uint32_t kWireMagic = 0x4643'4f46;  // "FOCF": ofi transport, layout 1

// Connection-level failures are the peer's fault (hcRemoteError); anything else is local.
hcResult_t classify(int err) {
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ENOTCONN:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EHOSTDOWN:
    case ETIMEDOUT:
    case EIO:
    case ESHUTDOWN:
    case ECANCELED:
    case EPROTO: return hcRemoteError;
    default: return hcSystemError;
  }
}

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

std::string resolveProvider(const OfiOptions& opt) {
  return ofi::resolveProvider(opt.provider);
}

// ---- the transport ----

struct MrEntry;

// One posted libfabric operation (a message or one chunk of a split message).
struct Op {
  fi_context2 ctx;  // first: the CQ hands back &ctx
  uint32_t req = 0;
  uint32_t gen = 0;
  size_t offset = 0;
  size_t len = 0;
  MrEntry* mr = nullptr;  // on-the-fly registration held while posted
  bool in_use = false;
};
static_assert(offsetof(Op, ctx) == 0);

// On-the-fly registration (only where the provider needs a descriptor for every buffer). Kept
// only while some operation uses it: a cached registration that outlives its buffer would
// point at old pages once the range is unmapped and mapped again; providers that need local
// MRs (efa, verbs) keep their own cache with a memory monitor for that.
struct MrEntry {
  uintptr_t start = 0, end = 0;
  FidPtr<fid_mr> mr;
  int refs = 0;
};

struct Request {
  uint32_t gen = 1;
  bool live = false;
  bool send = false;
  int peer = -1;
  uint64_t tag = 0;
  size_t len = 0;
  size_t* received = nullptr;  // irecvUpTo: a shorter message completes it, its length here
  uint32_t pending = 0;        // posted operations not yet completed
  hcResult_t err = hcSuccess;
  std::string msg;
};

class OfiTransport final : public Transport {
 public:
  OfiTransport(Bootstrap& bs, const OfiOptions& opt, const ofi_detail::OfiTuning& tuning);
  ~OfiTransport() override;

  const char* name() const override { return "ofi"; }
  bool canConnect(int peer) const override { return peer >= 0 && peer < size_; }
  ReqId isend(int peer, const void* buf, size_t len, uint64_t tag) override {
    return post(true, peer, const_cast<void*>(buf), len, tag);
  }
  ReqId irecv(int peer, void* buf, size_t len, uint64_t tag) override { return post(false, peer, buf, len, tag); }
  ReqId irecvUpTo(int peer, void* buf, size_t capacity, uint64_t tag, size_t* received) override {
    HC_CHECK(capacity <= max_chunk_, hcInternalError, "rank {} ofi: a receive of up to {} bytes must be one message",
             rank_, capacity);
    return post(false, peer, buf, capacity, tag, received);
  }
  bool test(ReqId id) override;
  void progress() override;
  int tagBits() const override { return tag_bits_; }
  std::string ipv4() const override { return ipv4_; }
  void abort() override;
  void registerRegion(void* base, size_t len) override;
  void announceFailure(const std::string& what) override;
  void checkFailureNotices() override;

  ofi_detail::OfiInfo info() const;

 private:
  InfoPtr getInfo(const std::string& iface, const sockaddr_in* src, bool local_mr);
  void open(const OfiOptions& opt);
  void closeAll() noexcept;
  void connect(Bootstrap& bs);
  void warmUp();
  void postNotices();
  void throwIfNoticeArrived();
  // A notice from peer p for call `call` arrived: thrown when this rank has reached that call,
  // held otherwise (its earlier calls can still complete).
  void takeNotice(int p, uint64_t call);
  bool due(uint64_t call) const { return reportIsDue(call_now_, call); }
  uint64_t noticeCall(int p) const;
  ReqId post(bool send, int peer, void* buf, size_t len, uint64_t tag, size_t* received = nullptr);
  void postOp(bool send, Op* op, void* buf, void* desc, int peer, uint64_t tag);
  size_t drainCq();
  void complete(Op* op, size_t len, int err, size_t olen, const std::string& why);
  Request* owner(const Op* op);
  void fail(Request& r, hcResult_t code, std::string msg);
  void cancelOps(uint32_t req, uint32_t gen);
  Op* allocOp(uint32_t req, uint32_t gen, size_t offset, size_t len, MrEntry* mr);
  void freeOp(Op* op);
  uint32_t allocRequest();
  void release(uint32_t idx);
  Request& lookup(ReqId id);
  FidPtr<fid_mr> regMr(uintptr_t base, size_t len);
  void* regionDesc(const void* buf, size_t len);
  MrEntry* cacheAcquire(const void* buf, size_t len);
  void cacheRelease(MrEntry* e);
  std::string peerStr(int peer) const;
  [[noreturn]] void throwAborted(const char* what, int peer, uint64_t tag) const;

  const int rank_, size_;
  const long timeout_ms_;
  const ofi_detail::OfiTuning tuning_;

  InfoPtr info_;
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
  FidPtr<fid_cq> cq_;
  FidPtr<fid_av> av_;
  FidPtr<fid_ep> ep_;
  std::vector<fi_addr_t> addrs_;
  std::vector<std::string> peer_names_;
  std::string provider_, address_, ipv4_;
  std::function<void()> while_blocked_;
  CallClock call_now_;
  std::function<std::string(int)> who_;
  uint64_t tag_mask_ = ~0ull;
  int tag_bits_ = 64;
  size_t max_chunk_ = SIZE_MAX;
  bool local_mr_ = false, mr_endpoint_ = false, prov_key_ = false;
  uint64_t next_key_ = 1;

  // Failure notices: one receive posted per peer for the whole life of the transport, with a
  // tag no collective uses (collectives use the low 60 bits, the warm-up all ones). A notice is
  // the number of the call that failed (8 bytes) and the reason.
  static constexpr size_t kNoticeBytes = 1024;
  std::vector<std::array<char, kNoticeBytes>> notice_in_;
  std::vector<ReqId> notice_req_;  // 0 once consumed
  std::vector<char> notice_held_;  // arrived from a call this rank has not reached
  bool any_held_ = false;          // some notice_held_ set: idle passes look only when so
  std::array<char, kNoticeBytes> notice_out_{};
  uint64_t notice_tag_ = 0;   // 0: notices off (fewer than 61 tag bits)
  bool notice_seen_ = false;  // a peer's notice arrived: this rank need not repeat it
  bool announced_ = false;
  std::atomic<long> post_limit_ms_{0};  // > 0: how long a post may wait for queue space (announcing)
  std::chrono::steady_clock::time_point last_notice_check_{};

  mutable std::mutex mu_;  // one lock for everything: a watchdog thread may call abort()
  std::atomic<bool> aborted_{false};
  bool broken_ = false;  // a split message was half posted: the stream is out of step
  std::deque<Op> ops_;   // stable addresses: contexts live until their completion or ~OfiTransport
  std::vector<Op*> free_ops_;
  size_t ops_in_use_ = 0;
  std::vector<Request> reqs_;
  std::vector<uint32_t> free_reqs_;
  struct Region {
    size_t len;
    FidPtr<fid_mr> mr;
  };
  std::map<uintptr_t, Region> regions_;
  std::vector<FidPtr<fid_mr>> retired_mrs_;  // replaced regions, possibly still in use
  std::list<MrEntry> cache_;
  uint64_t mr_regs_ = 0, mr_reuses_ = 0, region_hits_ = 0, post_retries_ = 0;
  int32_t warm_send_ = 0;  // warm-up payloads (live until their completion)
  std::vector<int32_t> warm_recv_;
};

OfiTransport::OfiTransport(Bootstrap& bs, const OfiOptions& opt, const ofi_detail::OfiTuning& tuning)
    : rank_(bs.rank()), size_(bs.size()), timeout_ms_(opt.timeout_ms > 0 ? opt.timeout_ms : 120000), tuning_(tuning),
      while_blocked_(opt.while_blocked), call_now_(opt.call_now), who_(opt.who) {
  try {
    open(opt);
    connect(bs);
    warmUp();
    postNotices();
  } catch (...) {
    closeAll();  // members alone would free the contexts before the endpoint is closed
    throw;
  }
}

// One fi_getinfo attempt; nullptr when nothing fits. libfabric 1.17's tcp and net list every
// interface whatever domain_attr->name says, so the interface is also filtered here.
InfoPtr OfiTransport::getInfo(const std::string& iface, const sockaddr_in* src, bool local_mr) {
  InfoPtr hints(ofi::fabricLib().dupinfo(nullptr));
  HC_CHECK(hints, hcSystemError, "rank {} ofi: fi_allocinfo failed", rank_);
  hints->caps = FI_TAGGED | FI_SEND | FI_RECV | FI_DIRECTED_RECV;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;  // mu_ serialises every call
  hints->domain_attr->mr_mode =
      FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | (local_mr ? FI_MR_LOCAL : 0);
  hints->fabric_attr->prov_name = strdup(provider_.c_str());
  if (!iface.empty()) hints->domain_attr->name = strdup(iface.c_str());
  if (src) {  // bind to the interface's address, not to the host name's
    auto* copy = static_cast<sockaddr_in*>(std::malloc(sizeof(sockaddr_in)));
    HC_CHECK(copy, hcSystemError, "rank {} ofi: out of memory", rank_);
    *copy = *src;
    hints->addr_format = FI_SOCKADDR_IN;
    hints->src_addr = copy;
    hints->src_addrlen = sizeof(sockaddr_in);
  }

  fi_info* list = nullptr;
  int rc = ofi::fabricLib().getinfo(kFiApiVersion, nullptr, nullptr, 0, hints.get(), &list);
  InfoPtr all(list);
  if (rc == -FI_ENODATA) return nullptr;
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_getinfo(provider '{}'): {}", rank_, provider_, fiStr(rc));

  // Prefer the exact provider name ("net" also lists "net;ofi_rxm"), then IPv4.
  fi_info* chosen = nullptr;
  int best = -1;
  for (fi_info* i = list; i; i = i->next) {
    if (!iface.empty() && (!i->domain_attr->name || iface != i->domain_attr->name)) continue;
    int score = (std::strcmp(i->fabric_attr->prov_name, provider_.c_str()) == 0 ? 2 : 0) +
                (i->addr_format == FI_SOCKADDR_IN ? 1 : 0);
    if (score > best) best = score, chosen = i;
  }
  if (!chosen) return nullptr;
  InfoPtr info(ofi::fabricLib().dupinfo(chosen));
  HC_CHECK(info, hcSystemError, "rank {} ofi: fi_dupinfo failed", rank_);
  return info;
}

void OfiTransport::open(const OfiOptions& opt) {
  provider_ = resolveProvider(opt);
  logRxmSettings(provider_);
  sockaddr_in src{};
  const bool have_src = !opt.iface.empty() && ifaceIpv4(opt.iface, &src);
  // FI_MR_LOCAL only when no provider works without it; the interface's address first.
  for (bool local_mr : {false, true}) {
    for (int s = have_src ? 0 : 1; s < 2 && !info_; ++s) info_ = getInfo(opt.iface, s == 0 ? &src : nullptr, local_mr);
    if (info_) break;
  }
  if (!info_) {
    HC_THROW(hcUnsupported,
             "rank {} ofi: no libfabric provider '{}' with FI_EP_RDM, FI_TAGGED, FI_DIRECTED_RECV{}{} "
             "(see `fi_info -t FI_EP_RDM`; FI_PROVIDER / HICOLL_OFI_PROVIDER choose the provider, "
             "HICOLL_OFI_IFACE the interface)",
             rank_, provider_, opt.iface.empty() ? "" : " on interface ", opt.iface);
  }
  provider_ = info_->fabric_attr->prov_name;

  const uint64_t mr_mode = info_->domain_attr->mr_mode;
  local_mr_ = (mr_mode & FI_MR_LOCAL) || tuning_.force_local_mr;
  mr_endpoint_ = mr_mode & FI_MR_ENDPOINT;
  prov_key_ = mr_mode & FI_MR_PROV_KEY;
  tag_bits_ = tagBitsOf(info_->ep_attr->mem_tag_format);
  tag_mask_ = tag_bits_ >= 64 ? ~0ull : (1ull << tag_bits_) - 1;
  max_chunk_ = info_->ep_attr->max_msg_size ? info_->ep_attr->max_msg_size : SIZE_MAX;
  if (tuning_.max_msg_size) max_chunk_ = std::min(max_chunk_, tuning_.max_msg_size);

  int rc = ofi::fabricLib().fabric(info_->fabric_attr, fabric_.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_fabric({}): {}", rank_, provider_, fiStr(rc));
  rc = fi_domain(fabric_.get(), info_.get(), domain_.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_domain({}): {}", rank_, info_->domain_attr->name, fiStr(rc));

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_NONE;
  rc = fi_cq_open(domain_.get(), &cq_attr, cq_.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_cq_open: {}", rank_, fiStr(rc));

  fi_av_attr av_attr{};
  av_attr.type = info_->domain_attr->av_type != FI_AV_UNSPEC ? info_->domain_attr->av_type : FI_AV_TABLE;
  av_attr.count = static_cast<size_t>(size_);
  rc = fi_av_open(domain_.get(), &av_attr, av_.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_av_open: {}", rank_, fiStr(rc));

  rc = fi_endpoint(domain_.get(), info_.get(), ep_.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_endpoint: {}", rank_, fiStr(rc));
  rc = fi_ep_bind(ep_.get(), &av_.get()->fid, 0);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_ep_bind(av): {}", rank_, fiStr(rc));
  rc = fi_ep_bind(ep_.get(), &cq_.get()->fid, FI_TRANSMIT | FI_RECV);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_ep_bind(cq): {}", rank_, fiStr(rc));
  rc = fi_enable(ep_.get());
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_enable: {}", rank_, fiStr(rc));
}

void OfiTransport::connect(Bootstrap& bs) {
  WireAddr mine{};
  mine.magic = kWireMagic;
  size_t len = sizeof(mine.name);
  int rc = fi_getname(&ep_.get()->fid, mine.name, &len);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_getname ({} bytes available): {}", rank_, sizeof(mine.name),
           fiStr(rc));
  mine.name_len = static_cast<uint32_t>(len);
  mine.addr_format = info_->addr_format;
  mine.tag_bits = static_cast<uint32_t>(tag_bits_);
  std::snprintf(mine.provider, sizeof(mine.provider), "%s", provider_.c_str());
  if (info_->addr_format == FI_SOCKADDR_IN && len >= sizeof(sockaddr_in)) {
    char ip[INET_ADDRSTRLEN] = {};
    const auto* sin = reinterpret_cast<const sockaddr_in*>(mine.name);
    if (inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof ip)) ipv4_ = ip;
  }

  std::vector<WireAddr> all(static_cast<size_t>(size_));
  bs.allgather(&mine, all.data(), sizeof(WireAddr), while_blocked_);  // a dead peer fails it at once

  addrs_.assign(static_cast<size_t>(size_), FI_ADDR_UNSPEC);
  peer_names_.assign(static_cast<size_t>(size_), "");
  for (int p = 0; p < size_; ++p) {
    const WireAddr& w = all[static_cast<size_t>(p)];
    HC_CHECK(w.magic == kWireMagic && w.name_len <= sizeof(w.name), hcRemoteError,
             "rank {} ofi: rank {} published a malformed endpoint name", rank_, p);
    HC_CHECK(std::strncmp(w.provider, mine.provider, sizeof(w.provider)) == 0 && w.addr_format == mine.addr_format,
             hcInvalidUsage,
             "rank {} ofi: rank {} chose provider '{}' (address format {}) but this rank chose '{}' (format {}); "
             "set the same FI_PROVIDER / HICOLL_OFI_PROVIDER / HICOLL_OFI_IFACE on every rank",
             rank_, p, std::string(w.provider, strnlen(w.provider, sizeof(w.provider))), w.addr_format, provider_,
             mine.addr_format);
    rc = fi_av_insert(av_.get(), w.name, 1, &addrs_[static_cast<size_t>(p)], 0, nullptr);
    HC_CHECK(rc == 1, hcSystemError, "rank {} ofi: fi_av_insert of rank {}'s address: {}", rank_, p, fiStr(rc));
    char buf[128] = {};
    size_t blen = sizeof(buf);
    fi_av_straddr(av_.get(), w.name, buf, &blen);
    peer_names_[static_cast<size_t>(p)] = buf;
  }
  address_ = peer_names_[static_cast<size_t>(rank_)];
  HC_INFO("ofi: provider {} fabric {} domain {} address {} (max_msg_size {}, tag bits {}, {} MRs{})", provider_,
          info_->fabric_attr->name, info_->domain_attr->name, address_, info_->ep_attr->max_msg_size, tag_bits_,
          local_mr_ ? "local" : "no local", tuning_.max_msg_size ? fmt::format(", split above {}", max_chunk_) : "");
}

// One small message each way with every peer: connections are made now (not inside the first
// collective) and a wrong address shows up as a wrong rank rather than as corrupted data.
// Users' messages with the warm-up tag cannot be confused with it: each peer's warm-up message
// precedes its later ones (FI_ORDER_SAS) and the warm-up receive is posted first.
void OfiTransport::warmUp() {
  if (size_ < 2) return;
  const uint64_t tag = tag_mask_;
  warm_send_ = rank_;
  warm_recv_.assign(static_cast<size_t>(size_), -1);
  std::vector<std::pair<int, ReqId>> reqs;
  for (int d = 1; d < size_; ++d) {
    int to = (rank_ + d) % size_, from = (rank_ - d + size_) % size_;
    reqs.emplace_back(from, irecv(from, &warm_recv_[static_cast<size_t>(from)], sizeof(int32_t), tag));
    reqs.emplace_back(-1, isend(to, &warm_send_, sizeof(int32_t), tag));
  }
  waitUntil(
      [&] {
        const bool any = completeEach(reqs, [&](const std::pair<int, ReqId>& r) { return test(r.second); }) > 0;
        return reqs.empty() ? Progress::Done : any ? Progress::Moved : Progress::Idle;
      },
      Deadline(timeout_ms_),
      [&] {
        if (while_blocked_) while_blocked_();
      },
      [&] {
        std::string who;
        for (auto& [peer, id] : reqs)
          if (peer >= 0) who += fmt::format("{}{}", who.empty() ? "" : ", ", peerStr(peer));
        HC_THROW(hcTimeout, "rank {} ofi: no warm-up message within {} ms from {}", rank_, timeout_ms_,
                 who.empty() ? "(sends to peers did not complete)" : who);
      });
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    HC_CHECK(warm_recv_[static_cast<size_t>(p)] == p, hcRemoteError,
             "rank {} ofi: the endpoint registered as {} (address {}) answered as rank {}", rank_, peerStr(p),
             peer_names_[static_cast<size_t>(p)], warm_recv_[static_cast<size_t>(p)]);
  }
}

void OfiTransport::postNotices() {
  if (size_ < 2 || tag_bits_ < 61) return;
  notice_tag_ = tag_mask_ - 1;
  notice_in_.assign(static_cast<size_t>(size_), {});
  notice_req_.assign(static_cast<size_t>(size_), 0);
  notice_held_.assign(static_cast<size_t>(size_), 0);
  for (int p = 0; p < size_; ++p)
    if (p != rank_)
      notice_req_[static_cast<size_t>(p)] =
          irecv(p, notice_in_[static_cast<size_t>(p)].data(), kNoticeBytes, notice_tag_);
}

uint64_t OfiTransport::noticeCall(int p) const {
  uint64_t call;
  std::memcpy(&call, notice_in_[static_cast<size_t>(p)].data(), sizeof call);
  return call;
}

void OfiTransport::takeNotice(int p, uint64_t call) {
  auto& in = notice_in_[static_cast<size_t>(p)];
  if (!due(call)) {
    notice_held_[static_cast<size_t>(p)] = 1;
    any_held_ = true;
    return;
  }
  notice_held_[static_cast<size_t>(p)] = 0;
  in.back() = '\0';
  notice_seen_ = true;
  HC_THROW(hcRemoteError, "{} reported a failure: {}", peerStr(p), in.data() + sizeof(uint64_t));
}

// With mu_ held: a failure notice that has arrived (its receive completed) is thrown once due.
void OfiTransport::throwIfNoticeArrived() {
  if (notice_tag_ == 0) return;
  for (int p = 0; p < size_; ++p) {
    const ReqId id = notice_req_[static_cast<size_t>(p)];
    bool arrived = notice_held_[static_cast<size_t>(p)] != 0;
    if (!arrived && id != 0) {
      const uint32_t idx = static_cast<uint32_t>(id & 0xffffffffu), gen = static_cast<uint32_t>(id >> 32);
      const Request& r = reqs_[idx];
      arrived = r.live && r.gen == gen && r.pending == 0 && r.err == hcSuccess;
    }
    if (arrived) takeNotice(p, noticeCall(p));
  }
}

void OfiTransport::checkFailureNotices() {
  if (notice_tag_ == 0 || aborted_.load()) return;
  if (any_held_) {
    bool still = false;  // a throw (a notice now due) leaves any_held_ set
    for (int p = 0; p < size_; ++p) {
      if (!notice_held_[static_cast<size_t>(p)]) continue;
      takeNotice(p, noticeCall(p));
      still = true;
    }
    any_held_ = still;
  }
  // Every 10 ms at most: each test drives the provider's progress (system calls), and the
  // waits of small collectives are microseconds (2x2 netns 8 B AllGather: 78 -> 318 us when
  // checked on every idle pass).
  const auto now = std::chrono::steady_clock::now();
  if (now - last_notice_check_ < std::chrono::milliseconds(10)) return;
  last_notice_check_ = now;
  for (int p = 0; p < size_; ++p) {
    ReqId& id = notice_req_[static_cast<size_t>(p)];
    if (id == 0) continue;
    try {
      if (!test(id)) continue;
    } catch (const Error&) {
      // The receive itself failed (the peer closed its endpoint, perhaps after finishing
      // cleanly): not a notice. The collective's own requests report real losses.
      id = 0;
      continue;
    }
    id = 0;
    takeNotice(p, noticeCall(p));
  }
}

void OfiTransport::announceFailure(const std::string& what) {
  // Never throws: it runs on the way out of a failed call.
  try {
    if (notice_tag_ == 0 || notice_seen_ || announced_ || aborted_.load()) return;
    announced_ = true;
    const uint64_t call = call_now_ ? call_now_() : 0;
    std::memcpy(notice_out_.data(), &call, sizeof call);
    std::snprintf(notice_out_.data() + sizeof call, kNoticeBytes - sizeof call, "%s", what.c_str());
    // Eager messages to receives posted at creation: done at once unless a peer is gone, and a
    // dead peer may block a post (its connection) until the deadline. Half a second in all.
    Deadline dl(std::min<long>(timeout_ms_, 500));
    std::vector<ReqId> sends;
    for (int p = 0; p < size_ && !dl.expired(); ++p) {
      if (p == rank_) continue;
      post_limit_ms_ = std::max<long>(1, dl.remainingMs());
      try {
        sends.push_back(isend(p, notice_out_.data(), kNoticeBytes, notice_tag_));
      } catch (const Error&) {  // this peer is unreachable: tell the others
      }
    }
    post_limit_ms_ = 0;
    size_t done = 0;
    auto sent = [&](ReqId id) {
      try {
        return test(id);
      } catch (const Error&) {
        return true;  // failed: nothing more to wait for
      }
    };
    waitUntil(
        [&] {
          const size_t n = completeEach(sends, sent);
          done += n;
          return sends.empty() ? Progress::Done : n > 0 ? Progress::Moved : Progress::Idle;
        },
        dl);
    HC_INFO("ofi: rank {} sent its failure notice to {} of {} peers", rank_, done, size_ - 1);
  } catch (const std::exception& e) {
    HC_INFO("ofi: rank {} could not tell every peer of its failure: {}", rank_, e.what());
  }
}

OfiTransport::~OfiTransport() {
  closeAll();
}

void OfiTransport::closeAll() noexcept {
  // The endpoint goes first: once it is closed the provider touches no context or buffer.
  // Nothing here waits for a peer.
  std::lock_guard<std::mutex> lk(mu_);
  for (Op& op : ops_)
    if (op.in_use && ep_) fi_cancel(&ep_.get()->fid, &op.ctx);
  ep_.reset();
  cache_.clear();
  regions_.clear();
  retired_mrs_.clear();
  av_.reset();
  cq_.reset();
  int rc = domain_.close();
  if (rc == -FI_EBUSY && ops_in_use_ > 0) {
    // libfabric 1.17's ofi_rxm keeps an unfinished rendezvous send (its peer never received it)
    // after the endpoint is closed, and with it the domain.
    HC_WARN("ofi: rank {} closed with {} operations unfinished; provider {} kept its domain busy, which is leaked",
            rank_, ops_in_use_, provider_);
  } else if (rc != 0) {
    HC_WARN("ofi: rank {} fi_close(domain): {}", rank_, fiStr(rc));
  }
  if (rc == 0) fabric_.reset();
  else fabric_.close();
}

std::string OfiTransport::peerStr(int peer) const {
  if (who_) return who_(peer);
  if (peer < 0 || peer >= static_cast<int>(peer_names_.size())) return fmt::format("rank {}", peer);
  return fmt::format("rank {} ({})", peer, peer_names_[static_cast<size_t>(peer)]);
}

void OfiTransport::throwAborted(const char* what, int peer, uint64_t tag) const {
  HC_THROW(hcRemoteError, "rank {} ofi: transport aborted: {} peer {} tag {:#x}", rank_, what, peer, tag);
}

// ---- requests and operations ----

uint32_t OfiTransport::allocRequest() {
  uint32_t idx;
  if (!free_reqs_.empty()) {
    idx = free_reqs_.back();
    free_reqs_.pop_back();
  } else {
    idx = static_cast<uint32_t>(reqs_.size());
    reqs_.emplace_back();
  }
  Request& r = reqs_[idx];
  uint32_t gen = r.gen;
  r = Request{};
  r.gen = gen;
  r.live = true;
  return idx;
}

void OfiTransport::release(uint32_t idx) {
  Request& r = reqs_[idx];
  r.live = false;
  r.msg.clear();
  if (++r.gen == 0) r.gen = 1;  // late completions of its operations are recognised as stale
  free_reqs_.push_back(idx);
}

Request& OfiTransport::lookup(ReqId id) {
  uint32_t idx = static_cast<uint32_t>(id & 0xffffffffu), gen = static_cast<uint32_t>(id >> 32);
  HC_CHECK(idx < reqs_.size() && reqs_[idx].live && reqs_[idx].gen == gen, hcInvalidUsage,
           "rank {} ofi: test() of an unknown or already completed request {:#x}", rank_, id);
  return reqs_[idx];
}

Request* OfiTransport::owner(const Op* op) {
  if (op->req >= reqs_.size()) return nullptr;
  Request& r = reqs_[op->req];
  return r.live && r.gen == op->gen ? &r : nullptr;
}

Op* OfiTransport::allocOp(uint32_t req, uint32_t gen, size_t offset, size_t len, MrEntry* mr) {
  Op* op;
  if (!free_ops_.empty()) {
    op = free_ops_.back();
    free_ops_.pop_back();
  } else {
    op = &ops_.emplace_back();
  }
  std::memset(&op->ctx, 0, sizeof(op->ctx));
  op->req = req;
  op->gen = gen;
  op->offset = offset;
  op->len = len;
  op->mr = mr;
  op->in_use = true;
  if (mr && mr->refs++ > 0) ++mr_reuses_;
  ++ops_in_use_;
  return op;
}

void OfiTransport::freeOp(Op* op) {
  if (op->mr) cacheRelease(op->mr);
  op->mr = nullptr;
  op->in_use = false;
  --ops_in_use_;
  free_ops_.push_back(op);
}

void OfiTransport::fail(Request& r, hcResult_t code, std::string msg) {
  if (r.err != hcSuccess) return;  // keep the first cause
  r.err = code;
  r.msg = std::move(msg);
}

void OfiTransport::cancelOps(uint32_t req, uint32_t gen) {
  for (Op& op : ops_)
    if (op.in_use && op.req == req && op.gen == gen) fi_cancel(&ep_.get()->fid, &op.ctx);
}

// ---- posting ----

ReqId OfiTransport::post(bool send, int peer, void* buf, size_t len, uint64_t tag, size_t* received) {
  const char* what = send ? "send to" : "receive from";
  if (aborted_.load()) throwAborted(what, peer, tag);
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_.load()) throwAborted(what, peer, tag);
  HC_CHECK(!broken_, hcRemoteError,
           "rank {} ofi: transport unusable after a failed split message; {} peer {} tag {:#x} refused", rank_, what,
           peer, tag);
  HC_CHECK(peer >= 0 && peer < size_, hcInvalidArgument, "rank {} ofi: {} peer {} out of range [0, {})", rank_, what,
           peer, size_);
  HC_CHECK((tag & ~tag_mask_) == 0, hcInvalidArgument,
           "rank {} ofi: {} peer {}: tag {:#x} does not fit the {} tag bits of provider {}", rank_, what, peer, tag,
           tag_bits_, provider_);
  HC_CHECK(len == 0 || buf != nullptr, hcInvalidArgument, "rank {} ofi: {} peer {} tag {:#x}: null buffer of {} bytes",
           rank_, what, peer, tag, len);

  void* desc = nullptr;
  MrEntry* mr = nullptr;
  if (len > 0) {
    desc = regionDesc(buf, len);
    if (desc) {
      ++region_hits_;
    } else if (local_mr_) {
      mr = cacheAcquire(buf, len);
      desc = fi_mr_desc(mr->mr.get());
    }
  }

  const uint32_t idx = allocRequest();
  const uint32_t gen = reqs_[idx].gen;
  {
    Request& r = reqs_[idx];
    r.send = send;
    r.peer = peer;
    r.tag = tag;
    r.len = len;
    r.received = received;
  }
  const size_t chunks = len == 0 ? 1 : (len - 1) / max_chunk_ + 1;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * max_chunk_;
    Op* op = allocOp(idx, gen, off, std::min(max_chunk_, len - off), mr);
    try {
      postOp(send, op, len ? static_cast<char*>(buf) + off : buf, desc, peer, tag);
    } catch (...) {
      freeOp(op);
      if (c > 0) {
        broken_ = true;
        cancelOps(idx, gen);
      }
      release(idx);
      throw;
    }
    ++reqs_[idx].pending;
  }
  HC_TRACE("ofi: rank {} posted {} {} tag {:#x} {} bytes{}", rank_, what, peer, tag, len,
           chunks > 1 ? fmt::format(" in {} chunks", chunks) : "");
  return (static_cast<uint64_t>(gen) << 32) | idx;
}

void OfiTransport::postOp(bool send, Op* op, void* buf, void* desc, int peer, uint64_t tag) {
  const long limit = post_limit_ms_.load();
  const fi_addr_t addr = addrs_[static_cast<size_t>(peer)];
  waitUntil(
      [&] {
        ssize_t rc = send ? fi_tsend(ep_.get(), buf, op->len, desc, addr, tag, &op->ctx)
                          : fi_trecv(ep_.get(), buf, op->len, desc, addr, tag, 0, &op->ctx);
        if (rc == 0) return Progress::Done;
        HC_CHECK(rc == -FI_EAGAIN, hcSystemError, "rank {} ofi: {} {} tag {:#x} ({} bytes): {}", rank_,
                 send ? "fi_tsend to" : "fi_trecv from", peerStr(peer), tag, op->len, fiStr(rc));
        // The queue is full: completions free it (and the provider may need progress to send).
        ++post_retries_;
        return drainCq() > 0 ? Progress::Moved : Progress::Idle;
      },
      Deadline(limit > 0 ? limit : timeout_ms_),
      [&] {
        // A queue that stays full because its peer is dead is a dead peer: look for the
        // notices and the liveness news that say so.
        if (aborted_.load()) throwAborted(send ? "send to" : "receive from", peer, tag);
        if (limit == 0) {  // not while this rank announces its own failure
          throwIfNoticeArrived();
          if (while_blocked_) while_blocked_();
        }
      },
      [&] {
        HC_THROW(hcTimeout,
                 "rank {} ofi: could not post a {} {} tag {:#x} for {} ms: the provider's queue stayed full "
                 "(too many outstanding operations, or the peer is not progressing)",
                 rank_, send ? "send to" : "receive from", peerStr(peer), tag, timeout_ms_);
      });
}

// ---- completion ----

size_t OfiTransport::drainCq() {
  size_t done = 0;
  fi_cq_tagged_entry ents[32];
  for (;;) {
    ssize_t n = fi_cq_read(cq_.get(), ents, 32);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) complete(static_cast<Op*>(ents[i].op_context), ents[i].len, 0, 0, {});
      done += static_cast<size_t>(n);
      if (n < 32) return done;
      continue;
    }
    if (n == -FI_EAGAIN) return done;
    HC_CHECK(n == -FI_EAVAIL, hcSystemError, "rank {} ofi: fi_cq_read: {}", rank_, fiStr(n));
    fi_cq_err_entry err{};
    ssize_t m = fi_cq_readerr(cq_.get(), &err, 0);
    if (m == -FI_EAGAIN) continue;
    HC_CHECK(m >= 0, hcSystemError, "rank {} ofi: fi_cq_readerr: {}", rank_, fiStr(m));
    char pbuf[256] = {};
    const char* pstr = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, pbuf, sizeof(pbuf));
    std::string why = fmt::format("{} (provider errno {}: {})", ofi::fabricLib().strerror(err.err), err.prov_errno,
                                  pstr ? pstr : "?");
    HC_CHECK(err.op_context != nullptr, classify(err.err), "rank {} ofi: completion error without an operation: {}",
             rank_, why);
    HC_TRACE("ofi: rank {} completion error {} len {} olen {} tag {:#x}", rank_, err.err, err.len, err.olen, err.tag);
    complete(static_cast<Op*>(err.op_context), err.len, err.err, err.olen, why);
    ++done;
  }
}

void OfiTransport::complete(Op* op, size_t len, int err, size_t olen, const std::string& why) {
  const size_t posted = op->len, offset = op->offset;
  const uint32_t ri = op->req, rg = op->gen;
  Request* r = owner(op);
  freeOp(op);
  if (!r) return;  // its request already failed and was released
  --r->pending;
  if (err == 0 && (r->send || len == posted || r->received)) {
    if (r->received) *r->received = offset + len;
    return;
  }
  if (!r->send && (err == 0 || err == FI_ETRUNC)) {
    // On truncation tcp and net (1.17) give the overflow in olen, or nothing at all when the
    // message arrived before its receive was posted.
    std::string got = err == 0       ? fmt::format("{}", offset + len)
                      : olen > 0     ? fmt::format("{}", offset + posted + olen)
                      : len > posted ? fmt::format("{}", offset + len)
                                     : fmt::format("more than {}", offset + posted);
    fail(*r, hcInvalidUsage,
         fmt::format("rank {} ofi: size mismatch from {}: expected {} got {} bytes (tag {:#x})", rank_,
                     peerStr(r->peer), r->len, got, r->tag));
    cancelOps(ri, rg);  // the remaining chunks must not swallow later messages
    return;
  }
  if (err == FI_ECANCELED) {
    fail(*r, hcRemoteError,
         fmt::format("rank {} ofi: {} {} tag {:#x} cancelled", rank_, r->send ? "send to" : "receive from",
                     peerStr(r->peer), r->tag));
    return;
  }
  fail(*r, classify(err),
       fmt::format("rank {} ofi: {} {} tag {:#x} ({} bytes) failed: {}", rank_, r->send ? "send to" : "receive from",
                   peerStr(r->peer), r->tag, r->len, why));
}

bool OfiTransport::test(ReqId id) {
  std::lock_guard<std::mutex> lk(mu_);
  Request& r0 = lookup(id);
  const uint32_t idx = static_cast<uint32_t>(id & 0xffffffffu);
  if (r0.pending > 0 && r0.err == hcSuccess && !aborted_.load()) drainCq();
  Request& r = reqs_[idx];
  if (r.err != hcSuccess) {
    Error e(r.err, r.msg, r.err == hcRemoteError ? Error::kSymptom : 0u);
    release(idx);
    throw e;
  }
  if (r.pending == 0) {
    HC_TRACE("ofi: rank {} completed {} {} tag {:#x} {} bytes", rank_, r.send ? "send to" : "receive from", r.peer,
             r.tag, r.len);
    release(idx);
    return true;
  }
  if (aborted_.load()) {
    std::string msg = fmt::format("rank {} ofi: transport aborted: {} {} tag {:#x} did not complete", rank_,
                                  r.send ? "send to" : "receive from", peerStr(r.peer), r.tag);
    release(idx);
    throw Error(hcRemoteError, msg);
  }
  return false;
}

void OfiTransport::progress() {
  if (aborted_.load()) HC_THROW(hcRemoteError, "rank {} ofi: transport aborted", rank_);
  std::lock_guard<std::mutex> lk(mu_);
  drainCq();
}

void OfiTransport::abort() {
  aborted_.store(true);  // a post spinning on a full queue gives up without the lock
  std::lock_guard<std::mutex> lk(mu_);
  // Best effort: receives are cancelled; rxm cannot cancel sends, which stay posted until the
  // endpoint is closed. test() reports every unfinished request as aborted from now on.
  for (Op& op : ops_)
    if (op.in_use) fi_cancel(&ep_.get()->fid, &op.ctx);
  HC_INFO("ofi: rank {} aborted with {} operations outstanding", rank_, ops_in_use_);
}

// ---- memory registration ----

FidPtr<fid_mr> OfiTransport::regMr(uintptr_t base, size_t len) {
  FidPtr<fid_mr> mr;
  const uint64_t key = prov_key_ ? 0 : next_key_++;
  int rc =
      fi_mr_reg(domain_.get(), reinterpret_cast<void*>(base), len, FI_SEND | FI_RECV, 0, key, 0, mr.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_mr_reg({:#x}, {} bytes): {}", rank_, base, len, fiStr(rc));
  if (mr_endpoint_) {
    rc = fi_mr_bind(mr.get(), &ep_.get()->fid, 0);
    HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_mr_bind: {}", rank_, fiStr(rc));
    rc = fi_mr_enable(mr.get());
    HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_mr_enable: {}", rank_, fiStr(rc));
  }
  return mr;
}

void OfiTransport::registerRegion(void* base, size_t len) {
  if (!base || len == 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_.load()) HC_THROW(hcRemoteError, "rank {} ofi: transport aborted: registerRegion refused", rank_);
  if (regionDesc(base, len)) return;
  const auto b = reinterpret_cast<uintptr_t>(base);
  FidPtr<fid_mr> mr = regMr(b, len);
  auto it = regions_.find(b);
  if (it != regions_.end()) {
    retired_mrs_.push_back(std::move(it->second.mr));  // operations may still use its descriptor
    it->second = Region{len, std::move(mr)};
  } else {
    regions_.emplace(b, Region{len, std::move(mr)});
  }
  HC_TRACE("ofi: rank {} registered {} bytes at {}", rank_, len, base);
}

void* OfiTransport::regionDesc(const void* buf, size_t len) {
  const auto a = reinterpret_cast<uintptr_t>(buf);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return nullptr;
  --it;
  if (a + len > it->first + it->second.len) return nullptr;
  return fi_mr_desc(it->second.mr.get());
}

MrEntry* OfiTransport::cacheAcquire(const void* buf, size_t len) {
  const auto a = reinterpret_cast<uintptr_t>(buf);
  const uintptr_t s = a & ~(kPage - 1), e = (a + len + kPage - 1) & ~(kPage - 1);
  for (MrEntry& m : cache_) {
    if (m.start <= s && e <= m.end) return &m;
  }
  MrEntry& m = cache_.emplace_back();
  try {
    m.mr = regMr(s, e - s);
  } catch (...) {
    cache_.pop_back();
    throw;
  }
  m.start = s;
  m.end = e;
  ++mr_regs_;
  return &m;
}

void OfiTransport::cacheRelease(MrEntry* e) {
  if (--e->refs > 0) return;
  cache_.remove_if([e](const MrEntry& m) { return &m == e; });
}

ofi_detail::OfiInfo OfiTransport::info() const {
  std::lock_guard<std::mutex> lk(mu_);
  ofi_detail::OfiInfo i;
  i.provider = provider_;
  i.fabric = info_->fabric_attr->name ? info_->fabric_attr->name : "";
  i.domain = info_->domain_attr->name ? info_->domain_attr->name : "";
  i.address = address_;
  i.tag_bits = tag_bits_;
  i.max_chunk = max_chunk_;
  i.local_mr = local_mr_;
  i.mr_regs = mr_regs_;
  i.mr_reuses = mr_reuses_;
  i.region_hits = region_hits_;
  i.post_retries = post_retries_;
  return i;
}

}  // namespace

std::unique_ptr<Transport> makeOfiTransport(Bootstrap& bs, const OfiOptions& opt) {
  return ofi_detail::makeOfiTransport(bs, opt, ofi_detail::OfiTuning{});
}

std::string interfaceIpv4(const std::string& iface) {
  sockaddr_in a{};
  char ip[INET_ADDRSTRLEN] = {};
  if (iface.empty() || !ifaceIpv4(iface, &a) || !inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip)) return "";
  return ip;
}

size_t ofiEagerLimit(const OfiOptions& opt) {
  if (resolveProvider(opt).find("rxm") == std::string::npos) return 0;
  // The environment's value (the user's, or the one hicoll set when it loaded). (Never throws:
  // communicator creation asks before its ranks have exchanged anything.)
  if (const char* env = std::getenv("FI_OFI_RXM_EAGER_LIMIT"); env && *env)
    return static_cast<size_t>(std::strtoull(env, nullptr, 10));
  // Unset, rxm's limit is its bounce buffers' size (16 KiB unless FI_OFI_RXM_BUFFER_SIZE says).
  if (const char* env = std::getenv("FI_OFI_RXM_BUFFER_SIZE"); env && *env)
    return static_cast<size_t>(std::strtoull(env, nullptr, 10));
  return size_t{16384};
}

namespace ofi_detail {

std::unique_ptr<Transport> makeOfiTransport(Bootstrap& bs, const OfiOptions& opt, const OfiTuning& tuning) {
  return std::make_unique<OfiTransport>(bs, opt, tuning);
}

OfiInfo ofiInfo(Transport& t) {
  auto* o = dynamic_cast<OfiTransport*>(&t);
  HC_CHECK(o != nullptr, hcInvalidArgument, "ofiInfo: transport '{}' is not ofi", t.name());
  return o->info();
}

}  // namespace ofi_detail
}  // namespace hicoll
