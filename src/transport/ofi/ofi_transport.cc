// libfabric transport: a communicator's channel on an RDM endpoint (ofi_endpoint.h: the
// process's shared one, or its own), tagged messages, one CQ, manual progress by the calling
// thread. See ofi_transport.h for the matching rules and for what sharing means.
#include "transport/ofi/ofi_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bitset>
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
#include <thread>
#include <utility>
#include <vector>

#include "base/deadline.h"
#include "base/error.h"
#include "base/log.h"
#include "transport/ofi/fabric_lib.h"
#include "transport/ofi/fi_resources.h"
#include "transport/ofi/ofi_detail.h"
#include "transport/ofi/ofi_endpoint.h"
#include "transport/tags.h"

namespace hicoll {
namespace {

using ofi::FidPtr;
using ofi::fiStr;
using ofi::kMaxChannels;
constexpr size_t kPage = 4096;

// ---- the endpoint name every rank publishes (fixed size for bs.allgather) ----

struct WireAddr {
  uint32_t magic;
  uint32_t name_len;
  uint32_t addr_format;
  uint32_t tag_bits;
  char provider[64];
  uint8_t name[240];
  uint32_t offers;  // 1: the name is the process's shared endpoint, `free` its channels on offer
  uint32_t cursor;  // where its search for a channel starts (numbers are taken in turn)
  uint64_t free[kMaxChannels / 64];
};
static_assert(sizeof(WireAddr) == 456 && offsetof(WireAddr, name) == 80, "wire layout");
constexpr uint32_t kWireMagic = 0x4643'4f47;  // ofi transport, layout 2

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

std::string resolveProvider(const OfiOptions& opt) {
  return ofi::resolveProvider(opt.provider);
}

}  // namespace

namespace ofi {

// ---- the transport: a communicator's channel on an endpoint (ofi_endpoint.h) ----

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
    HC_CHECK(capacity <= e_->max_chunk, hcInternalError, "rank {} ofi: a receive of up to {} bytes must be one message",
             rank_, capacity);
    return post(false, peer, buf, capacity, tag, received);
  }
  bool test(ReqId id) override;
  void progress() override;
  int tagBits() const override { return bits_; }
  std::string ipv4() const override { return ipv4_; }
  void abort() override;
  void registerRegion(void* base, size_t len) override;
  void announceFailure(const std::string& what) override;
  void checkFailureNotices() override;

  ofi_detail::OfiInfo info() const;
  std::string peerStr(int peer) const;

 private:
  WireAddr describe(bool offer);
  void connect(Bootstrap& bs, const OfiOptions& opt, const ofi_detail::OfiTuning& tuning);
  int chooseChannel(const std::vector<WireAddr>& all, size_t skew) const;
  bool claim(int c);
  void close() noexcept;
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
  size_t opsInFlight() const;
  [[noreturn]] void throwAborted(const char* what, int peer, uint64_t tag) const;

  const int rank_, size_;
  const long timeout_ms_;

  std::shared_ptr<Endpoint> endpoint_;
  Endpoint* e_ = nullptr;  // endpoint_.get()
  int channel_ = -1;       // its number on a shared endpoint; -1: the endpoint is its own
  int claimed_ = -1;       // a number taken while the ranks agree on one
  uint64_t prefix_ = 0;    // channel_ above tags::kTagBits
  int bits_ = 64;          // tag bits it carries: tags::kTagBits on a shared endpoint
  uint64_t mask_ = ~0ull;

  std::vector<fi_addr_t> addrs_;
  std::vector<std::string> peer_names_;
  std::string address_, ipv4_;
  std::function<void()> while_blocked_;
  CallClock call_now_;
  std::function<std::string(int)> who_;
  std::map<uintptr_t, Region> regions_;
  std::vector<FidPtr<fid_mr>> retired_mrs_;  // replaced regions, possibly still in use

  // Failure notices: one receive posted per peer for the whole life of the channel, with a tag
  // none of hicoll's layers use (they stay below 2^tags::kTagBits, the warm-up is all ones of
  // the channel's bits). A notice is the number of the call that failed (8 bytes) and the reason.
  static constexpr size_t kNoticeBytes = 1024;
  std::vector<std::array<char, kNoticeBytes>> notice_in_;
  std::vector<ReqId> notice_req_;  // 0 once consumed
  std::vector<char> notice_held_;  // arrived from a call this rank has not reached
  bool any_held_ = false;          // some notice_held_ set: idle passes look only when so
  std::array<char, kNoticeBytes> notice_out_{};
  uint64_t notice_tag_ = 0;   // 0: notices off (no tag bits above hicoll's layers')
  bool notice_seen_ = false;  // a peer's notice arrived: this rank need not repeat it
  bool announced_ = false;
  std::atomic<long> post_limit_ms_{0};  // > 0: how long a post may wait for queue space (announcing)
  std::chrono::steady_clock::time_point last_notice_check_{};

  std::atomic<bool> aborted_{false};
  int32_t warm_send_ = 0;  // warm-up payloads (live until their completion)
  std::vector<int32_t> warm_recv_;
};

OfiTransport::OfiTransport(Bootstrap& bs, const OfiOptions& opt, const ofi_detail::OfiTuning& tuning)
    : rank_(bs.rank()), size_(bs.size()), timeout_ms_(opt.timeout_ms > 0 ? opt.timeout_ms : 120000),
      while_blocked_(opt.while_blocked), call_now_(opt.call_now), who_(opt.who) {
  const bool offer = opt.share && size_ > 1 && tuning.max_msg_size == 0 && !tuning.force_local_mr;
  endpoint_ = offer ? sharedEndpoint(rank_, opt) : openEndpoint(rank_, opt, tuning, static_cast<size_t>(size_));
  e_ = endpoint_.get();
  try {
    connect(bs, opt, tuning);
    warmUp();
    postNotices();
  } catch (...) {
    close();
    throw;
  }
}

// This rank's line of the exchange: its endpoint's name, and the channel numbers free on it
// when the endpoint is the shared one.
WireAddr OfiTransport::describe(bool offer) {
  WireAddr mine{};
  mine.magic = kWireMagic;
  size_t len = sizeof(mine.name);
  std::lock_guard<std::mutex> lk(e_->mu);  // other channels may be using the endpoint
  int rc = fi_getname(&e_->ep.get()->fid, mine.name, &len);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_getname ({} bytes available): {}", rank_, sizeof(mine.name),
           fiStr(rc));
  mine.name_len = static_cast<uint32_t>(len);
  mine.addr_format = e_->info->addr_format;
  mine.tag_bits = static_cast<uint32_t>(e_->tag_bits);
  std::snprintf(mine.provider, sizeof(mine.provider), "%s", e_->provider.c_str());
  if (offer && !e_->key.empty()) {
    for (size_t c = 0; c < e_->channels; ++c)
      if (!e_->used[c] && !e_->retired[c]) mine.free[c / 64] |= uint64_t{1} << (c % 64);
    mine.offers = 1;
    mine.cursor = static_cast<uint32_t>(e_->next_channel);
  }
  return mine;
}

// The number every rank tries: the first free on all, searching from the furthest cursor (so
// numbers come round in turn) moved on by `skew`, or -1 (own endpoints) when one offers none,
// or when two ranks are one process (ranks as threads): their messages would come from one
// address. Every rank computes it from the same lines.
int OfiTransport::chooseChannel(const std::vector<WireAddr>& all, size_t skew) const {
  uint64_t free[kMaxChannels / 64];
  std::fill(std::begin(free), std::end(free), ~uint64_t{0});
  size_t cursor = 0;
  std::vector<std::string> names;
  for (const WireAddr& w : all) {
    if (!w.offers) return -1;
    for (size_t i = 0; i < kMaxChannels / 64; ++i) free[i] &= w.free[i];
    cursor = std::max<size_t>(cursor, w.cursor);
    names.emplace_back(reinterpret_cast<const char*>(w.name), w.name_len);
  }
  const size_t from = cursor + skew;
  std::sort(names.begin(), names.end());
  if (std::adjacent_find(names.begin(), names.end()) != names.end()) return -1;
  for (size_t k = 0; k < kMaxChannels; ++k) {
    const size_t c = (from + k) % kMaxChannels;
    if (free[c / 64] >> (c % 64) & 1) return static_cast<int>(c);
  }
  return -1;
}

// Takes number c on this rank's endpoint unless another communicator took it since the lines
// were written (one opened at the same moment on another thread).
bool OfiTransport::claim(int c) {
  std::lock_guard<std::mutex> lk(e_->mu);
  const auto i = static_cast<size_t>(c);
  if (e_->used[i] || e_->retired[i]) return false;
  e_->used.set(i);
  return true;
}

void OfiTransport::connect(Bootstrap& bs, const OfiOptions& opt, const ofi_detail::OfiTuning& tuning) {
  WireAddr mine{};
  std::vector<WireAddr> all(static_cast<size_t>(size_));
  auto exchange = [&] {
    bs.allgather(&mine, all.data(), sizeof(WireAddr), while_blocked_);  // a dead peer fails it at once
    for (int p = 0; p < size_; ++p) {
      const WireAddr& w = all[static_cast<size_t>(p)];
      HC_CHECK(w.magic == kWireMagic && w.name_len <= sizeof(w.name), hcRemoteError,
               "rank {} ofi: rank {} published a malformed endpoint name", rank_, p);
      HC_CHECK(std::strncmp(w.provider, mine.provider, sizeof(w.provider)) == 0 && w.addr_format == mine.addr_format,
               hcInvalidUsage,
               "rank {} ofi: rank {} chose provider '{}' (address format {}) but this rank chose '{}' (format {}); "
               "set the same FI_PROVIDER / HICOLL_OFI_PROVIDER / HICOLL_OFI_IFACE on every rank",
               rank_, p, std::string(w.provider, strnlen(w.provider, sizeof(w.provider))), w.addr_format, e_->provider,
               mine.addr_format);
    }
  };
  // Every rank tries the same number, and says whether it could take it; where one could not
  // (another communicator of its process took it meanwhile), those that took it give it back
  // and all try again, each communicator further on by its own amount (two opened at once
  // then part), a few times before they open their own endpoints.
  constexpr int kAttempts = 6;
  const size_t own_skew = std::hash<std::string>()(bs.key()) % kMaxChannels;
  int chosen = -1;
  bool offered_any = false;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    mine = describe(true);
    exchange();
    offered_any = false;
    for (const WireAddr& w : all) offered_any |= w.offers != 0;
    chosen = chooseChannel(all, attempt == 0 ? 0 : own_skew * static_cast<size_t>(attempt));
    if (chosen < 0) break;
    const uint32_t took = claim(chosen) ? 1 : 0;
    if (took) claimed_ = chosen;  // close() gives it back if the exchange below fails
    std::vector<uint32_t> takes(static_cast<size_t>(size_));
    bs.allgather(&took, takes.data(), sizeof took, while_blocked_);
    if (std::all_of(takes.begin(), takes.end(), [](uint32_t t) { return t == 1; })) break;
    if (took) {
      std::lock_guard<std::mutex> lk(e_->mu);
      e_->used.reset(static_cast<size_t>(chosen));
      claimed_ = -1;
    }
    chosen = -1;
  }
  if (chosen >= 0) {
    {
      std::lock_guard<std::mutex> lk(e_->mu);
      e_->next_channel = static_cast<size_t>(chosen + 1) % kMaxChannels;
    }
    channel_ = chosen;
    prefix_ = static_cast<uint64_t>(chosen) << tags::kTagBits;
    bits_ = tags::kTagBits;
    mask_ = (uint64_t{1} << tags::kTagBits) - 1;
  } else {
    if (!e_->key.empty()) {  // not every rank shares: each opens its own (every rank sees this)
      endpoint_ = openEndpoint(rank_, opt, tuning, static_cast<size_t>(size_));
      e_ = endpoint_.get();
    }
    if (offered_any) {
      mine = describe(false);
      exchange();
    }
    bits_ = e_->tag_bits;
    mask_ = e_->tag_mask;
  }
  if (mine.addr_format == FI_SOCKADDR_IN && mine.name_len >= sizeof(sockaddr_in)) {
    char ip[INET_ADDRSTRLEN] = {};
    const auto* sin = reinterpret_cast<const sockaddr_in*>(mine.name);
    if (inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof ip)) ipv4_ = ip;
  }

  addrs_.assign(static_cast<size_t>(size_), FI_ADDR_UNSPEC);
  peer_names_.assign(static_cast<size_t>(size_), "");
  std::lock_guard<std::mutex> lk(e_->mu);
  for (int p = 0; p < size_; ++p) {
    const WireAddr& w = all[static_cast<size_t>(p)];
    int rc = fi_av_insert(e_->av.get(), w.name, 1, &addrs_[static_cast<size_t>(p)], 0, nullptr);
    HC_CHECK(rc == 1, hcSystemError, "rank {} ofi: fi_av_insert of rank {}'s address: {}", rank_, p, fiStr(rc));
    char buf[128] = {};
    size_t blen = sizeof(buf);
    fi_av_straddr(e_->av.get(), w.name, buf, &blen);
    peer_names_[static_cast<size_t>(p)] = buf;
  }
  address_ = peer_names_[static_cast<size_t>(rank_)];
  if (channel_ >= 0)
    HC_INFO("ofi: rank {} is channel {} of the shared endpoint {} ({} ranks)", rank_, channel_, address_, size_);
  else HC_INFO("ofi: rank {} has an own endpoint {} ({} ranks)", rank_, address_, size_);
}

// One small message each way with every peer: connections are made now (not inside the first
// collective) and a wrong address shows up as a wrong rank rather than as corrupted data.
// Users' messages with the warm-up tag cannot be confused with it: each peer's warm-up message
// precedes its later ones (FI_ORDER_SAS) and the warm-up receive is posted first.
void OfiTransport::warmUp() {
  if (size_ < 2) return;
  const uint64_t tag = mask_;
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
  if (size_ < 2 || (channel_ < 0 && bits_ <= tags::kTagBits)) return;
  notice_tag_ = mask_ - 1;
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

// With e_->mu held: a failure notice that has arrived (its receive completed) is thrown once due.
void OfiTransport::throwIfNoticeArrived() {
  if (notice_tag_ == 0) return;
  for (int p = 0; p < size_; ++p) {
    const ReqId id = notice_req_[static_cast<size_t>(p)];
    bool arrived = notice_held_[static_cast<size_t>(p)] != 0;
    if (!arrived && id != 0) {
      const uint32_t idx = static_cast<uint32_t>(id & 0xffffffffu), gen = static_cast<uint32_t>(id >> 32);
      const Request& r = e_->reqs[idx];
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
  close();
}

size_t OfiTransport::opsInFlight() const {
  size_t n = 0;
  for (const Op& op : e_->ops) n += op.in_use && op.chan == this;
  return n;
}

// A channel's requests end here (their receives cancelled). Its own endpoint then closes with
// it. On the shared one, which other channels keep moving, it waits a moment for what it
// could not cancel (a send, a message arriving); what is still in flight after that keeps
// writing or reading its buffers, so the endpoint leaves the shared ones (it closes with its
// last channel) and the number is retired. Nothing here waits for a peer beyond that second.
void OfiTransport::close() noexcept {
  if (!endpoint_) return;
  try {
    std::unique_lock<std::mutex> lk(e_->mu);
    if (channel_ < 0 && claimed_ >= 0) e_->used.reset(static_cast<size_t>(claimed_));  // opening failed
    size_t unfinished = 0;  // requests the layers above left (the notices' receives are its own)
    for (uint32_t i = 0; i < e_->reqs.size(); ++i) {
      Request& r = e_->reqs[i];
      if (!r.live || r.chan != this) continue;
      const ReqId id = (static_cast<uint64_t>(r.gen) << 32) | i;
      unfinished += std::find(notice_req_.begin(), notice_req_.end(), id) == notice_req_.end();
      cancelOps(i, r.gen);
      release(i);
    }
    // Registrations that operations may still use close after the endpoint (~Endpoint).
    bool keep_mrs = e_->key.empty();  // its own: closed (endpoint first) when endpoint_ goes
    if (!keep_mrs) {
      const Deadline d(1000);
      while (opsInFlight() > 0 && !d.expired()) {
        if (drainCq() == 0) {
          lk.unlock();
          std::this_thread::yield();
          lk.lock();
        }
      }
      const size_t left = opsInFlight();
      if (channel_ >= 0) {
        e_->used.reset(static_cast<size_t>(channel_));
        // A peer that failed may still send this channel its notice, and one whose message
        // this rank left unreceived may have sent it: the number is not reused (a later
        // communicator takes only a number free on all its ranks).
        if (left > 0 || unfinished > 0 || aborted_.load() || announced_ || notice_seen_)
          e_->retired.set(static_cast<size_t>(channel_));
      }
      if (left > 0) {
        for (Op& op : e_->ops)
          if (op.in_use && op.chan == this) op.chan = nullptr;
        keep_mrs = true;
        leaveSharing(*e_);
        HC_WARN("ofi: rank {} closed channel {} with {} operations in flight; its endpoint takes no new channels",
                rank_, channel_, left);
      }
    }
    if (keep_mrs) {
      for (auto& [base, r] : regions_) e_->orphan_mrs.push_back(std::move(r.mr));
      for (auto& m : retired_mrs_) e_->orphan_mrs.push_back(std::move(m));
    }
    regions_.clear();
    retired_mrs_.clear();
  } catch (const std::exception& e) {
    HC_WARN("ofi: rank {} closing its channel: {}", rank_, e.what());
  }
  e_ = nullptr;
  endpoint_.reset();  // the last channel of an endpoint closes it
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
  if (!e_->free_reqs.empty()) {
    idx = e_->free_reqs.back();
    e_->free_reqs.pop_back();
  } else {
    idx = static_cast<uint32_t>(e_->reqs.size());
    e_->reqs.emplace_back();
  }
  Request& r = e_->reqs[idx];
  uint32_t gen = r.gen;
  r = Request{};
  r.gen = gen;
  r.live = true;
  return idx;
}

void OfiTransport::release(uint32_t idx) {
  Request& r = e_->reqs[idx];
  r.live = false;
  r.msg.clear();
  if (++r.gen == 0) r.gen = 1;  // late completions of its operations are recognised as stale
  e_->free_reqs.push_back(idx);
}

Request& OfiTransport::lookup(ReqId id) {
  uint32_t idx = static_cast<uint32_t>(id & 0xffffffffu), gen = static_cast<uint32_t>(id >> 32);
  HC_CHECK(idx < e_->reqs.size() && e_->reqs[idx].live && e_->reqs[idx].gen == gen && e_->reqs[idx].chan == this,
           hcInvalidUsage, "rank {} ofi: test() of an unknown or already completed request {:#x}", rank_, id);
  return e_->reqs[idx];
}

Request* OfiTransport::owner(const Op* op) {
  if (op->req >= e_->reqs.size()) return nullptr;
  Request& r = e_->reqs[op->req];
  return r.live && r.gen == op->gen ? &r : nullptr;
}

Op* OfiTransport::allocOp(uint32_t req, uint32_t gen, size_t offset, size_t len, MrEntry* mr) {
  Op* op;
  if (!e_->free_ops.empty()) {
    op = e_->free_ops.back();
    e_->free_ops.pop_back();
  } else {
    op = &e_->ops.emplace_back();
  }
  std::memset(&op->ctx, 0, sizeof(op->ctx));
  op->req = req;
  op->gen = gen;
  op->offset = offset;
  op->len = len;
  op->mr = mr;
  op->chan = this;
  op->in_use = true;
  if (mr && mr->refs++ > 0) ++e_->mr_reuses;
  ++e_->ops_in_use;
  return op;
}

void OfiTransport::freeOp(Op* op) {
  if (op->mr) cacheRelease(op->mr);
  op->mr = nullptr;
  op->in_use = false;
  --e_->ops_in_use;
  e_->free_ops.push_back(op);
}

void OfiTransport::fail(Request& r, hcResult_t code, std::string msg) {
  if (r.err != hcSuccess) return;  // keep the first cause
  r.err = code;
  r.msg = std::move(msg);
}

void OfiTransport::cancelOps(uint32_t req, uint32_t gen) {
  for (Op& op : e_->ops)
    if (op.in_use && op.req == req && op.gen == gen) fi_cancel(&e_->ep.get()->fid, &op.ctx);
}

// ---- posting ----

ReqId OfiTransport::post(bool send, int peer, void* buf, size_t len, uint64_t tag, size_t* received) {
  const char* what = send ? "send to" : "receive from";
  if (aborted_.load()) throwAborted(what, peer, tag);
  std::lock_guard<std::mutex> lk(e_->mu);
  if (aborted_.load()) throwAborted(what, peer, tag);
  HC_CHECK(!e_->broken, hcRemoteError,
           "rank {} ofi: transport unusable after a failed split message; {} peer {} tag {:#x} refused", rank_, what,
           peer, tag);
  HC_CHECK(peer >= 0 && peer < size_, hcInvalidArgument, "rank {} ofi: {} peer {} out of range [0, {})", rank_, what,
           peer, size_);
  HC_CHECK((tag & ~mask_) == 0, hcInvalidArgument,
           "rank {} ofi: {} peer {}: tag {:#x} does not fit the {} tag bits of provider {}", rank_, what, peer, tag,
           bits_, e_->provider);
  HC_CHECK(len == 0 || buf != nullptr, hcInvalidArgument, "rank {} ofi: {} peer {} tag {:#x}: null buffer of {} bytes",
           rank_, what, peer, tag, len);

  void* desc = nullptr;
  MrEntry* mr = nullptr;
  if (len > 0) {
    desc = regionDesc(buf, len);
    if (desc) {
      ++e_->region_hits;
    } else if (e_->local_mr) {
      mr = cacheAcquire(buf, len);
      desc = fi_mr_desc(mr->mr.get());
    }
  }

  const uint32_t idx = allocRequest();
  const uint32_t gen = e_->reqs[idx].gen;
  {
    Request& r = e_->reqs[idx];
    r.send = send;
    r.chan = this;
    r.peer = peer;
    r.tag = tag;
    r.len = len;
    r.received = received;
  }
  const size_t chunks = len == 0 ? 1 : (len - 1) / e_->max_chunk + 1;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * e_->max_chunk;
    Op* op = allocOp(idx, gen, off, std::min(e_->max_chunk, len - off), mr);
    try {
      postOp(send, op, len ? static_cast<char*>(buf) + off : buf, desc, peer, tag);
    } catch (...) {
      freeOp(op);
      if (c > 0) {
        e_->broken = true;
        cancelOps(idx, gen);
      }
      release(idx);
      throw;
    }
    ++e_->reqs[idx].pending;
  }
  HC_TRACE("ofi: rank {} posted {} {} tag {:#x} {} bytes{}", rank_, what, peer, tag, len,
           chunks > 1 ? fmt::format(" in {} chunks", chunks) : "");
  return (static_cast<uint64_t>(gen) << 32) | idx;
}

void OfiTransport::postOp(bool send, Op* op, void* buf, void* desc, int peer, uint64_t tag) {
  const long limit = post_limit_ms_.load();
  const fi_addr_t addr = addrs_[static_cast<size_t>(peer)];
  const uint64_t wire = prefix_ | tag;
  waitUntil(
      [&] {
        ssize_t rc = send ? fi_tsend(e_->ep.get(), buf, op->len, desc, addr, wire, &op->ctx)
                          : fi_trecv(e_->ep.get(), buf, op->len, desc, addr, wire, 0, &op->ctx);
        if (rc == 0) return Progress::Done;
        HC_CHECK(rc == -FI_EAGAIN, hcSystemError, "rank {} ofi: {} {} tag {:#x} ({} bytes): {}", rank_,
                 send ? "fi_tsend to" : "fi_trecv from", peerStr(peer), tag, op->len, fiStr(rc));
        // The queue is full: completions free it (and the provider may need progress to send).
        ++e_->post_retries;
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
    ssize_t n = fi_cq_read(e_->cq.get(), ents, 32);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) complete(static_cast<Op*>(ents[i].op_context), ents[i].len, 0, 0, {});
      done += static_cast<size_t>(n);
      if (n < 32) return done;
      continue;
    }
    if (n == -FI_EAGAIN) return done;
    HC_CHECK(n == -FI_EAVAIL, hcSystemError, "rank {} ofi: fi_cq_read: {}", rank_, fiStr(n));
    fi_cq_err_entry err{};
    ssize_t m = fi_cq_readerr(e_->cq.get(), &err, 0);
    if (m == -FI_EAGAIN) continue;
    HC_CHECK(m >= 0, hcSystemError, "rank {} ofi: fi_cq_readerr: {}", rank_, fiStr(m));
    char pbuf[256] = {};
    const char* pstr = fi_cq_strerror(e_->cq.get(), err.prov_errno, err.err_data, pbuf, sizeof(pbuf));
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
  const OfiTransport& c = *r->chan;  // another channel's, on a shared endpoint
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
         fmt::format("rank {} ofi: size mismatch from {}: expected {} got {} bytes (tag {:#x})", c.rank_,
                     c.peerStr(r->peer), r->len, got, r->tag));
    cancelOps(ri, rg);  // the remaining chunks must not swallow later messages
    return;
  }
  if (err == FI_ECANCELED) {
    fail(*r, hcRemoteError,
         fmt::format("rank {} ofi: {} {} tag {:#x} cancelled", c.rank_, r->send ? "send to" : "receive from",
                     c.peerStr(r->peer), r->tag));
    return;
  }
  fail(*r, classify(err),
       fmt::format("rank {} ofi: {} {} tag {:#x} ({} bytes) failed: {}", c.rank_, r->send ? "send to" : "receive from",
                   c.peerStr(r->peer), r->tag, r->len, why));
}

bool OfiTransport::test(ReqId id) {
  std::lock_guard<std::mutex> lk(e_->mu);
  Request& r0 = lookup(id);
  const uint32_t idx = static_cast<uint32_t>(id & 0xffffffffu);
  if (r0.pending > 0 && r0.err == hcSuccess && !aborted_.load()) drainCq();
  Request& r = e_->reqs[idx];
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
  std::lock_guard<std::mutex> lk(e_->mu);
  drainCq();
}

void OfiTransport::abort() {
  aborted_.store(true);  // a post spinning on a full queue gives up without the lock
  std::lock_guard<std::mutex> lk(e_->mu);
  // Best effort: receives are cancelled; rxm cannot cancel sends, which stay posted until the
  // endpoint is closed. test() reports every unfinished request as aborted from now on.
  for (Op& op : e_->ops)
    if (op.in_use && op.chan == this) fi_cancel(&e_->ep.get()->fid, &op.ctx);
  HC_INFO("ofi: rank {} aborted with {} operations outstanding", rank_, opsInFlight());
}

// ---- memory registration ----

FidPtr<fid_mr> OfiTransport::regMr(uintptr_t base, size_t len) {
  FidPtr<fid_mr> mr;
  const uint64_t key = e_->prov_key ? 0 : e_->next_key++;
  int rc =
      fi_mr_reg(e_->domain.get(), reinterpret_cast<void*>(base), len, FI_SEND | FI_RECV, 0, key, 0, mr.out(), nullptr);
  HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_mr_reg({:#x}, {} bytes): {}", rank_, base, len, fiStr(rc));
  if (e_->mr_endpoint) {
    rc = fi_mr_bind(mr.get(), &e_->ep.get()->fid, 0);
    HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_mr_bind: {}", rank_, fiStr(rc));
    rc = fi_mr_enable(mr.get());
    HC_CHECK(rc == 0, hcSystemError, "rank {} ofi: fi_mr_enable: {}", rank_, fiStr(rc));
  }
  return mr;
}

void OfiTransport::registerRegion(void* base, size_t len) {
  if (!base || len == 0) return;
  std::lock_guard<std::mutex> lk(e_->mu);
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
  for (MrEntry& m : e_->cache) {
    if (m.start <= s && e <= m.end) return &m;
  }
  MrEntry& m = e_->cache.emplace_back();
  try {
    m.mr = regMr(s, e - s);
  } catch (...) {
    e_->cache.pop_back();
    throw;
  }
  m.start = s;
  m.end = e;
  ++e_->mr_regs;
  return &m;
}

void OfiTransport::cacheRelease(MrEntry* e) {
  if (--e->refs > 0) return;
  e_->cache.remove_if([e](const MrEntry& m) { return &m == e; });
}

ofi_detail::OfiInfo OfiTransport::info() const {
  std::lock_guard<std::mutex> lk(e_->mu);
  ofi_detail::OfiInfo i;
  i.provider = e_->provider;
  i.fabric = e_->info->fabric_attr->name ? e_->info->fabric_attr->name : "";
  i.domain = e_->info->domain_attr->name ? e_->info->domain_attr->name : "";
  i.address = address_;
  i.tag_bits = bits_;
  i.channel = channel_;
  i.max_chunk = e_->max_chunk;
  i.local_mr = e_->local_mr;
  i.mr_regs = e_->mr_regs;
  i.mr_reuses = e_->mr_reuses;
  i.region_hits = e_->region_hits;
  i.post_retries = e_->post_retries;
  return i;
}

}  // namespace ofi

std::unique_ptr<Transport> makeOfiTransport(Bootstrap& bs, const OfiOptions& opt) {
  return ofi_detail::makeOfiTransport(bs, opt, ofi_detail::OfiTuning{});
}

std::string interfaceIpv4(const std::string& iface) {
  sockaddr_in a{};
  char ip[INET_ADDRSTRLEN] = {};
  if (iface.empty() || !ofi::ifaceIpv4(iface, &a) || !inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip)) return "";
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
  return std::make_unique<ofi::OfiTransport>(bs, opt, tuning);
}

OfiInfo ofiInfo(Transport& t) {
  auto* o = dynamic_cast<ofi::OfiTransport*>(&t);
  HC_CHECK(o != nullptr, hcInvalidArgument, "ofiInfo: transport '{}' is not ofi", t.name());
  return o->info();
}

}  // namespace ofi_detail
}  // namespace hicoll
