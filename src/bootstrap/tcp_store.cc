#include "bootstrap/tcp_store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace hicoll {
namespace {

constexpr uint64_t kMagic = 0x68636f6c6c763031ULL;  // "hcollv01"
constexpr uint32_t kOpSet = 1, kOpGet = 2;
constexpr uint32_t kMaxKey = 1024;
constexpr uint64_t kMaxValue = 64ull << 20;
constexpr int kHelloTimeoutMs = 10000;
constexpr size_t kMaxConnections = 4096;
constexpr int kDrainMs = 60000;

struct Hello {
  uint64_t magic;
  uint8_t secret[16];
  int32_t rank, nranks;
};
struct ReqHeader {
  uint32_t op, keylen;
  uint64_t vallen;
};
static_assert(sizeof(Hello) == 32, "wire layout");
static_assert(sizeof(ReqHeader) == 16, "wire layout");

class Server : public TcpStoreServer {
 public:
  Server(Fd listening, const Secret& secret) : secret_(secret), listen_(std::move(listening)) {
    addr_.len = sizeof addr_.ss;
    HC_SYSCHECK(getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&addr_.ss), &addr_.len), "getsockname");
    setNonBlocking(listen_.get());
    int p[2];
    HC_SYSCHECK(pipe2(p, O_CLOEXEC | O_NONBLOCK), "pipe2");
    wake_r_ = Fd(p[0]);
    wake_w_ = Fd(p[1]);
    thread_ = std::thread([this] { loop(); });
  }
  // Keeps serving until every rank has disconnected (they may still be reading keys this
  // process set), bounded by kDrainMs.
  ~Server() override {
    char c = 1;
    (void)!::write(wake_w_.get(), &c, 1);
    thread_.join();
  }
  SockAddr address() const override { return addr_; }

 private:
  struct Conn {
    Fd fd;
    std::vector<uint8_t> in, out;
    bool authed = false;
    int rank = -1;
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
    bool dead = false;
  };

  void loop() {
    while (true) {
      std::vector<pollfd> fds{{listen_.get(), POLLIN, 0}, {wake_r_.get(), POLLIN, 0}};
      for (auto& c : conns_) fds.push_back({c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
      int rc = ::poll(fds.data(), fds.size(), draining_ ? 20 : 1000);
      if (rc < 0 && errno != EINTR) return;
      if (fds[1].revents & POLLIN) {
        char buf[16];
        (void)!::read(wake_r_.get(), buf, sizeof buf);
        draining_ = true;
        drain_end_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(kDrainMs);
      }
      if (draining_ && (ranks_.empty() || std::chrono::steady_clock::now() > drain_end_)) return;
      if (fds[0].revents & POLLIN) acceptAll();
      for (size_t i = 2; i < fds.size(); ++i) {
        Conn& c = *conns_[i - 2];
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) readFrom(c);
        if (!c.dead && !c.out.empty()) writeTo(c);
      }
      auto now = std::chrono::steady_clock::now();
      for (auto& c : conns_)
        if (!c->authed && now - c->since > std::chrono::milliseconds(kHelloTimeoutMs)) drop(*c, "no hello in time");
      std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return c->dead; });
    }
  }

  void acceptAll() {
    while (true) {
      int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (conns_.size() >= kMaxConnections) {
        ::close(fd);
        continue;
      }
      auto c = std::make_unique<Conn>();
      c->fd = Fd(fd);
      conns_.push_back(std::move(c));
    }
  }

  void drop(Conn& c, const char* why) {
    if (c.authed) {
      HC_INFO("bootstrap: rank {} disconnected from the rendezvous ({})", c.rank, why);
      ranks_.erase(c.rank);
      for (auto& [key, waiters] : waiting_) std::erase(waiters, &c);
    } else {
      HC_INFO("bootstrap: rejected a connection to the rendezvous ({})", why);
    }
    c.dead = true;
    c.fd.reset();
  }

  void readFrom(Conn& c) {
    uint8_t buf[65536];
    while (!c.dead) {
      ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (n == 0) return drop(c, "closed");
      if (n < 0) {
        if (errno != EAGAIN && errno != EINTR) drop(c, "error");
        break;
      }
      c.in.insert(c.in.end(), buf, buf + n);
      if (c.in.size() > kMaxValue + kMaxKey + 64) return drop(c, "oversized request");
    }
    while (!c.dead && parseOne(c)) {
    }
  }

  // Consumes one complete message from c.in; false when more bytes are needed.
  bool parseOne(Conn& c) {
    if (!c.authed) {
      if (c.in.size() < sizeof(Hello)) return false;
      Hello h;
      std::memcpy(&h, c.in.data(), sizeof h);
      c.in.erase(c.in.begin(), c.in.begin() + sizeof h);
      uint32_t status = 0;
      if (h.magic != kMagic || std::memcmp(h.secret, secret_.data(), 16) != 0) {
        drop(c, "bad magic or secret");
        return false;
      }
      if (h.rank < 0 || h.rank >= h.nranks || ranks_.count(h.rank) || (nranks_ && h.nranks != nranks_)) {
        status = 1;  // a taken rank or a different world size: refuse, keep the job intact
        c.out.resize(4);
        std::memcpy(c.out.data(), &status, 4);
        writeTo(c);
        drop(c, "rank taken or world size differs");
        return false;
      }
      nranks_ = h.nranks;
      c.authed = true;
      c.rank = h.rank;
      ranks_.insert(h.rank);
      append(c, &status, 4);
      return true;
    }
    if (c.in.size() < sizeof(ReqHeader)) return false;
    ReqHeader r;
    std::memcpy(&r, c.in.data(), sizeof r);
    if ((r.op != kOpSet && r.op != kOpGet) || r.keylen > kMaxKey || r.vallen > kMaxValue) {
      drop(c, "malformed request");
      return false;
    }
    size_t need = sizeof r + r.keylen + (r.op == kOpSet ? r.vallen : 0);
    if (c.in.size() < need) return false;
    std::string key(reinterpret_cast<char*>(c.in.data()) + sizeof r, r.keylen);
    if (r.op == kOpSet) {
      auto* v = c.in.data() + sizeof r + r.keylen;
      data_[key].assign(v, v + r.vallen);
      uint32_t ok = 0;
      append(c, &ok, 4);
      auto it = waiting_.find(key);
      if (it != waiting_.end()) {
        for (Conn* w : it->second) reply(*w, key);
        waiting_.erase(it);
      }
    } else if (data_.count(key)) {
      reply(c, key);
    } else {
      waiting_[key].push_back(&c);
    }
    c.in.erase(c.in.begin(), c.in.begin() + need);
    return true;
  }

  void reply(Conn& c, const std::string& key) {
    const auto& v = data_[key];
    uint64_t len = v.size();
    append(c, &len, 8);
    append(c, v.data(), v.size());
  }
  void append(Conn& c, const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    c.out.insert(c.out.end(), b, b + n);
  }
  void writeTo(Conn& c) {
    while (!c.out.empty()) {
      ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        return drop(c, "send failed");
      }
      c.out.erase(c.out.begin(), c.out.begin() + n);
    }
  }

  Secret secret_;
  Fd listen_;
  SockAddr addr_;
  Fd wake_r_, wake_w_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::map<std::string, std::vector<uint8_t>> data_;
  std::map<std::string, std::vector<Conn*>> waiting_;
  std::set<int> ranks_;
  int nranks_ = 0;
  bool draining_ = false;
  std::chrono::steady_clock::time_point drain_end_;
  std::thread thread_;
};

class Client : public Store {
 public:
  Client(const SockAddr& addr, const Secret& secret, int rank, int nranks, long timeout_ms) : addr_(addr) {
    Deadline d(timeout_ms);
    fd_ = connectTo(addr, d);
    Hello h{kMagic, {}, rank, nranks};
    std::memcpy(h.secret, secret.data(), 16);
    sendAll(fd_.get(), &h, sizeof h, d);
    uint32_t status = 1;
    recvAll(fd_.get(), &status, 4, d);
    HC_CHECK(status == 0, hcInvalidUsage,
             "bootstrap: the rendezvous at {} refused rank {} of {} (rank already taken or world size differs)",
             addr.str(), rank, nranks);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    Deadline d(60000);
    ReqHeader r{kOpSet, static_cast<uint32_t>(key.size()), value.size()};
    sendAll(fd_.get(), &r, sizeof r, d);
    sendAll(fd_.get(), key.data(), key.size(), d);
    sendAll(fd_.get(), value.data(), value.size(), d);
    uint32_t ok;
    recvAll(fd_.get(), &ok, 4, d);
  }
  std::vector<uint8_t> get(const std::string& key, size_t len, long timeout_ms) override {
    std::lock_guard<std::mutex> lock(mu_);
    HC_CHECK(!broken_, hcRemoteError, "bootstrap: connection to {} is unusable after an earlier timeout", addr_.str());
    Deadline d(timeout_ms);
    ReqHeader r{kOpGet, static_cast<uint32_t>(key.size()), len};
    try {
      sendAll(fd_.get(), &r, sizeof r, d);
      sendAll(fd_.get(), key.data(), key.size(), d);
      uint64_t got = 0;
      recvAll(fd_.get(), &got, 8, d);
      std::vector<uint8_t> v(got);
      recvAll(fd_.get(), v.data(), got, d);
      HC_CHECK(got == len, hcRemoteError, "bootstrap: key '{}' has {} bytes, expected {}", key, got, len);
      return v;
    } catch (const Error& e) {
      broken_ = true;
      HC_THROW(e.code(), "{} (waiting for key '{}' from {})", e.what(), key, addr_.str());
    }
  }

 private:
  SockAddr addr_;
  Fd fd_;
  std::mutex mu_;
  bool broken_ = false;
};

}  // namespace

std::shared_ptr<TcpStoreServer> startTcpStoreServer(SockAddr addr, const Secret& secret) {
  return std::make_shared<Server>(listenOn(addr), secret);
}

std::shared_ptr<TcpStoreServer> startTcpStoreServer(Fd listening, const Secret& secret) {
  int accepting = 0;
  socklen_t len = sizeof accepting;
  HC_CHECK(getsockopt(listening.get(), SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting,
           hcInvalidArgument, "HICOLL_RENDEZVOUS_FD={} is not a listening socket", listening.get());
  return std::make_shared<Server>(std::move(listening), secret);
}

std::shared_ptr<Store> connectTcpStore(const SockAddr& addr, const Secret& secret, int rank, int nranks,
                                       long timeout_ms) {
  return std::make_shared<Client>(addr, secret, rank, nranks, timeout_ms);
}

Secret randomSecret() {
  Secret s;
  HC_CHECK(getrandom(s.data(), s.size(), 0) == static_cast<ssize_t>(s.size()), hcSystemError, "getrandom failed");
  return s;
}

}  // namespace hicoll
