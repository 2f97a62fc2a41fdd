#include "bootstrap/liveness.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"

namespace hicoll {
namespace {

constexpr uint64_t kMagic = 0x68636c6976653031ULL;  // "hclive01"
constexpr char kBye = 'B', kFailed = 'F';
constexpr auto kCheckEvery = std::chrono::milliseconds(5);

struct Published {
  uint8_t token[16];  // proves a connection comes from a rank of this communicator
  uint32_t ip;        // network order
  uint16_t port;
  uint16_t pad;
};
struct Hello {
  uint64_t magic;
  uint8_t token[16];  // the acceptor's token
  int32_t rank;       // the connector
  int32_t pad;
};
static_assert(sizeof(Published) == 24 && sizeof(Hello) == 32, "wire layout");

uint32_t hostIpv4() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  uint32_t ip = htonl(INADDR_LOOPBACK);
  if (getaddrinfo(host, nullptr, &hints, &res) == 0 && res) {
    ip = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr.s_addr;
    freeaddrinfo(res);
  }
  return ip;
}

// Keepalive probes after a quarter of the timeout idle, three of them a sixteenth apart: a
// silent host is found in under half the timeout.
void keepAlive(int fd, long timeout_ms) {
  const int idle = static_cast<int>(std::max<long>(1, timeout_ms / 4000));
  const int intvl = static_cast<int>(std::max<long>(1, timeout_ms / 16000)), cnt = 3, one = 1;
  const unsigned user_timeout = static_cast<unsigned>(std::min<long>(timeout_ms / 2, 1L << 30));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

}  // namespace

Liveness::Liveness(Bootstrap& bs, const std::vector<int>& peers, const std::string& ip, long timeout_ms,
                   std::function<std::string(int)> who, CallClock call_now)
    : who_(std::move(who)), call_now_(std::move(call_now)) {
  Published mine{};
  HC_CHECK(getrandom(mine.token, sizeof mine.token, 0) == sizeof mine.token, hcSystemError, "getrandom failed");
  SockAddr addr;
  auto* in = reinterpret_cast<sockaddr_in*>(&addr.ss);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_ANY);
  if (!ip.empty())
    HC_CHECK(inet_pton(AF_INET, ip.c_str(), &in->sin_addr) == 1, hcInternalError, "liveness: bad ip {}", ip);
  addr.len = sizeof(sockaddr_in);
  Fd listener = listenOn(addr);
  mine.ip = ip.empty() ? hostIpv4() : in->sin_addr.s_addr;
  mine.port = htons(static_cast<uint16_t>(addr.port()));
  std::vector<Published> all(static_cast<size_t>(bs.size()));
  bs.allgather(&mine, all.data(), sizeof mine);

  const Deadline d(timeout_ms);
  // Connect to the higher peers (the kernel's backlog accepts before they call accept), then
  // accept the lower ones.
  size_t expected = 0;
  for (int p : peers) {
    if (p < bs.rank()) {
      ++expected;
      continue;
    }
    SockAddr to;
    auto* t = reinterpret_cast<sockaddr_in*>(&to.ss);
    t->sin_family = AF_INET;
    t->sin_addr.s_addr = all[static_cast<size_t>(p)].ip;
    t->sin_port = all[static_cast<size_t>(p)].port;
    to.len = sizeof(sockaddr_in);
    Fd fd = connectTo(to, d);
    Hello h{kMagic, {}, bs.rank(), 0};
    std::memcpy(h.token, all[static_cast<size_t>(p)].token, sizeof h.token);
    sendAll(fd.get(), &h, sizeof h, d);
    keepAlive(fd.get(), timeout_ms);
    peers_.push_back({p, std::move(fd)});
  }
  while (expected > 0) {
    pollfd pf{listener.get(), POLLIN, 0};
    const int rc = ::poll(&pf, 1, static_cast<int>(std::min<long>(d.remainingMs(), 200)));
    if (d.expired()) {
      std::string missing;  // who has not connected: the lower peers not accepted yet
      for (int p : peers)
        if (p < bs.rank() && std::none_of(peers_.begin(), peers_.end(), [&](const Peer& q) { return q.rank == p; }))
          missing += fmt::format("{}{}", missing.empty() ? "" : ", ", who_(p));
      HC_THROW(hcTimeout,
               "liveness: rank {} timed out after {} ms waiting for the connection of {} (stopped, or "
               "unreachable on the network?)",
               bs.rank(), timeout_ms, missing);
    }
    if (rc <= 0) continue;
    Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) continue;
    Hello h{};
    try {
      recvAll(fd.get(), &h, sizeof h, Deadline(std::min<long>(d.remainingMs(), 2000)));
    } catch (const Error&) {
      continue;  // a stranger or a dead connection: not one of ours
    }
    const bool ours = h.magic == kMagic && std::memcmp(h.token, mine.token, sizeof h.token) == 0 &&
                      std::count(peers.begin(), peers.end(), h.rank) == 1 && h.rank < bs.rank() &&
                      std::none_of(peers_.begin(), peers_.end(), [&](const Peer& q) { return q.rank == h.rank; });
    if (!ours) {
      HC_INFO("liveness: rank {} refused a connection that is not from one of its peers", bs.rank());
      continue;
    }
    keepAlive(fd.get(), timeout_ms);
    peers_.push_back({h.rank, std::move(fd)});
    --expected;
  }
  HC_INFO("liveness: rank {} watches ranks {}", bs.rank(), fmt::join(peers, ","));
}

Liveness::~Liveness() {
  // 'F' carries the number of the call that failed, then why (one small send: it arrives
  // whole, or the watcher reads what came).
  char msg[1 + sizeof(uint64_t) + kReasonBytes] = {failed_ ? kFailed : kBye};
  const uint64_t call = call_now_ ? call_now_() : 0;
  std::memcpy(msg + 1, &call, sizeof call);
  const size_t why = std::min(why_.size(), kReasonBytes);
  std::memcpy(msg + 1 + sizeof call, why_.data(), why);
  const size_t len = failed_ ? 1 + sizeof call + why : 1;
  for (Peer& p : peers_) (void)!::send(p.fd.get(), msg, len, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Liveness::poll(bool causes_only) {
  const auto now = std::chrono::steady_clock::now();
  if (peers_.empty() || (!causes_only && now - last_ < kCheckEvery)) return;
  if (!causes_only) last_ = now;
  // Without its cause this is a symptom (the caller waits briefly for a failure notice).
  auto failedAndClosed = [&](const Peer& p) {
    if (p.why.empty() && causes_only) return;
    if (p.why.empty())
      throw Error(hcRemoteError, fmt::format("{} failed and closed its communicator", who_(p.rank)), Error::kSymptom);
    throw Error(hcRemoteError, fmt::format("{} failed and closed its communicator: {}", who_(p.rank), p.why));
  };
  std::vector<pollfd> fds;
  for (Peer& p : peers_) {
    if (p.failed_later && reportIsDue(call_now_, p.failed_call)) failedAndClosed(p);
    fds.push_back({p.failed_later ? -1 : p.fd.get(), POLLIN, 0});  // poll skips negative fds
  }
  if (::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].revents) continue;
    Peer& p = peers_[i];
    char buf[1 + sizeof(uint64_t) + kReasonBytes];
    const ssize_t n = ::recv(fds[i].fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0 && buf[0] == kFailed) {
      uint64_t call = 0;  // an 'F' cut short is due at once
      if (n >= static_cast<ssize_t>(1 + sizeof call)) std::memcpy(&call, buf + 1, sizeof call);
      if (n > static_cast<ssize_t>(1 + sizeof call))
        p.why.assign(buf + 1 + sizeof call, strnlen(buf + 1 + sizeof call, static_cast<size_t>(n) - 1 - sizeof call));
      if (reportIsDue(call_now_, call)) failedAndClosed(p);
      p.failed_later = true;
      p.failed_call = call;
      continue;
    }
    if (causes_only) continue;  // a closed link is the symptom being explained
    if (n > 0 && buf[0] == kBye)
      HC_THROW(hcRemoteError, "{} destroyed its communicator while this rank still waited for it", who_(p.rank));
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
      HC_THROW(hcRemoteError,
               "{} is gone: its liveness connection closed{}{} (the process died, or its host or "
               "network failed)",
               who_(p.rank), n < 0 ? ": " : "", n < 0 ? std::strerror(errno) : "");
  }
}

}  // namespace hicoll
