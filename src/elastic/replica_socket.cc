#include "elastic/replica_socket.h"

namespace hsdp::elastic {

StatusOr<std::unique_ptr<ReplicaListener>> ReplicaListener::open(const std::string& host,
                                                                 int port) {
  if (port < 0 || port > 65535) return invalidArgument("replica listener port ", port);
  StatusOr<sockaddr_in> at = net::resolve(host, port);
  if (!at.ok()) return at.status().withContext("replica listener");
  StatusOr<net::Listening> l = net::listenOn(*at, 128, /*reuse_address=*/true);
  if (!l.ok()) return l.status().withContext(strCat("replica listener on ", host));
  const std::string address = strCat(host, ":", l->port);
  return std::unique_ptr<ReplicaListener>(new ReplicaListener(std::move(l->fd), address));
}

}  // namespace hsdp::elastic
