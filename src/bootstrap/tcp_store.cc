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

#include "base/error.h"
#include "base/log.h"

namespace hicoll {
namespace {

constexpr uint64_t kMagic = 0x68636f6c6c763031ULL;                    // "hcollv01"
constexpr uint32_t kOpSet = 1, kOpGet = 2, kOpDel = 3, kOpCheck = 4;  // check: get at once, or kAbsent
constexpr uint64_t kAbsent = UINT64_MAX;
constexpr uint32_t kMaxKey = 1024;
constexpr size_t kMaxConnections = 4096;
// Greeting replies.
constexpr uint32_t kHelloOk = 0, kHelloTaken = 1, kHelloBadSecret = 2;

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
  Server(Fd listening, const Secret& secret, const TcpStoreLimits& limits)
      : secret_(secret), limits_(limits), listen_(std::move(listening)) {
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
  // process set), bounded by limits.drain_ms (the communicator's timeout).
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
      for (auto& c : conns_)
        fds.push_back({c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
      int rc = ::poll(fds.data(), fds.size(), draining_ ? 20 : 1000);
      if (rc < 0 && errno != EINTR) return;
      if (fds[1].revents & POLLIN) {
        char buf[16];
        (void)!::read(wake_r_.get(), buf, sizeof buf);
        draining_ = true;
        drain_end_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(limits_.drain_ms);
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
        if (!c->dead && !c->authed && now - c->since > std::chrono::milliseconds(limits_.hello_ms))
          drop(*c, "no hello in time");
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
      // Too many strangers: the oldest goes (a real rank greets at once, so it is never old).
      size_t unauthed = 0;
      Conn* oldest = nullptr;
      for (auto& c : conns_)
        if (!c->dead && !c->authed && (++unauthed, !oldest || c->since < oldest->since)) oldest = c.get();
      if (unauthed >= limits_.max_unauthenticated && oldest) drop(*oldest, "too many unauthenticated connections");
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
      // Before the greeting is checked, nothing beyond it is read.
      const size_t want = c.authed ? sizeof buf : sizeof(Hello) - c.in.size();
      ssize_t n = want == 0 ? 0 : ::recv(c.fd.get(), buf, want, 0);
      if (n == 0 && want > 0) return drop(c, "closed");
      if (n < 0) {
        if (errno != EAGAIN && errno != EINTR) drop(c, "error");
        break;
      }
      c.in.insert(c.in.end(), buf, buf + n);
      if (c.in.size() > limits_.max_value + kMaxKey + 64) return drop(c, "oversized request");
      while (!c.dead && parseOne(c)) {
      }
      if (!c.authed) break;
    }
  }

  // Consumes one complete message from c.in; false when more bytes are needed.
  bool parseOne(Conn& c) {
    if (!c.authed) {
      if (c.in.size() < sizeof(Hello)) return false;
      Hello h;
      std::memcpy(&h, c.in.data(), sizeof h);
      c.in.erase(c.in.begin(), c.in.begin() + sizeof h);
      if (h.magic != kMagic) {
        drop(c, "bad magic");
        return false;
      }
      if (std::memcmp(h.secret, secret_.data(), 16) != 0) return refuse(c, kHelloBadSecret, "wrong secret");
      // A taken rank or a different world size: refuse, keep the job intact.
      if (h.rank < 0 || h.rank >= h.nranks || ranks_.count(h.rank) || (nranks_ && h.nranks != nranks_))
        return refuse(c, kHelloTaken, "rank taken or world size differs");
      nranks_ = h.nranks;
      c.authed = true;
      c.rank = h.rank;
      ranks_.insert(h.rank);
      uint32_t ok = kHelloOk;
      append(c, &ok, 4);
      return true;
    }
    if (c.in.size() < sizeof(ReqHeader)) return false;
    ReqHeader r;
    std::memcpy(&r, c.in.data(), sizeof r);
    if (r.op < kOpSet || r.op > kOpCheck || r.keylen > kMaxKey || r.vallen > limits_.max_value) {
      drop(c, r.vallen > limits_.max_value ? "value larger than the limit" : "malformed request");
      return false;
    }
    size_t need = sizeof r + r.keylen + (r.op == kOpSet ? r.vallen : 0);
    if (c.in.size() < need) return false;
    std::string key(reinterpret_cast<char*>(c.in.data()) + sizeof r, r.keylen);
    if (r.op == kOpSet) {
      auto* v = c.in.data() + sizeof r + r.keylen;
      eraseKey(key);
      // Each rank's keys count against its own quota: a rank (or a stranger holding a rank)
      // that exceeds it is dropped and its keys go with it, the others are not affected.
      if (held_[c.rank] + key.size() + r.vallen > limits_.per_rank_total) {
        dropKeysOf(c.rank);
        drop(c, "it stored more than a rank's limit");
        return false;
      }
      held_[c.rank] += key.size() + r.vallen;
      data_[key] = Entry{std::vector<uint8_t>(v, v + r.vallen), c.rank};
      uint32_t ok = 0;
      append(c, &ok, 4);
      auto it = waiting_.find(key);
      if (it != waiting_.end()) {
        for (Conn* w : it->second) reply(*w, key);
        waiting_.erase(it);
      }
    } else if (r.op == kOpDel) {
      eraseKey(key);
      uint32_t ok = 0;
      append(c, &ok, 4);
    } else if (data_.count(key)) {
      reply(c, key);
    } else if (r.op == kOpCheck) {
      append(c, &kAbsent, 8);
    } else {
      waiting_[key].push_back(&c);
    }
    c.in.erase(c.in.begin(), c.in.begin() + need);
    return true;
  }

  bool refuse(Conn& c, uint32_t status, const char* why) {
    c.out.resize(4);
    std::memcpy(c.out.data(), &status, 4);
    writeTo(c);
    drop(c, why);
    return false;
  }
  void eraseKey(const std::string& key) {
    auto it = data_.find(key);
    if (it == data_.end()) return;
    held_[it->second.owner] -= it->first.size() + it->second.v.size();
    data_.erase(it);
  }
  void dropKeysOf(int rank) {
    std::erase_if(data_, [&](const auto& kv) { return kv.second.owner == rank; });
    held_.erase(rank);
  }

  void reply(Conn& c, const std::string& key) {
    const auto& v = data_[key].v;
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
  TcpStoreLimits limits_;
  Fd listen_;
  SockAddr addr_;
  Fd wake_r_, wake_w_;
  std::vector<std::unique_ptr<Conn>> conns_;
  struct Entry {
    std::vector<uint8_t> v;
    int owner = -1;  // the rank that set it
  };
  std::map<std::string, Entry> data_;
  std::map<int, size_t> held_;  // bytes of keys and values per rank
  std::map<std::string, std::vector<Conn*>> waiting_;
  std::set<int> ranks_;
  int nranks_ = 0;
  bool draining_ = false;
  std::chrono::steady_clock::time_point drain_end_;
  std::thread thread_;
};

class Client : public Store {
 public:
  Client(const SockAddr& addr, const Secret& secret, int rank, int nranks, long timeout_ms)
      : addr_(addr), timeout_ms_(timeout_ms) {
    Deadline d(timeout_ms);
    fd_ = connectTo(addr, d);
    Hello h{kMagic, {}, rank, nranks};
    std::memcpy(h.secret, secret.data(), 16);
    sendAll(fd_.get(), &h, sizeof h, d);
    uint32_t status = kHelloTaken;
    try {
      recvAll(fd_.get(), &status, 4, d);
    } catch (const Error& e) {
      HC_THROW(e.code(), "bootstrap: rank {} of {}: no answer from the rendezvous at {} to its greeting: {}", rank,
               nranks, addr.str(), e.what());
    }
    HC_CHECK(status != kHelloBadSecret, hcInvalidUsage,
             "bootstrap: the rendezvous at {} refused rank {} of {}: wrong secret (HICOLL_COMM_SECRET, or the "
             "launcher's job id it is derived from, differs from rank 0's)",
             addr.str(), rank, nranks);
    HC_CHECK(status == kHelloOk, hcInvalidUsage,
             "bootstrap: the rendezvous at {} refused rank {} of {}: rank {} is already taken or another rank "
             "announced a different world size",
             addr.str(), rank, nranks, rank);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override { request(kOpSet, key, &value); }
  void erase(const std::string& key) override { request(kOpDel, key, nullptr); }
  std::vector<uint8_t> get(const std::string& key, size_t len, long timeout_ms) override {
    std::vector<uint8_t> v;
    fetch(kOpGet, key, len, timeout_ms, &v);
    return v;
  }
  bool pollable() const override { return true; }
  bool tryGet(const std::string& key, size_t len, std::vector<uint8_t>* out) override {
    return fetch(kOpCheck, key, len, timeout_ms_, out);
  }

 private:
  // A get (waits for the key, up to timeout_ms) or a check (answered at once); false when a
  // check found no key.
  bool fetch(uint32_t op, const std::string& key, size_t len, long timeout_ms, std::vector<uint8_t>* out) {
    std::lock_guard<std::mutex> lock(mu_);
    HC_CHECK(!broken_, hcRemoteError, "bootstrap: connection to {} is unusable after an earlier timeout", addr_.str());
    Deadline d(timeout_ms);
    ReqHeader r{op, static_cast<uint32_t>(key.size()), len};
    try {
      sendAll(fd_.get(), &r, sizeof r, d);
      sendAll(fd_.get(), key.data(), key.size(), d);
      uint64_t got = 0;
      recvAll(fd_.get(), &got, 8, d);
      if (got == kAbsent && op == kOpCheck) return false;
      HC_CHECK(got <= (uint64_t{1} << 32), hcRemoteError, "bootstrap: key '{}' announced {} bytes", key, got);
      std::vector<uint8_t>& v = *out;
      v.resize(got);
      recvAll(fd_.get(), v.data(), got, d);
      HC_CHECK(got == len, hcRemoteError, "bootstrap: key '{}' has {} bytes, expected {}", key, got, len);
      return true;
    } catch (const Error& e) {
      broken_ = true;
      HC_THROW(e.code(), "{} (waiting for key '{}' from {})", e.what(), key, addr_.str());
    }
  }

  void request(uint32_t op, const std::string& key, const std::vector<uint8_t>* value) {
    std::lock_guard<std::mutex> lock(mu_);
    HC_CHECK(!broken_, hcRemoteError, "bootstrap: connection to {} is unusable after an earlier error", addr_.str());
    Deadline d(timeout_ms_);
    const size_t vlen = value ? value->size() : 0;
    ReqHeader r{op, static_cast<uint32_t>(key.size()), vlen};
    try {
      sendAll(fd_.get(), &r, sizeof r, d);
      sendAll(fd_.get(), key.data(), key.size(), d);
      if (vlen) sendAll(fd_.get(), value->data(), vlen, d);
      uint32_t ok;
      recvAll(fd_.get(), &ok, 4, d);
    } catch (const Error& e) {
      broken_ = true;
      HC_THROW(e.code(), "{} ({} of key '{}', {} bytes, at {})", e.what(), op == kOpSet ? "set" : "delete", key, vlen,
               addr_.str());
    }
  }

  SockAddr addr_;
  long timeout_ms_;
  Fd fd_;
  std::mutex mu_;
  bool broken_ = false;
};

}  // namespace

std::shared_ptr<TcpStoreServer> startTcpStoreServer(SockAddr addr, const Secret& secret, const TcpStoreLimits& limits) {
  return std::make_shared<Server>(listenOn(addr), secret, limits);
}

std::shared_ptr<TcpStoreServer> startTcpStoreServer(Fd listening, const Secret& secret, const TcpStoreLimits& limits) {
  int accepting = 0;
  socklen_t len = sizeof accepting;
  HC_CHECK(getsockopt(listening.get(), SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting,
           hcInvalidArgument, "HICOLL_RENDEZVOUS_FD={} is not a listening socket", listening.get());
  return std::make_shared<Server>(std::move(listening), secret, limits);
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
