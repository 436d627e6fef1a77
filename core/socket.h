// hsdp's one TCP socket layer (in the spirit of NCCL's single ncclSocket), private to the
// library: the watchdog's out-of-band channel (core/watchdog/watch_oob.h) and the elastic groups'
// alarm (src/engine/group_alarm.h) stand on it.
//
//   Fd: the owner of one descriptor, closed once.
//   listenOn / acceptBefore: a listening socket, one connection accepted before a deadline.
//   connectTo / connectStart + connectResult: a connect with a deadline (a refused connection
//     retried until it, or not), or one started for a caller that polls many at once.
//   readAll / writeAll: exactly n bytes before a deadline.
//
// Every wait ends by its deadline; every call retries EINTR. Sockets are CLOEXEC; connected ones
// are nonblocking with TCP_NODELAY; writes use MSG_NOSIGNAL (a peer that is gone is an EPIPE
// Status, never a SIGPIPE). Errors name the peer (`who`), what was done and the time allowed.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "hsdp/status.h"

namespace hsdp::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Milliseconds from now to `deadline`, rounded up, at least 0 (at most 2^30: a poll() timeout).
int msUntil(Deadline deadline);
// `ms` milliseconds from now.
inline Deadline after(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }

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

// Splits "host:port" (port in 1..65535).
Status splitAddress(const std::string& address, std::string* host, int* port);
// The IPv4 address of `host` (numeric or a name) with `port`.
StatusOr<sockaddr_in> resolve(const std::string& host, int port);
// An IPv4 address (network byte order) and a port (host byte order).
sockaddr_in ipv4(uint32_t ip, uint16_t port);
// "a.b.c.d" of an address in network byte order; "a.b.c.d:port" of a socket address.
std::string ipText(uint32_t ip);
std::string endpointText(const sockaddr_in& sa);
// The local IPv4 address of the route to `url`'s host ("http://host:port" or "host:port"; of a
// comma list, the first).
StatusOr<std::string> localAddressToward(const std::string& url);

// The nonblocking mode and TCP_NODELAY of a connected socket.
Status setNonblocking(int fd);
Status setNoDelay(int fd);
// EAGAIN, EWOULDBLOCK or EINTR: try again.
bool wouldBlock(int err);

// A listening TCP socket bound to `at` (port 0: one the kernel picks), and the port it got.
struct Listening {
  Fd fd;
  int port = 0;
};
StatusOr<Listening> listenOn(const sockaddr_in& at, int backlog, bool reuse_address = false);

// Accepts one connection on `listener` before `deadline`: nonblocking with TCP_NODELAY. At the
// deadline a FailedPrecondition "<what>: timed out" with the time waited.
StatusOr<Fd> acceptBefore(int listener, Deadline deadline, const std::string& what);

// A connection to `to` (named `who` in errors) before `deadline`, nonblocking with TCP_NODELAY.
// A refused connection (a listener not open yet) is dialled again until the deadline when
// `retry_refused`; otherwise it fails at once ("nothing listens there").
StatusOr<Fd> connectTo(const sockaddr_in& to, const std::string& who, Deadline deadline,
                       bool retry_refused = true);
// The same to "host:port", which names the peer.
StatusOr<Fd> connectTo(const std::string& address, Deadline deadline, bool retry_refused = true);

// For callers that wait on many at once: a nonblocking connect to `to`, started (maybe done);
// poll() the socket for POLLOUT, then connectResult() says whether it connected.
StatusOr<Fd> connectStart(const sockaddr_in& to, const std::string& who);
Status connectResult(int fd, const std::string& who);

// Writes or reads exactly n bytes before `deadline`. Errors name `who` and say EOF, the errno,
// or the time allowed and the bytes moved by then.
Status writeAll(int fd, const void* p, size_t n, Deadline deadline, const std::string& who);
Status readAll(int fd, void* p, size_t n, Deadline deadline, const std::string& who);

}  // namespace hsdp::net
