// Building UCX communicators over a bootstrap (worker addresses through its all-gather,
// endpoints to every peer, the first scratch slot, a first barrier); the collectives are in
// ucx_comm.cc, the shared state in ucx_internal.h.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/ucx/ucx_internal.h"
#include "core/progress.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/env.h"
#include "hsdp/parse.h"
#include "hsdp/transport_registry.h"

namespace hsdp::ucx {

// ---- creation ----------------------------------------------------------------------------------

namespace {
const env::IntParam kUcxSmallBytes{
    "HSDP_UCX_SMALL_BYTES", int64_t{32768}, 0, int64_t{1} << 30,
    "UCX transport: collectives of at most this many bytes (all-gather and reduce-scatter: the "
    "whole buffer) use recursive doubling or Bruck, larger ones the ring."};
}  // namespace

StatusOr<UcxOptions> UcxOptions::fromEnv() {
  UcxOptions o;
  HSDP_ASSIGN_OR_RETURN(int64_t small, kUcxSmallBytes.value());
  o.small_bytes = static_cast<size_t>(small);
  return o;
}

UcxComm::UcxComm(std::unique_ptr<State> state) : s_(std::move(state)) { s_->sent = &bytes_sent_; }

StatusOr<std::unique_ptr<UcxComm>> UcxComm::create(std::unique_ptr<Comm> bootstrap,
                                                   const UcxOptions& options) {
  if (bootstrap == nullptr) return invalidArgument("createUcxComm: no bootstrap communicator");
  Comm& boot = *bootstrap;
  const int n = boot.size(), r = boot.rank();
  if (n > kMaxRanks)
    return outOfRange("createUcxComm: ", n, " ranks exceed the UCX transport's limit of ",
                      kMaxRanks, " (16-bit rank and message fields of its tags)");

  // The process's context and worker (created by the first UCX communicator).
  StatusOr<std::shared_ptr<Engine>> engine = Engine::acquire();
  HSDP_RETURN_IF_ERROR(agreeOnSuccess(boot, engine.status(), "creating the UCX context"));
  auto state = std::make_unique<State>();
  state->engine = *engine;
  state->options = options;
  state->rank = r;
  state->size = n;

  // An id no member has used yet.
  int64_t mine = state->engine->nextCommId();
  std::vector<int64_t> ids(n);
  HSDP_RETURN_IF_ERROR(boot.allGather(&mine, ids.data(), 1, DType::kInt64));
  const int64_t id = *std::max_element(ids.begin(), ids.end());
  if (id >= kMaxCommIds)
    return Status(StatusCode::kResourceExhausted,
                  strCat("createUcxComm: communicator id ", id, " exceeds the ", kMaxCommIds,
                         " ids of the UCX transport's tags (too many UCX communicators created)"));
  state->engine->takeCommId(static_cast<uint32_t>(id));
  state->id = static_cast<uint32_t>(id);

  // Worker addresses differ in length (one per transport and device): all-gather the lengths,
  // then the addresses padded to the longest.
  const std::vector<uint8_t>& address = state->engine->address();
  int64_t len = static_cast<int64_t>(address.size());
  std::vector<int64_t> lens(n);
  HSDP_RETURN_IF_ERROR(boot.allGather(&len, lens.data(), 1, DType::kInt64));
  const size_t width = static_cast<size_t>(*std::max_element(lens.begin(), lens.end()));
  std::vector<uint8_t> all(n * width);
  std::memcpy(all.data() + r * width, address.data(), address.size());
  HSDP_RETURN_IF_ERROR(boot.allGather(all.data() + r * width, all.data(), width, DType::kUInt8));

  // Which peers share this rank's host (splitByHost: one host, or one container; on the
  // emulated cluster, one virtual node): a host is named by the first bootstrap rank on it.
  // Endpoints to other hosts handle peer failure (UcpEndpoint::connect).
  int32_t host = r;
  {
    HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> same_host, boot.splitByHost());
    HSDP_RETURN_IF_ERROR(same_host->broadcast(&host, 1, DType::kInt32, 0));
  }
  std::vector<int32_t> hosts(n);
  HSDP_RETURN_IF_ERROR(boot.allGather(&host, hosts.data(), 1, DType::kInt32));

  // Endpoints to every peer, and the first scratch slot (the small algorithms never allocate).
  Status local = [&]() -> Status {
    state->eps.assign(n, nullptr);
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      HSDP_ASSIGN_OR_RETURN(state->eps[p], state->engine->endpointTo(all.data() + p * width,
                                                                     static_cast<size_t>(lens[p]),
                                                                     /*remote=*/hosts[p] != host));
    }
    if (n > 1) {
      state->slot_bytes = initialSlotBytes(options);
      HSDP_ASSIGN_OR_RETURN(auto slot, state->newSlot(state->slot_bytes));
      state->scratch.push_back(std::move(slot));
    }
    return okStatus();
  }();
  HSDP_RETURN_IF_ERROR(agreeOnSuccess(boot, local, "connecting UCX endpoints"));

  state->bootstrap = std::move(bootstrap);
  std::unique_ptr<UcxComm> comm(new UcxComm(std::move(state)));
  // A first collective over the new endpoints: wires them up now, and a transport that cannot
  // carry messages fails here rather than in the first training step.
  HSDP_RETURN_IF_ERROR(comm->barrier().withContext("first barrier over the UCX endpoints"));
  // Traced from now on (its members are the bootstrap's); checked over the bootstrap's checker.
  HSDP_ASSIGN_OR_RETURN(comm->trace_, traceOver(*comm->s_->bootstrap));
  if (comm->trace_) comm->s_->world = comm->trace_->members();
  HSDP_INFO(kColl, "ucx communicator ", comm->s_->describe(), " ready; small-message limit ",
            options.small_bytes, " bytes");
  if (n > 1)
    HSDP_TRACE(kColl, "ucx ", comm->s_->describe(), " endpoint to rank ", (r + 1) % n, ":\n",
               comm->s_->eps[(r + 1) % n]->describe());
  return comm;
}

// ---- from addresses (no bootstrap) -------------------------------------------------------------

StatusOr<UcxWorkerAddress> UcxWorkerAddress::acquire() {
  UcxWorkerAddress a;
  HSDP_ASSIGN_OR_RETURN(a.engine_, Engine::acquire());
  return a;
}

const std::vector<uint8_t>& UcxWorkerAddress::bytes() const { return engine_->address(); }

namespace {
std::string defaultName(int p, const std::vector<uint8_t>& address) {
  // The address's first bytes (UCX puts the worker's unique id there) tell workers apart.
  const std::string hex = hexBytes(address.data(), std::min<size_t>(address.size(), 8));
  return strCat("member ", p, " (ucx worker ", hex, ", ", address.size(), "-byte address)");
}
}  // namespace

StatusOr<std::unique_ptr<UcxComm>> UcxComm::createFromAddresses(const UcxMembers& m,
                                                                const UcxOptions& options) {
  const int n = static_cast<int>(m.addresses.size());
  if (n < 1 || n > kMaxRanks)
    return outOfRange("createUcxCommFromAddresses: ", n, " members; 1 to ", kMaxRanks,
                      " are supported");
  if (m.self < 0 || m.self >= n)
    return invalidArgument("createUcxCommFromAddresses: self ", m.self, " is not one of the ", n,
                           " members");
  if (!m.names.empty() && static_cast<int>(m.names.size()) != n)
    return invalidArgument("createUcxCommFromAddresses: ", m.names.size(), " names for ", n,
                           " members");
  for (int p = 0; p < n; ++p)
    if (m.addresses[p].empty())
      return invalidArgument("createUcxCommFromAddresses: member ", p, " has an empty address");
  HSDP_ASSIGN_OR_RETURN(std::shared_ptr<Engine> engine, Engine::acquire());
  if (m.addresses[m.self] != engine->address())
    return invalidArgument("createUcxCommFromAddresses: the address of member ", m.self,
                           " (self) is not this process's UCX worker (", m.addresses[m.self].size(),
                           " bytes, the worker's ", engine->address().size(),
                           "): publish UcxWorkerAddress::bytes()");

  auto state = std::make_unique<State>();
  state->engine = std::move(engine);
  state->options = options;
  state->rank = m.self;
  state->size = n;
  state->id = kAddressedBit | static_cast<uint32_t>(m.id % kMaxCommIds);
  state->timeout_ms = m.timeout_ms;
  for (int p = 0; p < n; ++p)
    state->labels.push_back(m.names.empty() ? defaultName(p, m.addresses[p]) : m.names[p]);
  state->addressed = true;
  state->eps.assign(n, nullptr);
  for (int p = 0; p < n; ++p) {
    if (p == m.self) continue;
    // Peer-failure handling on every endpoint, same host or not: a member's death must become
    // a Status here, never abort this process (UcpEndpoint::connect; on one host this costs the
    // shared-memory transports, the members talk over tcp loopback). The engine's endpoint to
    // that worker, new only when there was none or it failed (ucx_internal.h says why).
    auto ep = state->engine->endpointTo(m.addresses[p].data(), m.addresses[p].size(),
                                        /*remote=*/true);
    if (!ep.ok()) return ep.status().withContext(strCat("endpoint to ", state->labels[p]));
    state->eps[p] = *ep;
  }
  if (n > 1) {
    state->slot_bytes = initialSlotBytes(options);
    HSDP_ASSIGN_OR_RETURN(auto slot, state->newSlot(state->slot_bytes));
    state->scratch.push_back(std::move(slot));
  }
  std::unique_ptr<UcxComm> comm(new UcxComm(std::move(state)));
  HSDP_RETURN_IF_ERROR(comm->barrier().withContext("first barrier over the members' addresses"));
  HSDP_INFO(kColl, "ucx communicator ", comm->s_->describe(), " ready from ", n,
            " addresses; deadline without progress ", m.timeout_ms, " ms");
  return comm;
}

// ---- communicators ----------------------------------------------------------------------------

StatusOr<std::unique_ptr<Comm>> UcxComm::split(int color, int key) {
  auto lock = progressLock();
  if (s_->bootstrap == nullptr) {
    HSDP_ASSIGN_OR_RETURN(std::unique_ptr<UcxComm> part, splitAddressed(color, key));
    return std::unique_ptr<Comm>(std::move(part));
  }
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> sub, s_->bootstrap->split(color, key));
  return createUcxComm(std::move(sub), s_->options);
}

StatusOr<std::unique_ptr<UcxComm>> UcxComm::splitAddressed(int color, int key) {
  auto lock = progressLock();
  if (s_->bootstrap != nullptr)
    return failedPrecondition("splitAddressed of ucx ", s_->describe(),
                              ": built over a bootstrap (use split)");
  const int n = s_->size;
  std::vector<int64_t> mine{color, key}, all(2 * static_cast<size_t>(n));
  HSDP_RETURN_IF_ERROR(allGather(mine.data(), all.data(), 2, DType::kInt64)
                           .withContext(strCat("split of ucx ", s_->describe())));
  // The part's members, ordered by key, then by rank in the parent.
  std::vector<int> members;
  for (int p = 0; p < n; ++p)
    if (all[2 * p] == color) members.push_back(p);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  const uint32_t low = s_->id & (kMaxCommIds - 1);
  auto state = std::make_unique<State>();
  state->engine = s_->engine;
  state->options = s_->options;
  state->size = static_cast<int>(members.size());
  state->id = kAddressedBit | ((low + 1 + s_->splits++) % kMaxCommIds);
  state->timeout_ms = s_->timeout_ms;
  state->addressed = true;
  for (int p : members) {
    if (p == s_->rank) state->rank = static_cast<int>(state->eps.size());
    state->labels.push_back(s_->peerName(p));
    state->eps.push_back(s_->eps[p]);
  }
  if (state->size > 1) {
    state->slot_bytes = initialSlotBytes(state->options);
    HSDP_ASSIGN_OR_RETURN(auto slot, state->newSlot(state->slot_bytes));
    state->scratch.push_back(std::move(slot));
  }
  std::unique_ptr<UcxComm> part(new UcxComm(std::move(state)));
  HSDP_INFO(kColl, "ucx communicator ", part->s_->describe(), " split from ", s_->describe(),
            " over its endpoints (color ", color, ")");
  return part;
}

StatusOr<std::unique_ptr<Comm>> UcxComm::splitByHost() {
  auto lock = progressLock();
  if (s_->bootstrap == nullptr)
    return unimplemented("splitByHost of ucx ", s_->describe(),
                         ": built from addresses, it has no bootstrap to split");
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> sub, s_->bootstrap->splitByHost());
  return createUcxComm(std::move(sub), s_->options);
}

void UcxComm::abortJob(int code) {
  if (s_->bootstrap == nullptr) {
    // Built from addresses: no job launcher behind it to end the others; this process ends and
    // its peers see it fail (their collectives name it, or reach their deadline).
    HSDP_WARN(kColl, "ucx ", s_->describe(), ": abortJob(", code, ")");
    std::abort();
  }
  s_->bootstrap->abortJob(code);
  std::abort();  // the bootstrap's abortJob does not return; keeps [[noreturn]] honest
}

void UcxComm::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> g(s_->abort_mu);
    if (s_->aborted.load(std::memory_order_relaxed)) return;  // the first reason stays
    s_->abort_reason = reason;
  }
  s_->aborted.store(true, std::memory_order_release);
}

bool UcxComm::aborted() const { return s_->aborted.load(std::memory_order_acquire); }

std::vector<int> UcxComm::suspects() const {
  std::vector<int> out = s_->suspects;
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

StatusOr<std::unique_ptr<Comm>> createUcxComm(std::unique_ptr<Comm> bootstrap,
                                              const UcxOptions& options) {
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<UcxComm> c, UcxComm::create(std::move(bootstrap), options));
  return std::unique_ptr<Comm>(std::move(c));
}

StatusOr<std::unique_ptr<Comm>> createUcxComm(std::unique_ptr<Comm> bootstrap) {
  // Read on every rank alike (same environment), so a bad value fails everywhere.
  HSDP_ASSIGN_OR_RETURN(UcxOptions options, UcxOptions::fromEnv());
  return createUcxComm(std::move(bootstrap), options);
}

StatusOr<std::unique_ptr<Comm>> createUcxComm(Comm& bootstrap) {
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> own, bootstrap.split(0, bootstrap.rank()));
  return createUcxComm(std::move(own));
}

namespace {
PeerComm peerComm(std::unique_ptr<UcxComm> c) {
  UcxComm* raw = c.get();
  PeerComm out{std::move(c), [raw](const std::string& reason) { raw->abort(reason); },
               [raw] { return raw->suspects(); }, nullptr};
  out.split = [raw](int color, int key) -> StatusOr<PeerComm> {
    HSDP_ASSIGN_OR_RETURN(std::unique_ptr<UcxComm> part, raw->splitAddressed(color, key));
    return peerComm(std::move(part));
  };
  return out;
}
}  // namespace

void registerPeerUcx() {
  PeerTransport t;
  t.local_address = []() -> StatusOr<PeerAddress> {
    HSDP_ASSIGN_OR_RETURN(UcxWorkerAddress a, UcxWorkerAddress::acquire());
    std::vector<uint8_t> bytes = a.bytes();
    return PeerAddress{std::move(bytes), std::make_shared<UcxWorkerAddress>(std::move(a))};
  };
  t.create = [](const PeerMembers& p) -> StatusOr<PeerComm> {
    HSDP_ASSIGN_OR_RETURN(UcxOptions options, UcxOptions::fromEnv());
    UcxMembers m{p.self, p.addresses, p.id, p.names, p.timeout_ms};
    HSDP_ASSIGN_OR_RETURN(std::unique_ptr<UcxComm> c, UcxComm::createFromAddresses(m, options));
    return peerComm(std::move(c));
  };
  registerPeerTransport("ucx", std::move(t));
}

}  // namespace hsdp::ucx
