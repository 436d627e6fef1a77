#include "core/watchdog/watch_oob.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace hsdp::watchdog::oob {
namespace {

constexpr uint32_t kMaxBody = 64u << 20;
// A client that stalls costs the server at most this, reading its request and then writing the
// reply.
constexpr int kServeMs = 500;

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

std::unique_ptr<Server> Server::listen(std::string* error) {
  StatusOr<net::Listening> l = net::listenOn(net::ipv4(htonl(INADDR_ANY), 0), 64);
  if (!l.ok()) {
    *error = l.status().message();
    return nullptr;
  }
  std::unique_ptr<Server> s(new Server());
  s->listen_fd_ = std::move(l->fd);
  s->port_ = static_cast<uint16_t>(l->port);
  return s;
}

Server::~Server() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void Server::start(Handler handler) {
  handler_ = std::move(handler);
  thread_ = std::thread([this] { run(); });
}

void Server::run() {
  while (!stop_.load()) {
    StatusOr<net::Fd> fd = net::acceptBefore(listen_fd_.get(), net::after(200), "watchdog server");
    if (fd.ok()) serve(fd->get());
  }
}

// One request, answered at once.
void Server::serve(int fd) {
  const std::string who = "a watchdog peer";
  const net::Deadline deadline = net::after(kServeMs);
  char type = 0;
  uint32_t n = 0;
  if (!net::readAll(fd, &type, 1, deadline, who).ok() ||
      !net::readAll(fd, &n, sizeof n, deadline, who).ok() || n > kMaxBody)
    return;
  std::string body(n, '\0');
  if (n > 0 && !net::readAll(fd, body.data(), n, deadline, who).ok()) return;
  const std::string reply = frame(handler_(type, body));
  (void)net::writeAll(fd, reply.data(), reply.size(), net::after(kServeMs), who);
}

bool requestAny(const std::vector<Address>& targets, char type, const std::string& body,
                int timeout_ms, std::string* reply) {
  struct Conn {
    net::Fd fd;
    std::string out;  // what is left to send
    std::string in;   // what came back
    bool connected = false;
  };
  std::string request(1, type);
  request += frame(body);
  std::vector<Conn> conns;
  for (const Address& t : targets) {
    const sockaddr_in to = net::ipv4(t.ip, t.port);
    StatusOr<net::Fd> fd = net::connectStart(to, net::endpointText(to));
    if (fd.ok()) conns.push_back(Conn{std::move(*fd), request, "", false});
  }
  const net::Deadline deadline = net::after(timeout_ms);
  bool done = false;
  while (!done) {
    const int left = net::msUntil(deadline);
    if (left <= 0) break;
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < conns.size(); ++i) {
      if (!conns[i].fd.valid()) continue;
      fds.push_back(
          {conns[i].fd.get(), static_cast<short>(conns[i].out.empty() ? POLLIN : POLLOUT), 0});
      which.push_back(i);
    }
    if (fds.empty()) break;
    if (poll(fds.data(), fds.size(), left) <= 0) continue;
    for (size_t k = 0; k < fds.size() && !done; ++k) {
      Conn& c = conns[which[k]];
      if (fds[k].revents == 0) continue;
      if (!c.connected) {
        if (!net::connectResult(c.fd.get(), "a watchdog peer").ok()) {
          c.fd.reset();
          continue;
        }
        c.connected = true;
      }
      if (!c.out.empty()) {
        const ssize_t s = send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (s > 0)
          c.out.erase(0, static_cast<size_t>(s));
        else if (s < 0 && !net::wouldBlock(errno))
          c.fd.reset();
        continue;
      }
      char buf[16384];
      const ssize_t r = recv(c.fd.get(), buf, sizeof buf, 0);
      if (r <= 0) {
        if (r == 0 || !net::wouldBlock(errno)) c.fd.reset();
        continue;
      }
      c.in.append(buf, static_cast<size_t>(r));
      uint32_t n = 0;
      if (c.in.size() >= sizeof n) {
        std::memcpy(&n, c.in.data(), sizeof n);
        if (n > kMaxBody) {
          c.fd.reset();
        } else if (c.in.size() >= sizeof n + n) {
          *reply = c.in.substr(sizeof n, n);
          done = true;
        }
      }
    }
  }
  return done;
}

}  // namespace hsdp::watchdog::oob
