// Building UCX communicators over a bootstrap (worker addresses through its all-gather,
// endpoints to every peer, the first scratch slot, a first barrier); the collectives are in
// ucx_comm.cc, the shared state in ucx_internal.h.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/ucx/ucx_internal.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/env.h"

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

UcxComm::UcxComm(std::unique_ptr<State> state) : s_(std::move(state)) {}

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

}  // namespace hsdp::ucx
