#include "hsdp/env.h"

#include <cstdlib>
#include <cstring>

#include "hsdp/parse.h"

namespace hsdp::env {

const std::vector<Param>& registry() {
  static const std::vector<Param> params = {
      {"HSDP_DEBUG", "enum", "WARN", "Log level: NONE, WARN, INFO or TRACE (to stderr)."},
      {"HSDP_DEBUG_SUBSYS", "string", "ALL",
       "Comma-separated log subsystems: INIT, MESH, COLL, SHARD, OPTIM, OFFLOAD, TOPO, ALL; a "
       "leading ^ excludes the listed ones."},
      {"HSDP_RANKS_PER_NODE", "int", "",
       "Virtual nodes for one-machine runs: group consecutive world ranks into nodes of this "
       "many ranks instead of grouping by shared-memory host. Must divide the world size.",
       1, 1 << 20},
      {"HSDP_HIER", "bool", "1",
       "Run the engine's all-gather and reduce-scatter as hierarchical schedules (inter then "
       "intra, intra then inter). 0 uses one flat collective over the shard group."},
      {"HSDP_PIPELINE_CHUNKS", "int", "auto",
       "Chunks per hierarchical all-gather/reduce-scatter: chunk c's intra-node phase overlaps "
       "chunk c+1's inter-node phase. Need not divide the size. Unset: up to 32, fewer for "
       "small units (HSDP_PIPELINE_MIN_CHUNK_BYTES); set: exactly this many.",
       1, 4096},
      {"HSDP_PIPELINE_MIN_CHUNK_BYTES", "int", "1048576",
       "Smallest chunk (bytes of the gathered unit) when HSDP_PIPELINE_CHUNKS is unset: a unit "
       "under 2 MiB moves in one piece, a 64 MiB one in 32. Every chunk pays each level's "
       "latency once. 0: always HSDP_PIPELINE_CHUNKS.",
       0, int64_t{1} << 40},
      {"HSDP_INTER_DTYPE", "enum", "float",
       "Wire type of the inter-node phase of the engine's hierarchical collectives: float or "
       "bf16 (halves the bytes across nodes; the reduction across nodes rounds to bf16). The "
       "shorthand for both inter wires: the default of HSDP_INTER_PARAM_WIRE and "
       "HSDP_INTER_GRAD_WIRE when they are unset."},
      {"HSDP_INTER_PARAM_WIRE", "enum", "",
       "Inter-node wire of the engine's parameter all-gathers: fp32, bf16, int8 or int4 "
       "(block-quantized, one fp32 scale per HSDP_QUANT_BLOCK elements; the master shard is "
       "encoded once per step, every gather decodes the same codes). int8/int4 need zero3, "
       "hierarchical host collectives and fp32 parameters. Unset: HSDP_INTER_DTYPE's."},
      {"HSDP_INTER_GRAD_WIRE", "enum", "",
       "Inter-node wire of the engine's gradient reduce-scatters: fp32, bf16, int8 or int4 "
       "(int8/int4: an all-to-all of encoded pieces, each rank sums its block in fp32; error "
       "feedback per HSDP_GRAD_ERROR_FEEDBACK). Unset: HSDP_INTER_DTYPE's."},
      {"HSDP_REPLICA_WIRE", "enum", "fp32",
       "Wire of the all-reduce of gradient shards over the data-parallel replicas (mode none: "
       "the gradient over the world): fp32 (exact), bf16, int8 or int4 (all-to-all of encoded "
       "pieces summed in fp32, the sum encoded once and all-gathered). Host only."},
      {"HSDP_QUANT_BLOCK", "int", "2048",
       "Elements per fp32 scale of the int8/int4 wires: a multiple of 16 in [16, 1048576]. "
       "int8 moves 1 + 4/block bytes per element (0.2505x fp32 at 2048).",
       16, 1048576},
      {"HSDP_GRAD_ERROR_FEEDBACK", "bool", "1",
       "Error feedback for the encoded gradient wires (int8/int4 inter gradient wire, a bf16/"
       "int8/int4 replica wire): each rank adds what its last encoding dropped to what it sends "
       "next (a residual buffer per unit, allocated once)."},
      {"HSDP_MALLOC_TUNE", "bool", "1",
       "Keep freed heap memory mapped (glibc mallopt) so the MPI library's per-call temporary "
       "buffers reuse pre-faulted pages instead of faulting in fresh ones each call."},
      {"HSDP_MPI_TCP_LINKS", "int", "0",
       "If > 0, TCP connections Open MPI opens per peer pair (its btl_tcp_links), set before "
       "MPI_Init unless OMPI_MCA_btl_tcp_links is already set; 0 leaves Open MPI's default (1). "
       "One connection carrying both directions of a large exchange can stall under a "
       "rate-limited link (emulated 1gbit, 4 rank pairs exchanging 8 MiB each with "
       "MPI_Sendrecv: ~450 ms with 1, ~305 ms with 4, floor 280 ms). hsdp's own pipelined "
       "schedules measured the same with 1 or 4, and 8 once hung Open MPI 4.1, so it is opt-in.",
       0, 64},
      {"HSDP_MPI_TCP_EAGER", "int", "4194304",
       "Bytes up to which Open MPI's TCP transport sends a message eagerly (its "
       "btl_tcp_eager_limit, btl_tcp_rndv_eager_limit and btl_tcp_max_send_size), set before "
       "MPI_Init unless the user set any of them; 0 leaves Open MPI's defaults (64 KiB); at most "
       "1 GiB. Above "
       "the limit each message waits for a rendezvous round trip, and behind a loaded link that "
       "round trip queues behind data in both directions: emulated 2 nodes x 4 ranks at 1gbit, "
       "64 MiB hierarchical reduce-scatter in 32 chunks took 1.17x the link floor with 64 KiB "
       "and 1.05-1.07x with 4 MiB (docs/collectives.md).",
       0, int64_t{1} << 30},
      {"HSDP_MPI_RS_ALGO", "enum", "auto",
       "The MPI transport's float32 reduce-scatter (every hierarchical intra-node phase runs "
       "one): auto, ring, exchange or cma. ring: partial sums passed to the next rank, n-1 "
       "hops, the fewest bytes on each link (auto's choice when the ranks are on several hosts). "
       "exchange: every rank sends each peer its block and adds the n blocks it receives once. "
       "cma: on one host, every rank reads its block of each peer's input in place with "
       "process_vm_readv (Linux cross-memory attach, as Open MPI's shared-memory transport does) "
       "and adds it tile by tile in cache, half the exchange's memory traffic (auto's choice on "
       "one host where a probe read succeeds; else the exchange). bf16 takes the exchange (or "
       "cma) whatever this says. exchange and cma give the same bits."},
      {"HSDP_MPI_YIELD", "enum", "auto",
       "Whether Open MPI yields the core while it waits (its mpi_yield_when_idle, set before "
       "MPI_Init unless OMPI_MCA_mpi_yield_when_idle is set): auto yields when this host runs "
       "more ranks than it has cores (OMPI_COMM_WORLD_LOCAL_SIZE against the cores this process "
       "may use), or a boolean. Open MPI judges by its slots, not by cores: emulated nodes "
       "sharing one host's cores, each busy-polling rank kept its core for a whole scheduler tick "
       "while the rank a message waited for sat queued behind it (emulated 2 x 4 at 1gbit: 64 MiB "
       "reduce-scatter fp32 296 -> 283 ms, int8 104 -> 80-97 ms; a 64 KiB exchange 8 ms -> 1 ms)."},
      {"HSDP_PROGRESS_THREAD", "bool", "0",
       "Run a progress thread (MPI_THREAD_MULTIPLE): it advances in-flight collectives "
       "(rings, pipelined schedules, MPI requests) while the caller computes, so a prefetched "
       "gather moves during a layer's compute instead of only inside hsdp calls. For nodes with "
       "a spare core per rank; with 8 ranks on 2 cores (this project's VM) it cost 10-40% of "
       "the step time, so it is opt-in."},
      {"HSDP_PROGRESS_INTERVAL_US", "int", "100",
       "Progress thread: microseconds between its passes while collectives are in flight (it "
       "sleeps while none are).",
       1, 1000000},
      {"HSDP_TRANSPORT_INTRA", "enum", "mpi",
       "Transport of the intra-node level (intra-shard group): mpi, ucx (UCP over UCX's "
       "shared-memory transports; see docs/ucx.md), or nccl in CUDA builds (device buffers; "
       "docs/gpu.md)."},
      {"HSDP_TRANSPORT_INTER", "enum", "mpi",
       "Transport of the inter-node level (inter-shard and replica groups): mpi, ucx (UCP "
       "collectives over UCX's network transports; see docs/ucx.md), or nccl in CUDA builds."},
      {"HSDP_UCX_TLS", "string", "",
       "UCX transports of hsdp's own UCP context (the UCX_TLS syntax, e.g. tcp or ^cma); unset: "
       "UCX_TLS, else all. Open MPI's use of UCX keeps UCX_TLS."},
      {"HSDP_UCX_NET_DEVICES", "string", "",
       "Network devices of hsdp's UCP context (the UCX_NET_DEVICES syntax, e.g. eth0 or "
       "mlx5_0:1); unset: UCX_NET_DEVICES, else all."},
      {"HSDP_UCX_SMALL_BYTES", "int", "32768",
       "UCX transport: collectives of at most this many bytes (all-gather and reduce-scatter: "
       "the whole buffer) use recursive doubling or Bruck, larger ones the ring.",
       0, int64_t{1} << 30},
      {"HSDP_TOPO_FILE", "string", "",
       "Recorded hwloc v2 XML (lstopo --of xml) used instead of discovering this machine."},
      {"HSDP_TOPO_NVML_FILE", "string", "",
       "Recorded NVML snapshot (hsdp-topo --dump-nvml) for the NVLink graph and fabric clique."},
      {"HSDP_TOPO_NCCL_FILE", "string", "",
       "NCCL topology XML (written for NCCL_TOPO_DUMP_FILE), a second source of NVLink links."},
      {"HSDP_BIND", "enum", "auto",
       "Bind each rank to the NUMA node nearest its GPU (or NIC on CPU-only hosts): auto (numa "
       "when the host has several NUMA nodes and is not oversubscribed), none, numa, core."},
      {"HSDP_CPU_ADAM_ISA", "enum", "auto",
       "Kernel of the CPU (offload) Adam step: auto (best this CPU supports), avx512, avx2 or "
       "scalar. A path this CPU or build cannot run is an error, not a fallback."},
      {"HSDP_CPU_ADAM_THREADS", "int", "",
       "Threads of the CPU Adam step (the caller included) when the program does not set them; "
       "unset: the CPUs this process may run on.",
       1, 4096},
      {"HSDP_CUDA_DEVICE", "int", "",
       "CUDA device of this rank's NCCL communicators (CUDA builds); unset: the rank's index on "
       "its host modulo the visible devices.",
       0, 1023},
      {"HSDP_TIMEOUT_S", "number", "600",
       "Seconds a wait (a collective, or the engine's unshard / reduceGrad / step waits) may go "
       "without progress before the watchdog ends the job: every live rank prints one line "
       "naming the collective, its communicator and sequence number and the ranks that did not "
       "arrive (stopped, gone, unreachable), and the job exits with code 3. Every transport. A "
       "positive number (fractions allowed); also EngineConfig::timeout_s. docs/reliability.md."},
      {"HSDP_WATCHDOG", "bool", "1",
       "The watchdog: fingerprints of every collective in a node-local table, the out-of-band "
       "TCP channel and the timeout. 0 turns all of it off (for measuring its cost; then nothing "
       "bounds a wait)."},
      {"HSDP_CHECK_COLLECTIVES", "bool", "0",
       "Compare every collective's fingerprint (sequence number, operation, count, dtype, "
       "communicator, unit) across its members before it starts (one small all-gather each); a "
       "mismatch prints both ranks' collectives on every rank and ends the job with exit 3."},
      {"HSDP_CKPT_DIRECT_IO", "bool", "1",
       "Checkpoint data files written by save and read by load go around the page cache "
       "(O_DIRECT) where the filesystem supports it (elsewhere, e.g. tmpfs before Linux 6.6, "
       "buffered); 0: always through the page cache. Also EngineConfig::checkpoint_direct_io."},
      {"HSDP_NCCL_TIMEOUT_S", "int", "",
       "Deprecated: read as HSDP_TIMEOUT_S (with a warning) when that is unset; 0 meant no "
       "timeout.",
       0, 604800},
  };
  return params;
}

namespace {
const Param* find(const char* name) {
  for (const Param& p : registry())
    if (std::strcmp(p.name, name) == 0) return &p;
  return nullptr;
}
}  // namespace

std::string getString(const char* name) {
  if (find(name) == nullptr) return "";  // unregistered: behave as unset (tests catch this)
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

StatusOr<std::optional<int64_t>> getInt(const char* name) {
  const Param* p = find(name);
  if (p == nullptr) return notFound("environment parameter ", name, " is not registered");
  if (std::strcmp(p->type, "int") != 0 || p->min > p->max)
    return failedPrecondition("environment parameter ", name, " is not a ranged int");
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::optional<int64_t>();
  HSDP_ASSIGN_OR_RETURN(int64_t x, parseInt64(v, name, p->min, p->max));
  return std::optional<int64_t>(x);
}

StatusOr<bool> getBool(const char* name) {
  const Param* p = find(name);
  if (p == nullptr) return notFound("environment parameter ", name, " is not registered");
  const char* raw = std::getenv(name);
  return parseBool(raw && *raw ? raw : p->default_value, name);
}

}  // namespace hsdp::env
