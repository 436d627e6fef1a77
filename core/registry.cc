#include <algorithm>
#include <map>
#include <mutex>

#include "core/modules.h"
#include "hsdp/transport_registry.h"
#include "hsdp/version.h"

namespace hsdp {

namespace modules {
// Generated (cmake/hsdp_modules.cc.in): registers every module built into this library.
void registerBuiltins();
}  // namespace modules

namespace {

struct Entry {
  TransportFactory factory;  // empty: known, unavailable
  std::string reason;
};

struct Registry {
  // Why a lock: an application may register its own transport from any thread, and the builtin
  // registration runs on first use, whichever thread that is.
  std::mutex mu;
  std::map<std::string, Entry, std::less<>> entries;
  std::map<std::string, PeerTransport, std::less<>> peers;
};

// True while this thread registers the builtin modules: they do not replace a transport the
// application registered under the same name before the registry's first use.
thread_local bool g_registering_builtins = false;

// The entries, without registering the builtins: their own registration calls come here.
Registry& rawRegistry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

const char* version() { return HSDP_VERSION_STRING; }

void registerTransport(std::string name, TransportFactory factory) {
  Registry& r = rawRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (g_registering_builtins && r.entries.count(name)) return;
  r.entries[std::move(name)] = Entry{std::move(factory), {}};
}

void registerUnavailableTransport(std::string name, std::string reason) {
  Registry& r = rawRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.entries.find(name);
  if (it != r.entries.end() && it->second.factory) return;  // a real one wins
  r.entries[std::move(name)] = Entry{{}, std::move(reason)};
}

void modules::ensureRegistered() {
  static std::once_flag builtins;
  std::call_once(builtins, [] {
    g_registering_builtins = true;
    registerBuiltins();
    g_registering_builtins = false;
  });
}

namespace {
Registry& loaded() {
  modules::ensureRegistered();
  return rawRegistry();
}
}  // namespace

std::vector<std::string> transportNames() {
  Registry& r = loaded();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, e] : r.entries)
    if (e.factory) names.push_back(name);
  return names;
}

std::string transportNamesJoined() {
  std::string s;
  for (const std::string& n : transportNames()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

bool hasTransport(std::string_view name) {
  Registry& r = loaded();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.entries.find(name);
  return it != r.entries.end() && it->second.factory;
}

StatusOr<std::unique_ptr<Comm>> createTransport(std::string_view name,
                                                std::unique_ptr<Comm> bootstrap) {
  if (bootstrap == nullptr) return invalidArgument("createTransport('", name, "'): no bootstrap");
  if (name == bootstrap->transportName()) return bootstrap;
  TransportFactory factory;
  {
    Registry& r = loaded();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.entries.find(name);
    if (it == r.entries.end())
      return notFound(
          "'", name, "' is not an available transport (available: ",
          [&] {
            std::string s;
            for (const auto& [n, e] : r.entries)
              if (e.factory) s += (s.empty() ? "" : ", ") + n;
            return s;
          }(),
          ")");
    if (!it->second.factory)
      return failedPrecondition("transport '", name, "': ", it->second.reason);
    factory = it->second.factory;  // called outside the lock: it is collective and may be slow
  }
  return factory(std::move(bootstrap));
}

void registerPeerTransport(std::string name, PeerTransport transport) {
  Registry& r = rawRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (g_registering_builtins && r.peers.count(name)) return;
  r.peers[std::move(name)] = std::move(transport);
}

namespace {
StatusOr<PeerTransport> peerTransport(std::string_view name) {
  Registry& r = loaded();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.peers.find(name);
  if (it != r.peers.end()) return it->second;
  std::string names;
  for (const auto& [n, t] : r.peers) names += (names.empty() ? "" : ", ") + n;
  return notFound("'", name, "' is not an available peer transport (available: ",
                  names.empty() ? "none; this hsdp was built without UCX" : names, ")");
}
}  // namespace

bool hasPeerTransport(std::string_view name) { return peerTransport(name).ok(); }

StatusOr<PeerAddress> peerTransportAddress(std::string_view name) {
  HSDP_ASSIGN_OR_RETURN(PeerTransport t, peerTransport(name));
  return t.local_address();
}

StatusOr<PeerComm> createPeerTransport(std::string_view name, const PeerMembers& members) {
  HSDP_ASSIGN_OR_RETURN(PeerTransport t, peerTransport(name));
  return t.create(members);
}

}  // namespace hsdp
