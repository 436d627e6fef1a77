#include "core/watchdog/watch_oob.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace hsdp::watchdog::oob {
namespace {

constexpr uint32_t kMaxBody = 64u << 20;

int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool setNonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// Blocking I/O with a per-call timeout (SO_RCVTIMEO/SO_SNDTIMEO set on the socket).
bool sendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool recvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

std::string frame(const std::string& body) {
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::string out(reinterpret_cast<const char*>(&n), sizeof n);
  return out + body;
}

}  // namespace

std::vector<uint32_t> localAddresses(int max) {
  std::vector<uint32_t> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr && static_cast<int>(out.size()) < max; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
      if (!(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK)) continue;
      out.push_back(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
    }
    freeifaddrs(list);
  }
  if (out.empty()) out.push_back(htonl(INADDR_LOOPBACK));
  return out;
}

std::string addressText(uint32_t ip) {
  char buf[INET_ADDRSTRLEN] = {};
  in_addr a{ip};
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

std::unique_ptr<Server> Server::listen(std::string* error) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return nullptr;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    *error = std::string("bind/listen: ") + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  std::unique_ptr<Server> s(new Server());
  s->listen_fd_ = fd;
  s->port_ = ntohs(addr.sin_port);
  return s;
}

Server::~Server() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void Server::start(Handler handler) {
  handler_ = std::move(handler);
  thread_ = std::thread([this] { run(); });
}

void Server::run() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    serve(fd);
    close(fd);
  }
}

// One request, answered at once. A client that stalls costs at most the socket timeouts.
void Server::serve(int fd) {
  timeval tv{0, 500000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  char type = 0;
  uint32_t n = 0;
  if (!recvAll(fd, &type, 1) || !recvAll(fd, reinterpret_cast<char*>(&n), sizeof n) || n > kMaxBody)
    return;
  std::string body(n, '\0');
  if (n > 0 && !recvAll(fd, body.data(), n)) return;
  const std::string reply = frame(handler_(type, body));
  (void)sendAll(fd, reply.data(), reply.size());
}

bool requestAny(const std::vector<Address>& targets, char type, const std::string& body,
                int timeout_ms, std::string* reply) {
  struct Conn {
    int fd = -1;
    std::string out;  // what is left to send
    std::string in;   // what came back
    bool connected = false;
  };
  std::string request(1, type);
  request += frame(body);
  std::vector<Conn> conns;
  for (const Address& t : targets) {
    Conn c;
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c.fd < 0 || !setNonblocking(c.fd)) {
      if (c.fd >= 0) close(c.fd);
      continue;
    }
    const int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = t.ip;
    addr.sin_port = htons(t.port);
    const int rc = connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    if (rc != 0 && errno != EINPROGRESS) {
      close(c.fd);
      continue;
    }
    c.out = request;
    conns.push_back(std::move(c));
  }
  const int64_t deadline = nowMs() + timeout_ms;
  bool done = false;
  while (!done) {
    const int64_t left = deadline - nowMs();
    if (left <= 0) break;
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < conns.size(); ++i) {
      if (conns[i].fd < 0) continue;
      fds.push_back({conns[i].fd, static_cast<short>(conns[i].out.empty() ? POLLIN : POLLOUT), 0});
      which.push_back(i);
    }
    if (fds.empty()) break;
    if (poll(fds.data(), fds.size(), static_cast<int>(left)) <= 0) continue;
    for (size_t k = 0; k < fds.size() && !done; ++k) {
      Conn& c = conns[which[k]];
      if (fds[k].revents == 0) continue;
      if (!c.connected) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          close(c.fd);
          c.fd = -1;
          continue;
        }
        c.connected = true;
      }
      if (!c.out.empty()) {
        const ssize_t s = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (s > 0)
          c.out.erase(0, static_cast<size_t>(s));
        else if (s < 0 && errno != EAGAIN && errno != EINTR)
          close(c.fd), c.fd = -1;
        continue;
      }
      char buf[16384];
      const ssize_t r = recv(c.fd, buf, sizeof buf, 0);
      if (r <= 0) {
        if (r == 0 || (errno != EAGAIN && errno != EINTR)) close(c.fd), c.fd = -1;
        continue;
      }
      c.in.append(buf, static_cast<size_t>(r));
      uint32_t n = 0;
      if (c.in.size() >= sizeof n) {
        std::memcpy(&n, c.in.data(), sizeof n);
        if (n > kMaxBody) {
          close(c.fd);
          c.fd = -1;
        } else if (c.in.size() >= sizeof n + n) {
          *reply = c.in.substr(sizeof n, n);
          done = true;
        }
      }
    }
  }
  for (Conn& c : conns)
    if (c.fd >= 0) close(c.fd);
  return done;
}

}  // namespace hsdp::watchdog::oob
