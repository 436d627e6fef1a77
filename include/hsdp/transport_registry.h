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

}  // namespace hsdp
