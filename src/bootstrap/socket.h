// Small RAII helpers around TCP sockets for the bootstrap (never for bulk data).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <string>
#include <utility>

#include "base/deadline.h"

namespace hicoll {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  std::string str() const;
  int port() const;
};

// host may be a name or a numeric address.
SockAddr resolveHostPort(const std::string& host, int port);
// The IPv4 (else IPv6) address of interface ifname; "" means 127.0.0.1.
SockAddr addressOfInterface(const std::string& ifname);
// Binds and listens; a port of 0 is replaced by the one the kernel chose.
Fd listenOn(SockAddr& addr);
// Retries refused connections (the listener may not be up yet) until the deadline.
Fd connectTo(const SockAddr& addr, const Deadline& deadline);
void sendAll(int fd, const void* buf, size_t len, const Deadline& deadline);
void recvAll(int fd, void* buf, size_t len, const Deadline& deadline);
void setNonBlocking(int fd);

}  // namespace hicoll
