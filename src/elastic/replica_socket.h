// The listening socket under the replica ring (elastic/replica_ring.h): the one a member
// publishes ("host:port"). The sockets themselves (connect and accept with deadlines, reads and
// writes that poll until a deadline) are core's (core/socket.h).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "core/socket.h"
#include "hsdp/status.h"

namespace hsdp::elastic {

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
  ReplicaListener(net::Fd fd, std::string address)
      : fd_(std::move(fd)), address_(std::move(address)) {}
  net::Fd fd_;
  std::string address_;
};

// The local IPv4 address of the route to `url`'s host: the address a replica listener publishes
// when none is configured.
using net::localAddressToward;

}  // namespace hsdp::elastic
