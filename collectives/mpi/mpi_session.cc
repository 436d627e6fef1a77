#include <malloc.h>
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "collectives/mpi/mpi_check.h"
#include "collectives/mpi/mpi_comm.h"
#include "core/idle_wait.h"
#include "core/launcher.h"
#include "core/progress.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/env.h"
#include "hsdp/log.h"
#include "hsdp/mpi.h"
#include "hsdp/parse.h"
#include "hsdp/transport_registry.h"

namespace hsdp::mpi {
namespace {

MPI_Op g_bf16_sum = MPI_OP_NULL;

void bf16Sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = toBf16(toFloat(a[i]) + toFloat(b[i]));
}

}  // namespace

Status mpiError(int rc, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return apiCallError("MPI", rc, text, call, file, line);
}

MPI_Datatype mpiType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kBFloat16:
      return MPI_UINT16_T;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kUInt8:
      return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op bf16SumOp() { return g_bf16_sum; }

namespace {

// The session's settings from the environment, read before MPI_Init (they choose MPI's thread
// level and Open MPI's parameters).
struct SessionEnv {
  bool tune_malloc = true;
  int64_t tcp_links = 0;
  int64_t tcp_eager = 0;
  bool yield_when_idle = false;  // HSDP_MPI_YIELD resolved (auto: more ranks than cores here)
  bool progress_thread = false;
  int64_t interval_us = 100;
  watchdog::Config wd;
};

using env::BoolParam;
using env::IntParam;

const BoolParam kMallocTune{
    "HSDP_MALLOC_TUNE", true,
    "Keep freed heap memory mapped (glibc mallopt) so the MPI library's per-call temporary "
    "buffers reuse pre-faulted pages instead of faulting in fresh ones each call."};
const IntParam kTcpLinks{
    "HSDP_MPI_TCP_LINKS", 0, 0, 64,
    "If > 0, TCP connections Open MPI opens per peer pair (its btl_tcp_links), set before "
    "MPI_Init unless OMPI_MCA_btl_tcp_links is already set; 0 leaves Open MPI's default (1). One "
    "connection carrying both directions of a large exchange can stall under a rate-limited link "
    "(emulated 1gbit, 4 rank pairs exchanging 8 MiB each with MPI_Sendrecv: ~450 ms with 1, ~305 "
    "ms with 4, floor 280 ms). hsdp's own pipelined schedules measured the same with 1 or 4, and "
    "8 once hung Open MPI 4.1, so it is opt-in."};
// Open MPI's TCP transport keeps fragments of this size on free lists: a typo in the unit (bytes,
// not KiB) must not become a multi-gigabyte allocation inside MPI_Init, hence the 1 GiB cap.
const IntParam kTcpEager{
    "HSDP_MPI_TCP_EAGER", int64_t{4} << 20, 0, int64_t{1} << 30,
    "Bytes up to which Open MPI's TCP transport sends a message eagerly (its "
    "btl_tcp_eager_limit, btl_tcp_rndv_eager_limit and btl_tcp_max_send_size), set before "
    "MPI_Init unless the user set any of them; 0 leaves Open MPI's defaults (64 KiB); at most 1 "
    "GiB. Above the limit each message waits for a rendezvous round trip, and behind a loaded "
    "link that round trip queues behind data in both directions: emulated 2 nodes x 4 ranks at "
    "1gbit, 64 MiB hierarchical reduce-scatter in 32 chunks took 1.17x the link floor with 64 "
    "KiB and 1.05-1.07x with 4 MiB (docs/collectives.md)."};
const env::StringParam kYield{
    "HSDP_MPI_YIELD", env::StringParam::Kind::kEnum, "auto",
    "Whether Open MPI yields the core while it waits (its mpi_yield_when_idle, set before "
    "MPI_Init unless OMPI_MCA_mpi_yield_when_idle is set): auto yields when this host runs more "
    "ranks than it has cores (the ranks on this host against the cores this process may use), "
    "or a boolean. The ranks on this host, before MPI_Init, come from the first of "
    "OMPI_COMM_WORLD_LOCAL_SIZE (mpirun), SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE "
    "(Slurm's '4(x2),3' lists, the entry SLURM_NODEID picks), SLURM_NTASKS_PER_NODE; none set "
    "(e.g. a PMIx launch without Slurm: PMIx has no such variable): no yield. A malformed one "
    "is an error naming it (set HSDP_MPI_YIELD=0 or 1 to skip the judgement). Open MPI judges by "
    "its slots, not by cores: emulated nodes sharing one host's "
    "cores, each busy-polling rank kept its core for a whole scheduler tick while the rank a "
    "message waited for sat queued behind it (emulated 2 x 4 at 1gbit: 64 MiB reduce-scatter "
    "fp32 296 -> 283 ms, int8 104 -> 80-97 ms; a 64 KiB exchange 8 ms -> 1 ms)."};
const BoolParam kProgressThread{
    "HSDP_PROGRESS_THREAD", false,
    "Run a progress thread (MPI_THREAD_MULTIPLE): it advances in-flight collectives (rings, "
    "pipelined schedules, MPI requests) while the caller computes, so a prefetched gather moves "
    "during a layer's compute instead of only inside hsdp calls. For nodes with a spare core per "
    "rank; with 8 ranks on 2 cores (this project's VM) it cost 10-40% of the step time, so it is "
    "opt-in."};
const IntParam kProgressIntervalUs{
    "HSDP_PROGRESS_INTERVAL_US", 100, 1, 1000000,
    "Progress thread: microseconds between its passes while collectives are in flight (it "
    "sleeps while none are)."};

// HSDP_MPI_YIELD: auto is whether the launcher started more ranks on this host than the cores
// this process may run on (core/launcher.h: mpirun's, then Slurm's variables).
StatusOr<bool> yieldWhenIdle() {
  const std::string v = kYield.get();
  if (!v.empty() && v != "auto") return parseBool(v, "HSDP_MPI_YIELD");
  StatusOr<std::optional<launcher::Count>> local = launcher::localSize();
  if (!local.ok())
    return local.status().withContext("HSDP_MPI_YIELD=auto judges by the ranks on this host");
  if (!local->has_value()) return false;  // no launcher says: Open MPI decides as usual
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof set, &set) == 0
                        ? CPU_COUNT(&set)
                        : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  return (*local)->value > cores;
}

const BoolParam kAllowWorldOfOne{
    "HSDP_ALLOW_WORLD_OF_ONE", false,
    "Allow MPI_COMM_WORLD of 1 rank when Slurm started more tasks for this step "
    "(SLURM_STEP_NUM_TASKS, else SLURM_NTASKS > 1). By default Session::init fails then: that is "
    "srun without --mpi=pmix, where every task comes up as its own world of one and would train "
    "alone. Set it for deliberate independent single-rank processes in a multi-task step."};

// Slurm started N > 1 tasks for this step but MPI sees a world of 1: the tasks are separate
// worlds (srun without a PMI plugin). mpirun inside an sbatch allocation gives a world > 1 and
// passes; `srun -n1` sets the step's count to 1 and passes.
Status checkWorldAgainstSlurm() {
  int size = 0;
  HSDP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (size != 1) return okStatus();
  HSDP_ASSIGN_OR_RETURN(std::optional<launcher::Count> tasks, launcher::slurmTasks());
  if (!tasks || tasks->value <= 1) return okStatus();
  HSDP_ASSIGN_OR_RETURN(bool allow, kAllowWorldOfOne.get());
  if (allow) {
    HSDP_WARN(kInit, tasks->source, "=", tasks->value,
              " but MPI_COMM_WORLD has 1 rank; running "
              "alone (HSDP_ALLOW_WORLD_OF_ONE=1)");
    return okStatus();
  }
  return invalidArgument(tasks->source, "=", tasks->value,
                         " but MPI_COMM_WORLD has 1 rank: the "
                         "tasks started as separate worlds of one; launch with srun --mpi=pmix "
                         "(or mpirun inside the allocation), or set HSDP_ALLOW_WORLD_OF_ONE=1 if "
                         "each task is meant to run alone");
}

// Before MPI_Init: srun started N > 1 tasks without a PMI (srun --mpi=none, or no MpiDefault).
// Open MPI would abort inside MPI_Init (or each task come up alone); say why first.
Status checkSrunBeforeInit() {
  HSDP_ASSIGN_OR_RETURN(std::optional<launcher::Count> tasks, launcher::srunStepWithoutPmi());
  if (!tasks) return okStatus();
  HSDP_ASSIGN_OR_RETURN(bool allow, kAllowWorldOfOne.get());
  if (allow) return okStatus();
  return invalidArgument(tasks->source, "=", tasks->value,
                         " but MPI_COMM_WORLD would have 1 rank: srun started the tasks without "
                         "a PMI (none of PMIX_RANK, PMI_RANK, PMI_FD is set), so each is a world "
                         "of one; launch with srun --mpi=pmix (or mpirun inside the allocation), "
                         "or set HSDP_ALLOW_WORLD_OF_ONE=1 if each task is meant to run alone");
}

StatusOr<SessionEnv> readSessionEnv() {
  SessionEnv e;
  HSDP_ASSIGN_OR_RETURN(e.tune_malloc, kMallocTune.get());
  HSDP_ASSIGN_OR_RETURN(e.tcp_links, kTcpLinks.value());
  HSDP_ASSIGN_OR_RETURN(e.tcp_eager, kTcpEager.value());
  HSDP_ASSIGN_OR_RETURN(e.yield_when_idle, yieldWhenIdle());
  HSDP_RETURN_IF_ERROR(checkReduceScatterAlgo());
  HSDP_RETURN_IF_ERROR(log::checkSettings());
  HSDP_ASSIGN_OR_RETURN(e.progress_thread, kProgressThread.get());
  HSDP_ASSIGN_OR_RETURN(e.interval_us, kProgressIntervalUs.value());
  HSDP_RETURN_IF_ERROR(idleWaitSettings().status());  // HSDP_WAIT_*: read by every wait
  HSDP_ASSIGN_OR_RETURN(e.wd, watchdog::resolveConfig({}));
  return e;
}

// The process-wide settings made before MPI_Init (malloc, Open MPI's environment).
void applyProcessTuning(const SessionEnv& e) {
  if (e.tune_malloc) {
    // Open MPI allocates temporaries per collective call (e.g. MPI_Reduce_scatter_block). With
    // glibc's defaults large ones are fresh mmaps, faulted in page by page every call (~2 s for
    // 64 MiB on 8 ranks here); kept on the heap they reuse already-touched pages (~65 ms).
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  // Open MPI reads OMPI_MCA_* from the environment in MPI_Init; a value the user set wins.
  if (e.yield_when_idle) setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  if (e.tcp_links > 0 && std::getenv("OMPI_MCA_btl_tcp_links") == nullptr)
    setenv("OMPI_MCA_btl_tcp_links", std::to_string(e.tcp_links).c_str(), /*overwrite=*/0);
  if (e.tcp_eager > 0 && std::getenv("OMPI_MCA_btl_tcp_eager_limit") == nullptr &&
      std::getenv("OMPI_MCA_btl_tcp_rndv_eager_limit") == nullptr &&
      std::getenv("OMPI_MCA_btl_tcp_max_send_size") == nullptr) {
    // Eager up to the schedules' chunk messages: a rendezvous (request, clear-to-send, data)
    // costs a round trip per message, and across a busy link that round trip waits behind the
    // queued data of both directions, leaving the link idle between chunks.
    const std::string v = std::to_string(e.tcp_eager);
    setenv("OMPI_MCA_btl_tcp_eager_limit", v.c_str(), 0);
    setenv("OMPI_MCA_btl_tcp_rndv_eager_limit", v.c_str(), 0);
    setenv("OMPI_MCA_btl_tcp_max_send_size", v.c_str(), 0);
  }
}

// What every session sets up once MPI runs, whoever initialised it: the rank in log lines, the
// bf16 sum, the progress thread when asked for and possible.
Status startHsdpInMpi(const SessionEnv& e, int provided) {
  int rank = 0;
  HSDP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  log::setRank(rank);
  if (g_bf16_sum == MPI_OP_NULL)
    HSDP_MPI_CHECK(MPI_Op_create(&bf16Sum, /*commute=*/1, &g_bf16_sum));
  if (e.progress_thread && provided < MPI_THREAD_MULTIPLE) {
    HSDP_WARN(kInit, "HSDP_PROGRESS_THREAD=1 but MPI provides thread level ", provided,
              " < MPI_THREAD_MULTIPLE: no progress thread");
  } else if (e.progress_thread) {
    progress_thread::start(static_cast<int>(e.interval_us));
  }
  // The watchdog, over a communicator of its own (exchanges addresses, maps the node's table).
  MPI_Comm dup;
  HSDP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> boot, MpiComm::adopt(dup, /*traced=*/false));
  return watchdog::start(*boot, e.wd).withContext("starting the watchdog");
}

}  // namespace

Status tuneProcessForHsdp() {
  int initialized = 0;
  HSDP_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized)
    return failedPrecondition(
        "tuneProcessForHsdp: MPI is already initialized; Open MPI reads "
        "its settings in MPI_Init, so call it before");
  HSDP_ASSIGN_OR_RETURN(SessionEnv e, readSessionEnv());
  applyProcessTuning(e);
  return okStatus();
}

StatusOr<std::unique_ptr<Session>> Session::init(int* argc, char*** argv) {
  int initialized = 0;
  HSDP_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized)
    return failedPrecondition(
        "MPI is already initialized; create one Session, or attach to the "
        "application's MPI with Session::attach()");
  // No MPI_Init here: without a PMI, Open MPI's MPI_Init aborts before hsdp could speak.
  HSDP_RETURN_IF_ERROR(checkSrunBeforeInit());
  StatusOr<SessionEnv> env_or = readSessionEnv();
  if (!env_or.ok()) {
    // Every rank has the same bad value and reports it. The first rank to exit non-zero makes
    // mpirun kill the others, perhaps before they have printed; so MPI starts anyway and the
    // ranks leave together, after a barrier at exit (by then each has printed the error).
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS)
      std::atexit([] {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
      });
    return env_or.status();
  }
  const SessionEnv& e = *env_or;
  applyProcessTuning(e);
  int provided = 0;
  // FUNNELED: only the thread that called init talks to MPI. With the progress thread, MULTIPLE:
  // hsdp serialises its own calls (progressLock()), but the user's MPI calls may overlap the
  // thread's.
  HSDP_MPI_CHECK(MPI_Init_thread(
      argc, argv, e.progress_thread ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided));
  HSDP_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  if (Status world = checkWorldAgainstSlurm(); !world.ok()) {
    std::atexit([] { MPI_Finalize(); });
    return world;
  }
  HSDP_RETURN_IF_ERROR(startHsdpInMpi(e, provided));
  const char* links_used = std::getenv("OMPI_MCA_btl_tcp_links");
  const char* eager_used = std::getenv("OMPI_MCA_btl_tcp_eager_limit");
  const char* yield_used = std::getenv("OMPI_MCA_mpi_yield_when_idle");
  HSDP_INFO(kInit, "MPI initialized, thread level ", provided, ", progress thread ",
            progress_thread::running() ? "on" : "off", ", malloc tuning ",
            e.tune_malloc ? "on" : "off", ", btl_tcp_links ", links_used ? links_used : "default",
            ", btl_tcp_eager_limit ", eager_used ? eager_used : "default", ", mpi_yield_when_idle ",
            yield_used ? yield_used : "default");
  return std::unique_ptr<Session>(new Session(/*owns_mpi=*/true));
}

StatusOr<std::unique_ptr<Session>> Session::attach() {
  int initialized = 0, finalized = 0;
  HSDP_MPI_CHECK(MPI_Initialized(&initialized));
  HSDP_MPI_CHECK(MPI_Finalized(&finalized));
  if (!initialized || finalized)
    return failedPrecondition("Session::attach: MPI is ",
                              finalized ? "already finalized"
                                        : "not "
                                          "initialized",
                              "; the application calls MPI_Init_thread first (or "
                              "use Session::init)");
  HSDP_ASSIGN_OR_RETURN(SessionEnv e, readSessionEnv());
  int provided = 0;
  HSDP_MPI_CHECK(MPI_Query_thread(&provided));
  HSDP_RETURN_IF_ERROR(startHsdpInMpi(e, provided));
  HSDP_INFO(kInit, "attached to the application's MPI, thread level ", provided,
            ", progress thread ", progress_thread::running() ? "on" : "off");
  return std::unique_ptr<Session>(new Session(/*owns_mpi=*/false));
}

int Session::worldRank() {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

Session::~Session() {
  progress_thread::stop();  // before MPI_Finalize: the thread may be inside MPI
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && g_bf16_sum != MPI_OP_NULL) MPI_Op_free(&g_bf16_sum);
  g_bf16_sum = MPI_OP_NULL;
  if (owns_mpi_ && !finalized) {
    // MPI_Finalize waits for the other ranks: a stopped one is named like in any other wait.
    watchdog::WaitScope wait("MPI_Finalize");
    MPI_Finalize();
  }
  watchdog::stop();
}

StatusOr<std::unique_ptr<Comm>> Session::world() { return adopt(MPI_COMM_WORLD); }

StatusOr<std::unique_ptr<Comm>> adopt(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return invalidArgument("mpi::adopt: MPI_COMM_NULL");
  MPI_Comm dup;
  HSDP_MPI_CHECK(MPI_Comm_dup(comm, &dup));
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> w, MpiComm::adopt(dup));
  if (comm == MPI_COMM_WORLD) w->setName("world");
  return w;
}

}  // namespace hsdp::mpi

namespace hsdp::modules {
// Called once by the generated module list (cmake/HsdpModules.cmake). MPI is every other
// transport's bootstrap, so "mpi" is what a mesh level runs when it names no other transport;
// a bootstrap of another transport cannot become MPI.
void registerMpiTransport() {
  registerTransport("mpi", [](std::unique_ptr<Comm> bootstrap) -> StatusOr<std::unique_ptr<Comm>> {
    if (std::string_view(bootstrap->transportName()) == "mpi") return bootstrap;
    return failedPrecondition("the mpi transport is built over an MPI bootstrap, not '",
                              bootstrap->transportName(), "'");
  });
}
}  // namespace hsdp::modules
