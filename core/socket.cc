// The TCP socket layer (core/socket.h).
#include "core/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace hsdp::net {
namespace {

// Both options of a connected socket.
Status connectedOptions(int fd) {
  HSDP_RETURN_IF_ERROR(setNonblocking(fd));
  return setNoDelay(fd);
}

// Waits until `fd` is ready for `events` or `deadline` passes (false), retrying EINTR.
StatusOr<bool> waitFor(int fd, short events, Deadline deadline, const std::string& who) {
  while (true) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, msUntil(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return internalError(who, ": poll: ", std::strerror(errno));
  }
}

}  // namespace

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int msUntil(Deadline deadline) {
  // Rounded up: a wait never ends before its deadline, and "200 ms allowed" reads as set.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

Status splitAddress(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    return invalidArgument("address '", address, "' is not host:port");
  const std::string p = address.substr(colon + 1);
  if (p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
    return invalidArgument("address '", address, "': port '", p, "'");
  *port = std::stoi(p);
  if (*port < 1 || *port > 65535)
    return invalidArgument("address '", address, "': port ", *port, " not in 1..65535");
  *host = address.substr(0, colon);
  return okStatus();
}

StatusOr<sockaddr_in> resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    return invalidArgument("address host '", host, "': ", ::gai_strerror(rc));
  sockaddr_in sa{};
  std::memcpy(&sa, res->ai_addr, sizeof(sa));
  ::freeaddrinfo(res);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  return sa;
}

sockaddr_in ipv4(uint32_t ip, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = ip;
  sa.sin_port = htons(port);
  return sa;
}

std::string ipText(uint32_t ip) {
  char buf[INET_ADDRSTRLEN] = {};
  in_addr a{ip};
  ::inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

std::string endpointText(const sockaddr_in& sa) {
  return strCat(ipText(sa.sin_addr.s_addr), ":", ntohs(sa.sin_port));
}

StatusOr<std::string> localAddressToward(const std::string& url) {
  std::string hostport = url.substr(0, url.find(','));  // a list (etcd's members): the first
  if (size_t p = hostport.find("://"); p != std::string::npos) hostport = hostport.substr(p + 3);
  if (size_t p = hostport.find('/'); p != std::string::npos) hostport.resize(p);
  std::string host;
  int port = 0;
  HSDP_RETURN_IF_ERROR(splitAddress(hostport, &host, &port));
  HSDP_ASSIGN_OR_RETURN(sockaddr_in sa, resolve(host, port));
  // A UDP "connect" sends nothing: it only asks the kernel which local address routes there.
  Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return internalError("socket: ", std::strerror(errno));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0)
    return internalError("no route from this host to ", url, ": ", std::strerror(errno));
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0)
    return internalError("getsockname: ", std::strerror(errno));
  return ipText(local.sin_addr.s_addr);
}

Status setNonblocking(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
    return internalError("fcntl(O_NONBLOCK): ", std::strerror(errno));
  return okStatus();
}

Status setNoDelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    return internalError("setsockopt(TCP_NODELAY): ", std::strerror(errno));
  return okStatus();
}

bool wouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

StatusOr<Listening> listenOn(const sockaddr_in& at, int backlog, bool reuse_address) {
  const std::string where = endpointText(at);
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return internalError("socket: ", std::strerror(errno));
  int one = 1;
  if (reuse_address) (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa = at;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0)
    return internalError("bind ", where, ": ", std::strerror(errno));
  if (::listen(fd.get(), backlog) != 0)
    return internalError("listen on ", where, ": ", std::strerror(errno));
  socklen_t len = sizeof(sa);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    return internalError("getsockname of ", where, ": ", std::strerror(errno));
  return Listening{std::move(fd), ntohs(sa.sin_port)};
}

StatusOr<Fd> acceptBefore(int listener, Deadline deadline, const std::string& what) {
  const int allowed = msUntil(deadline);
  while (true) {
    HSDP_ASSIGN_OR_RETURN(bool ready, waitFor(listener, POLLIN, deadline, what));
    if (!ready)
      return failedPrecondition(what, ": timed out (no connection within ", allowed, " ms)");
    Fd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (wouldBlock(errno) || errno == ECONNABORTED) continue;
      return internalError(what, ": accept: ", std::strerror(errno));
    }
    HSDP_RETURN_IF_ERROR(connectedOptions(fd.get()));
    return fd;
  }
}

StatusOr<Fd> connectStart(const sockaddr_in& to, const std::string& who) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return internalError("connect to ", who, ": socket: ", std::strerror(errno));
  HSDP_RETURN_IF_ERROR(setNoDelay(fd.get()));
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), sizeof(to));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno != EINPROGRESS)
    return failedPrecondition("connect to ", who, ": ", std::strerror(errno));
  return fd;
}

Status connectResult(int fd, const std::string& who) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) return failedPrecondition("connect to ", who, ": ", std::strerror(err));
  return okStatus();
}

StatusOr<Fd> connectTo(const sockaddr_in& to, const std::string& who, Deadline deadline,
                       bool retry_refused) {
  const int allowed = msUntil(deadline);
  std::string last = "no attempt";
  while (true) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return internalError("connect to ", who, ": socket: ", std::strerror(errno));
    int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), sizeof(to));
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      HSDP_ASSIGN_OR_RETURN(bool ready, waitFor(fd.get(), POLLOUT, deadline, who));
      if (!ready)
        return failedPrecondition("connect to ", who, " timed out (", allowed, " ms allowed)");
      socklen_t len = sizeof(err);
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err == 0) {
      HSDP_RETURN_IF_ERROR(connectedOptions(fd.get()));
      return fd;
    }
    last = std::strerror(err);
    if (err == ECONNREFUSED && !retry_refused)
      return failedPrecondition("connect to ", who,
                                " refused: nothing listens there (the process is gone)");
    if (err != ECONNREFUSED && err != ECONNRESET && err != ETIMEDOUT && err != EHOSTUNREACH)
      return internalError("connect to ", who, ": ", last);
    if (Clock::now() >= deadline)
      return failedPrecondition("connect to ", who, " failed until the deadline (", allowed,
                                " ms allowed): ", last);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20, msUntil(deadline))));
  }
}

StatusOr<Fd> connectTo(const std::string& address, Deadline deadline, bool retry_refused) {
  std::string host;
  int port = 0;
  HSDP_RETURN_IF_ERROR(splitAddress(address, &host, &port));
  HSDP_ASSIGN_OR_RETURN(sockaddr_in sa, resolve(host, port));
  return connectTo(sa, address, deadline, retry_refused);
}

Status writeAll(int fd, const void* p, size_t n, Deadline deadline, const std::string& who) {
  const int allowed = msUntil(deadline);
  const char* c = static_cast<const char*>(p);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::send(fd, c + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && !wouldBlock(errno)) return failedPrecondition(who, ": ", std::strerror(errno));
    HSDP_ASSIGN_OR_RETURN(bool ready, waitFor(fd, POLLOUT, deadline, who));
    if (!ready)
      return failedPrecondition(who, ": no progress until the deadline (", allowed, " ms allowed; ",
                                done, " of ", n, " bytes written)");
  }
  return okStatus();
}

Status readAll(int fd, void* p, size_t n, Deadline deadline, const std::string& who) {
  const int allowed = msUntil(deadline);
  char* c = static_cast<char*>(p);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::recv(fd, c + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0)
      return failedPrecondition(who, ": closed the connection (EOF; ", done, " of ", n,
                                " bytes read)");
    if (!wouldBlock(errno)) return failedPrecondition(who, ": ", std::strerror(errno));
    HSDP_ASSIGN_OR_RETURN(bool ready, waitFor(fd, POLLIN, deadline, who));
    if (!ready)
      return failedPrecondition(who, ": no progress until the deadline (", allowed, " ms allowed; ",
                                done, " of ", n, " bytes read)");
  }
  return okStatus();
}

}  // namespace hsdp::net
