// Making NCCL communicators: creation over a bootstrap, and splits (ncclCommSplit beside the
// bootstrap's split). The collectives are in nccl_comm.cc.
#include <cstring>

#include "collectives/nccl/nccl_internal.h"

namespace hsdp::nccl {

// Creates the CUDA side of a communicator on `device`: role streams and the ordering event.
Status createCudaResources(NcclComm::State& s) {
  for (int r = 0; r < kNumRoles; ++r) {
    HSDP_ASSIGN_OR_RETURN(s.streams[r],
                          gpu::Stream::create(strCat("nccl-", s.name, "-",
                                                     streamRoleName(static_cast<StreamRole>(r)))));
  }
  HSDP_ASSIGN_OR_RETURN(s.caller_ready, gpu::Event::create());
  return okStatus();
}

// ---- creation ----------------------------------------------------------------------------------

NcclComm::NcclComm(std::shared_ptr<State> state) : s_(std::move(state)) {}
NcclComm::~NcclComm() = default;

StatusOr<std::unique_ptr<NcclComm>> NcclComm::create(std::unique_ptr<Comm> bootstrap,
                                                     const NcclOptions& options) {
  if (bootstrap == nullptr) return invalidArgument("createNcclComm: no bootstrap communicator");
  auto s = std::make_shared<State>();
  s->options = options;
  s->name = "world";
  s->rank = bootstrap->rank();
  s->size = bootstrap->size();
  Comm& boot = *bootstrap;
  s->bootstrap = std::move(bootstrap);

  // 1. The device and its streams. The host group is needed only for the default device choice,
  //    but splitByHost is collective, so every rank takes it.
  int local_rank = 0;
  {
    HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> host, boot.splitByHost());
    local_rank = host->rank();
  }
  Status local = [&]() -> Status {
    std::string why;
    const int count = gpu::deviceCount(&why);
    if (count == 0) return failedPrecondition("no CUDA device visible (", why, ")");
    if (options.device >= count)
      return invalidArgument("HSDP_CUDA_DEVICE=", options.device, " but only ", count,
                             " CUDA device(s) are visible");
    s->device = options.device >= 0 ? options.device : local_rank % count;
    HSDP_CUDA_CHECK(cudaSetDevice(s->device));
    return createCudaResources(*s);
  }();
  HSDP_RETURN_IF_ERROR(agreeOnSuccess(boot, local, strCat("nccl: CUDA set-up of rank ", s->rank)));

  // 2. The unique id, made by rank 0 and broadcast over the bootstrap.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  Status made = okStatus();
  if (s->rank == 0)
    made = [&]() -> Status {
      HSDP_NCCL_CHECK(ncclGetUniqueId(&id));
      return okStatus();
    }();
  HSDP_RETURN_IF_ERROR(agreeOnSuccess(boot, made, "nccl: ncclGetUniqueId on rank 0"));
  HSDP_RETURN_IF_ERROR(boot.broadcast(&id, sizeof(id), DType::kUInt8, 0));

  // 3. Every rank joins; nonblocking, so a missing peer ends in a timeout, not a hang.
  const auto start = Clock::now();
  ncclConfig_t config = nonblockingConfig(s->name);
  ncclResult_t rc = ncclCommInitRankConfig(&s->comm, s->size, id, s->rank, &config);
  Status joined = okStatus();
  if (rc != ncclSuccess && rc != ncclInProgress)
    joined = ncclFailure(rc, "ncclCommInitRankConfig", __FILE__, __LINE__, s->comm);
  else
    joined = s->waitReady(s->comm, "ncclCommInitRankConfig", 0, start);
  if (!joined.ok()) s->abortNow(joined);
  HSDP_RETURN_IF_ERROR(agreeOnSuccess(boot, joined, strCat("nccl: joining ", s->describe())));
  HSDP_INFO(kColl, s->describe(), " created (",
            std::chrono::duration<double>(Clock::now() - start).count(), " s); timeout ",
            options.timeout_s, " s");
  std::unique_ptr<NcclComm> comm(new NcclComm(std::move(s)));
  HSDP_RETURN_IF_ERROR(comm->traceOverBootstrap());
  return comm;
}

Status NcclComm::traceOverBootstrap() {
  HSDP_ASSIGN_OR_RETURN(trace_, traceOver(*s_->bootstrap));
  return okStatus();
}

StatusOr<std::unique_ptr<Comm>> createNcclComm(std::unique_ptr<Comm> bootstrap,
                                               const NcclOptions& options) {
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<NcclComm> c,
                        NcclComm::create(std::move(bootstrap), options));
  return std::unique_ptr<Comm>(std::move(c));
}

StatusOr<std::unique_ptr<Comm>> createNcclComm(std::unique_ptr<Comm> bootstrap) {
  HSDP_ASSIGN_OR_RETURN(NcclOptions options, NcclOptions::fromEnv());
  return createNcclComm(std::move(bootstrap), options);
}

StatusOr<std::unique_ptr<Comm>> createNcclComm(Comm& bootstrap) {
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> own, bootstrap.split(0, bootstrap.rank()));
  return createNcclComm(std::move(own));
}

// ---- splits ------------------------------------------------------------------------------------

namespace {

// ncclCommSplit of `parent` into the group `sub_boot` already formed on the bootstrap side. The
// NCCL key is the rank in `sub_boot`, so both sides order the members identically.
StatusOr<std::shared_ptr<NcclComm::State>> splitInto(NcclComm::State& parent,
                                                     std::unique_ptr<Comm> sub_boot, int color,
                                                     std::string name) {
  auto s = std::make_shared<NcclComm::State>();
  s->options = parent.options;
  s->name = std::move(name);
  s->rank = sub_boot->rank();
  s->size = sub_boot->size();
  s->device = parent.device;
  Comm& boot = *sub_boot;
  s->bootstrap = std::move(sub_boot);

  Status local = [&]() -> Status {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard guard, gpu::DeviceGuard::set(s->device));
    HSDP_RETURN_IF_ERROR(createCudaResources(*s));
    const auto start = Clock::now();
    const uint64_t seq_no = parent.seq++;
    ncclConfig_t config = nonblockingConfig(s->name);
    ncclResult_t rc = ncclCommSplit(parent.comm, color, s->rank, &s->comm, &config);
    if (rc != ncclSuccess && rc != ncclInProgress)
      return parent.fail("ncclCommSplit", seq_no, ncclMessage(rc, parent.comm));
    // The parent is busy until the split is done, and the child until it is initialised.
    HSDP_RETURN_IF_ERROR(parent.waitReady(parent.comm, "ncclCommSplit", seq_no, start));
    if (s->comm == nullptr)
      return internalError("ncclCommSplit on ", parent.describe(), " returned no communicator");
    HSDP_RETURN_IF_ERROR(s->waitReady(s->comm, "ncclCommSplit", seq_no, start));
    int nccl_rank = -1, nccl_size = -1;
    HSDP_NCCL_CHECK(ncclCommUserRank(s->comm, &nccl_rank));
    HSDP_NCCL_CHECK(ncclCommCount(s->comm, &nccl_size));
    if (nccl_rank != s->rank || nccl_size != s->size)
      return internalError("ncclCommSplit gave rank ", nccl_rank, " of ", nccl_size,
                           ", the bootstrap's split rank ", s->rank, " of ", s->size);
    return okStatus();
  }();
  if (!local.ok()) s->abortNow(local);
  HSDP_RETURN_IF_ERROR(agreeOnSuccess(
      boot, local, strCat("nccl: splitting ", parent.describe(), " into '", s->name, "'")));
  return s;
}

}  // namespace

StatusOr<std::unique_ptr<Comm>> NcclComm::split(int color, int key) {
  State& s = *s_;
  HSDP_RETURN_IF_ERROR(s.usable("split"));
  if (color < 0) return invalidArgument("split: color ", color, " must be >= 0");
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> sub, s.bootstrap->split(color, key));
  HSDP_ASSIGN_OR_RETURN(std::shared_ptr<State> child,
                        splitInto(s, std::move(sub), color, strCat(s.name, "/", color)));
  std::unique_ptr<NcclComm> comm(new NcclComm(std::move(child)));
  HSDP_RETURN_IF_ERROR(comm->traceOverBootstrap());
  return std::unique_ptr<Comm>(std::move(comm));
}

StatusOr<std::unique_ptr<Comm>> NcclComm::splitByHost() {
  State& s = *s_;
  HSDP_RETURN_IF_ERROR(s.usable("splitByHost"));
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> sub, s.bootstrap->splitByHost());
  // One color per host: the rank (in this communicator) of the host group's first member.
  int32_t color = s.rank;
  HSDP_RETURN_IF_ERROR(sub->broadcast(&color, 1, DType::kInt32, 0));
  HSDP_ASSIGN_OR_RETURN(std::shared_ptr<State> child,
                        splitInto(s, std::move(sub), color, strCat(s.name, "/host", color)));
  std::unique_ptr<NcclComm> comm(new NcclComm(std::move(child)));
  HSDP_RETURN_IF_ERROR(comm->traceOverBootstrap());
  return std::unique_ptr<Comm>(std::move(comm));
}

}  // namespace hsdp::nccl
