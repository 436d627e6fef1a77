// The transport registry: every transport registers a factory under its name ("mpi", "ucx",
// "nccl"), and whoever needs a communicator of a transport asks here by name. The engine picks
// the transport of each mesh level this way (HSDP_TRANSPORT_INTRA / _INTER), so it never names a
// backend and a build without UCX or CUDA simply has fewer names.
//
// The transports built into libhsdp register themselves on first use of the registry (the list
// is generated at configure time: cmake/HsdpModules.cmake). An application may register a
// transport of its own before building its mesh:
//
//   hsdp::registerTransport("mine", [](std::unique_ptr<hsdp::Comm> bootstrap) {
//     return MyComm::create(std::move(bootstrap));   // collective over bootstrap's members
//   });
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hsdp/status.h"
#include "hsdp/transport.h"

namespace hsdp {

// Builds a communicator of the factory's transport over the members of `bootstrap`, in its rank
// order; collective over those members. Takes ownership of the bootstrap (a transport keeps it
// for split(), splitByHost() and abortJob()). Every member must fail alike when set-up fails
// on one of them, rather than leave the others waiting.
using TransportFactory =
    std::function<StatusOr<std::unique_ptr<Comm>>(std::unique_ptr<Comm> bootstrap)>;

// Registers (or replaces) `name`. Thread-safe.
void registerTransport(std::string name, TransportFactory factory);
// A transport this build knows of but cannot provide; `reason` says why and how to get it
// ("this hsdp was built without UCX ..."). createTransport() returns it as FailedPrecondition.
void registerUnavailableTransport(std::string name, std::string reason);

// The names createTransport() accepts, sorted ("mpi, nccl, ucx" in a full build).
std::vector<std::string> transportNames();
std::string transportNamesJoined();  // "mpi, ucx"
bool hasTransport(std::string_view name);

// Collective over `bootstrap`'s members. The bootstrap itself when it already runs `name`;
// NotFound naming the transport and the available ones for an unknown name; the unavailable
// transport's reason as FailedPrecondition.
StatusOr<std::unique_ptr<Comm>> createTransport(std::string_view name,
                                                std::unique_ptr<Comm> bootstrap);

// ---- peer transports: communicators built from published addresses, with no bootstrap --------
// The replica level between elastic groups: the groups share no job launcher, each member
// publishes its address (etcd), and every member builds the communicator from the same list.

// This process's address in a peer transport, valid while `hold` lives.
struct PeerAddress {
  std::vector<uint8_t> bytes;
  std::shared_ptr<void> hold;
};

struct PeerMembers {
  int self = 0;                                 // this process's index in `addresses`
  std::vector<std::vector<uint8_t>> addresses;  // every member's PeerAddress::bytes
  // Equal on every member, different from every earlier communicator's of the same processes
  // (e.g. derived from the quorum's step and attempt): stale messages never match a new one.
  uint64_t id = 0;
  std::vector<std::string> names;  // how errors name each member; empty: by index and address
  int64_t timeout_ms = 0;          // a wait without progress fails after this, naming the peer
};

struct PeerComm {
  std::unique_ptr<Comm> comm;
  // Thread-safe, immediate: the collective in flight and every later one fail as kAborted with
  // the reason. Valid while `comm` lives.
  std::function<void(const std::string& reason)> abort;
  // The members it found failed (dead, reset; not merely slow), sorted.
  std::function<std::vector<int>()> suspects;
  // Collective over its members, as Comm::split: the parts over this communicator's own
  // connections (no second set between the same two processes), with the ids after its own
  // (PeerMembers::id + 1 for the first split, + 2 for the second, ...: keep them free).
  // Valid while `comm` lives; a part may outlive it.
  std::function<StatusOr<PeerComm>(int color, int key)> split;
};

struct PeerTransport {
  std::function<StatusOr<PeerAddress>()> local_address;
  std::function<StatusOr<PeerComm>(const PeerMembers&)> create;  // collective over the members
};

void registerPeerTransport(std::string name, PeerTransport transport);
bool hasPeerTransport(std::string_view name);
// NotFound naming the available peer transports for an unknown name.
StatusOr<PeerAddress> peerTransportAddress(std::string_view name);
StatusOr<PeerComm> createPeerTransport(std::string_view name, const PeerMembers& members);

}  // namespace hsdp
