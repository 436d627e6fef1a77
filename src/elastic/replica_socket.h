// The TCP pieces under the replica ring (elastic/replica_ring.h): an owner of a socket, the
// listening socket a member publishes ("host:port"), a connect with a deadline, and reads and
// writes that poll until a deadline. Sockets are nonblocking; writes use MSG_NOSIGNAL, so a peer
// that is gone is an EPIPE Status, never a SIGPIPE.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "hsdp/status.h"

namespace hsdp::elastic {

using ReplicaClock = std::chrono::steady_clock;

// Owns one file descriptor and closes it once.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// The listening socket of one member; its address() is what the group publishes (the `address`
// of its member key). It outlives rings: a new quorum builds a new ring on the same listener.
class ReplicaListener {
 public:
  // Binds `host` (a numeric IPv4 address or a name) on `port` (0: a free one).
  static StatusOr<std::unique_ptr<ReplicaListener>> open(const std::string& host = "127.0.0.1",
                                                         int port = 0);
  const std::string& address() const { return address_; }  // "host:port"
  int fd() const { return fd_.get(); }

 private:
  ReplicaListener(Fd fd, std::string address) : fd_(std::move(fd)), address_(std::move(address)) {}
  Fd fd_;
  std::string address_;
};

// Splits "host:port" (port in 1..65535).
Status splitAddress(const std::string& address, std::string* host, int* port);

// The local IPv4 address of the route to `url`'s host ("http://host:port" or "host:port"): the
// address a replica listener publishes when none is configured.
StatusOr<std::string> localAddressToward(const std::string& url);

// A nonblocking TCP connection to `address` with TCP_NODELAY; a refused connection (the peer's
// listener not open yet) is retried until `deadline`.
StatusOr<Fd> connectTo(const std::string& address, ReplicaClock::time_point deadline,
                       bool retry_refused = true);

// Accepts one connection from `listener` before `deadline` (DeadlineExceeded-like
// FailedPrecondition "timed out" otherwise); the socket is nonblocking with TCP_NODELAY.
StatusOr<Fd> acceptBefore(int listener, ReplicaClock::time_point deadline);

// Writes or reads exactly n bytes before `deadline`. Errors name `who` and say EOF, the errno
// or the time waited.
Status writeAll(int fd, const void* p, size_t n, ReplicaClock::time_point deadline,
                const std::string& who);
Status readAll(int fd, void* p, size_t n, ReplicaClock::time_point deadline,
               const std::string& who);

// Milliseconds from now to `deadline`, at least 0.
int msUntil(ReplicaClock::time_point deadline);

}  // namespace hsdp::elastic
