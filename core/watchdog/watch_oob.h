// The watchdog's out-of-band channel (internal to watchdog/): a small TCP server on every rank,
// started at init, that answers a peer's questions without MPI, UCX or NCCL, so a report can be
// made when the data path is stuck. Ranks find each other through the addresses exchanged at
// init (watchdog.cc). One request per connection:
//   request  = type (1 byte) | body length (uint32) | body
//   reply    = body length (uint32) | body
// Everything is bounded by timeouts: an unreachable node (link cut) or a stopped rank (its
// kernel accepts the connection, nobody answers) costs the caller at most the deadline. The
// sockets are core's (core/socket.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/socket.h"

namespace hsdp::watchdog::oob {

struct Address {
  uint32_t ip = 0;    // IPv4, network byte order
  uint16_t port = 0;  // host byte order
};

// This host's IPv4 addresses other nodes can reach (interfaces up, not loopback), at most
// `max`; 127.0.0.1 when there is none.
std::vector<uint32_t> localAddresses(int max);

class Server {
 public:
  // (type, body) -> reply body.
  using Handler = std::function<std::string(char type, const std::string& body)>;
  // Listens on every interface, on a port the kernel picks; null (with *error) on failure.
  static std::unique_ptr<Server> listen(std::string* error);
  ~Server();  // stops the thread, closes the socket

  uint16_t port() const { return port_; }
  // Serves requests on a thread of its own until destruction.
  void start(Handler handler);

 private:
  Server() = default;
  void run();
  void serve(int fd);

  net::Fd listen_fd_;
  uint16_t port_ = 0;
  Handler handler_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Sends the request to every target at once and returns the first complete reply; false when
// none answered within `timeout_ms`.
bool requestAny(const std::vector<Address>& targets, char type, const std::string& body,
                int timeout_ms, std::string* reply);

}  // namespace hsdp::watchdog::oob
