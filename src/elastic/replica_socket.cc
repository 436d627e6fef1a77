#include "elastic/replica_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace hsdp::elastic {
namespace {

Status setSocketOptions(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
    return internalError("fcntl(O_NONBLOCK): ", std::strerror(errno));
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    return internalError("setsockopt(TCP_NODELAY): ", std::strerror(errno));
  return okStatus();
}

StatusOr<sockaddr_in> resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    return invalidArgument("replica address host '", host, "': ", ::gai_strerror(rc));
  sockaddr_in sa{};
  std::memcpy(&sa, res->ai_addr, sizeof(sa));
  ::freeaddrinfo(res);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  return sa;
}

}  // namespace

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int msUntil(ReplicaClock::time_point deadline) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - ReplicaClock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

Status splitAddress(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    return invalidArgument("replica address '", address, "' is not host:port");
  const std::string p = address.substr(colon + 1);
  if (p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
    return invalidArgument("replica address '", address, "': port '", p, "'");
  *port = std::stoi(p);
  if (*port < 1 || *port > 65535)
    return invalidArgument("replica address '", address, "': port ", *port, " not in 1..65535");
  *host = address.substr(0, colon);
  return okStatus();
}

StatusOr<std::string> localAddressToward(const std::string& url) {
  std::string hostport = url;
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
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf));
  return std::string(buf);
}

StatusOr<std::unique_ptr<ReplicaListener>> ReplicaListener::open(const std::string& host,
                                                                 int port) {
  if (port < 0 || port > 65535) return invalidArgument("replica listener port ", port);
  HSDP_ASSIGN_OR_RETURN(sockaddr_in sa, resolve(host, port));
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return internalError("socket: ", std::strerror(errno));
  int one = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0)
    return internalError("replica listener: bind ", host, ":", port, ": ", std::strerror(errno));
  if (::listen(fd.get(), 128) != 0)
    return internalError("replica listener: listen: ", std::strerror(errno));
  socklen_t len = sizeof(sa);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    return internalError("replica listener: getsockname: ", std::strerror(errno));
  const std::string address = strCat(host, ":", ntohs(sa.sin_port));
  return std::unique_ptr<ReplicaListener>(new ReplicaListener(std::move(fd), address));
}

StatusOr<Fd> connectTo(const std::string& address, ReplicaClock::time_point deadline,
                       bool retry_refused) {
  std::string host;
  int port = 0;
  HSDP_RETURN_IF_ERROR(splitAddress(address, &host, &port));
  HSDP_ASSIGN_OR_RETURN(sockaddr_in sa, resolve(host, port));
  std::string last = "no attempt";
  while (true) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return internalError("socket: ", std::strerror(errno));
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      rc = ::poll(&p, 1, msUntil(deadline));
      if (rc == 0) return failedPrecondition("connect to ", address, " timed out");
      socklen_t len = sizeof(err);
      (void)::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) {
      HSDP_RETURN_IF_ERROR(setSocketOptions(fd.get()));
      return fd;
    }
    last = std::strerror(err);
    if (err == ECONNREFUSED && !retry_refused)
      return failedPrecondition("connect to ", address,
                                " refused: nothing listens there (the process is gone)");
    if (err != ECONNREFUSED && err != ECONNRESET && err != ETIMEDOUT && err != EHOSTUNREACH)
      return internalError("connect to ", address, ": ", last);
    if (ReplicaClock::now() >= deadline)
      return failedPrecondition("connect to ", address, " failed until the deadline: ", last);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

StatusOr<Fd> acceptBefore(int listener, ReplicaClock::time_point deadline) {
  while (true) {
    pollfd p{listener, POLLIN, 0};
    const int rc = ::poll(&p, 1, msUntil(deadline));
    if (rc < 0 && errno != EINTR) return internalError("poll: ", std::strerror(errno));
    if (rc == 0) return failedPrecondition("timed out");
    Fd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      return internalError("accept: ", std::strerror(errno));
    }
    HSDP_RETURN_IF_ERROR(setSocketOptions(fd.get()));
    return fd;
  }
}

Status writeAll(int fd, const void* p, size_t n, ReplicaClock::time_point deadline,
                const std::string& who) {
  const char* c = static_cast<const char*>(p);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::send(fd, c + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return failedPrecondition(who, ": ", std::strerror(errno));
    pollfd q{fd, POLLOUT, 0};
    if (::poll(&q, 1, msUntil(deadline)) == 0)
      return failedPrecondition(who, ": no progress until the deadline (", done, " of ", n,
                                " bytes written)");
  }
  return okStatus();
}

Status readAll(int fd, void* p, size_t n, ReplicaClock::time_point deadline,
               const std::string& who) {
  char* c = static_cast<char*>(p);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::recv(fd, c + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return failedPrecondition(who, ": closed the connection (EOF)");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return failedPrecondition(who, ": ", std::strerror(errno));
    pollfd q{fd, POLLIN, 0};
    if (::poll(&q, 1, msUntil(deadline)) == 0)
      return failedPrecondition(who, ": no progress until the deadline (", done, " of ", n,
                                " bytes read)");
  }
  return okStatus();
}

}  // namespace hsdp::elastic
