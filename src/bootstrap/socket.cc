#include "bootstrap/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "base/error.h"

namespace hicoll {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}
Fd::~Fd() {
  reset();
}
void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string SockAddr::str() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return fmt::format("{}:{}", host, ntohs(a->sin_port));
  }
  auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
  return fmt::format("[{}]:{}", host, ntohs(a->sin6_port));
}

int SockAddr::port() const {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
}

SockAddr resolveHostPort(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string p = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), p.c_str(), &hints, &res);
  HC_CHECK(rc == 0 && res, hcInvalidArgument, "bootstrap: cannot resolve '{}': {}", host, gai_strerror(rc));
  SockAddr a;
  std::memcpy(&a.ss, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  freeaddrinfo(res);
  return a;
}

SockAddr addressOfInterface(const std::string& ifname) {
  if (ifname.empty()) return resolveHostPort("127.0.0.1", 0);
  ifaddrs* list = nullptr;
  HC_SYSCHECK(getifaddrs(&list), "getifaddrs");
  SockAddr found;
  for (int family : {AF_INET, AF_INET6}) {
    for (ifaddrs* i = list; i && found.len == 0; i = i->ifa_next) {
      if (!i->ifa_addr || ifname != i->ifa_name || i->ifa_addr->sa_family != family) continue;
      found.len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      std::memcpy(&found.ss, i->ifa_addr, found.len);
    }
  }
  freeifaddrs(list);
  HC_CHECK(found.len != 0, hcInvalidArgument, "HICOLL_SOCKET_IFNAME='{}': no such interface with an IP address",
           ifname);
  return found;
}

void setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  HC_SYSCHECK(fcntl(fd, F_SETFL, flags | O_NONBLOCK), "fcntl(O_NONBLOCK)");
}

Fd listenOn(SockAddr& addr) {
  Fd fd(::socket(addr.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  HC_SYSCHECK(fd.get(), "socket");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr.ss), addr.len) < 0)
    HC_THROW(hcSystemError, "bootstrap: cannot listen on {}: {}", addr.str(), std::strerror(errno));
  HC_SYSCHECK(::listen(fd.get(), 128), "listen");
  addr.len = sizeof addr.ss;
  HC_SYSCHECK(getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr.ss), &addr.len), "getsockname");
  return fd;
}

Fd connectTo(const SockAddr& addr, const Deadline& deadline) {
  int delay_ms = 5;
  while (true) {
    Fd fd(::socket(addr.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    HC_SYSCHECK(fd.get(), "socket");
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.ss), addr.len) == 0) {
      int one = 1;
      setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    int err = errno;
    if ((err != ECONNREFUSED && err != ETIMEDOUT && err != EAGAIN) || deadline.expired())
      HC_THROW(deadline.expired() ? hcTimeout : hcSystemError, "bootstrap: cannot connect to {}: {}", addr.str(),
               std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    delay_ms = std::min(delay_ms * 2, 200);
  }
}

namespace {
void waitFd(int fd, short events, const Deadline& deadline, const char* what) {
  pollfd p{fd, events, 0};
  while (true) {
    int rc = ::poll(&p, 1, static_cast<int>(std::min<long>(deadline.remainingMs(), 1000)));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) HC_SYSCHECK(rc, "poll");
    if (deadline.expired()) HC_THROW(hcTimeout, "bootstrap: timed out in {}", what);
  }
}
}  // namespace

void sendAll(int fd, const void* buf, size_t len, const Deadline& deadline) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      waitFd(fd, POLLOUT, deadline, "send");
    } else {
      HC_THROW(hcRemoteError, "bootstrap: connection lost while sending: {}", std::strerror(errno));
    }
  }
}

void recvAll(int fd, void* buf, size_t len, const Deadline& deadline) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n == 0) {
      HC_THROW(hcRemoteError, "bootstrap: the peer closed the connection");
    } else if (errno == EAGAIN || errno == EINTR) {
      waitFd(fd, POLLIN, deadline, "recv");
    } else {
      HC_THROW(hcRemoteError, "bootstrap: connection lost while receiving: {}", std::strerror(errno));
    }
  }
}

}  // namespace hicoll
