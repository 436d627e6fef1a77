// hsdp-plan's arithmetic: per-GPU memory and cross-node traffic of a sharding configuration,
// predicted without running anything (no MPI, no allocation). The engine's MemoryReport
// (sharded_model.h) measures the same categories; docs/plan.md compares the two.
//
// ---- Inputs -------------------------------------------------------------------------------
//   units n_u        parameter count of each unit (layer): the unit the engine flattens, shards
//                    and gathers as one buffer. A total Ψ split into L equal units gives the
//                    first (Ψ mod L) units floor(Ψ/L)+1 parameters and the rest floor(Ψ/L).
//   N nodes, G GPUs (ranks) per node, world W = N·G
//   I = intra_shard (divides G), J = inter_shard (divides N)
//   S = I·J          shard group: a unit is sharded over I ranks on each of J nodes
//   R = W/S          replicas of every shard (the data-parallel copies)
//   M = N/J          nodes one replica group spans (the ranks holding the same shard k)
//   mode             none | zero1 | zero2 | zero3;  hpz (zero3 only)
//   dtype            bf16: "standard mixed precision": bf16 parameters and gradients for compute
//                    and communication (e = 2 bytes), fp32 master weights + two fp32 Adam
//                    moments in the optimizer shard (12 bytes per element).
//                    fp32: what the engine runs today: fp32 parameters and gradients (e = 4),
//                    two fp32 moments (8 bytes per element); the parameter shard is the master,
//                    there is no separate copy.
//   offload cpu      the optimizer state lives in pinned host memory instead of on the GPU.
//
// ---- Layout (mirrors flat_layout.h and the engine) -----------------------------------------
//   s_u = ceil(n_u / S)      a rank's shard of unit u (elements)
//   P_u = S·s_u              the unit's flat buffer padded to a multiple of S (P_u = n_u when S=1)
//   Σs = Σ_u s_u,  ΣP = Σ_u P_u,  Ψ = Σ_u n_u,  s_max = max s_u,  P_max = max P_u
// Mode none uses a shard group of one (the engine rejects none with S > 1, and so does the plan).
//
// ---- Per-GPU memory (bytes) ---------------------------------------------------------------
// The ZeRO paper's accounting for mixed-precision Adam is 2Ψ + 2Ψ + 12Ψ (params, grads,
// optimizer), each category divided by the ranks it is sharded over:
//                 params        grads         optimizer (o = 12 bf16, 8 fp32)
//   none          e·Ψ           e·Ψ           o·Ψ
//   zero1         e·ΣP          e·ΣP          o·Σs
//   zero2         e·ΣP          e·Σs          o·Σs
//   zero3         e·Σs          e·Σs          o·Σs
// Replicated categories in zero1/zero2 are the whole padded flat buffer (e·ΣP): the all-gather
// of updated parameter shards lands in it. With offload cpu the GPU's optimizer bytes are 0.
//   hpz_secondary = e·Σ_u P_u/I = e·J·Σs   (zero3 + hpz: after a unit's forward its parameters
//                   stay sharded over the I ranks of the node, so the backward re-gather stays
//                   inside the node; held for every unit between its forward and backward)
//   model_state_total = params + grads + optimizer + hpz_secondary
//   gathered_peak  full (unsharded) unit buffers alive at once, from a pool of blocks of the
//                  largest padded unit, e·P_max each (0 when S = 1: the engine computes on the
//                  shard itself):
//                    zero3: 4 blocks (backward: current + prefetched unit's parameters, the
//                           gradient being written, the one still being reduce-scattered)
//                    zero2: 2 blocks (the gradient being written, the one being reduced)
//                    zero1, none: 0 (parameters and gradients are whole already)
//   comm_estimate  transport and schedule scratch. It depends on the transport, so it is an
//                  ESTIMATE: the MPI transport with the hierarchical schedule (HSDP_HIER=1,
//                  HSDP_PIPELINE_CHUNKS=1), two schedule objects (gathers and reductions), each
//                  reserving for the largest shard s_max:
//                    2·( J·s_max·e                        schedule staging
//                      + [I > 1]·2·J·s_max·e              intra-node ring scratch (2 chunks)
//                      + [J > 1]·2·s_max·e )              inter-node ring scratch (2 chunks)
//                  and 0 when S = 1; the MPI library's own temporaries are not counted.
//   total = model_state_total + gathered_peak + comm_estimate   (what MemoryReport::total()
//           counts; activations and the framework's own workspace are not included)
//
// ---- Host memory with offload cpu ----------------------------------------------------------
//   per rank: h = O·(4 master + 8 moments + 4 fp32 gradient copy + [bf16]·2 bf16 parameter
//   copy) where O = Σs (zero1/2/3) or Ψ (none) is the rank's optimizer-shard element count
//   (docs/offload.md: master, exp_avg, exp_avg_sq, the gradient shard's host copy, the bf16
//   copy for the next all-gather). per node: G·h, all pinned.
//
// ---- Cross-node bytes per step (one optimizer step, no gradient accumulation) --------------
// Totals over the whole job of bytes that leave one node for another, the least any schedule
// can move (hsdp-bench's xnode_min): an all-gather over ranks on J nodes moves (J−1)·buffer
// across nodes, a reduce-scatter the same, an all-reduce over M nodes 2·(M−1)·buffer.
// D = e·ΣP (a padded model in the communication dtype; e·Ψ in mode none).
//                 all-gather             reduce-scatter     all-reduce
//   none          0                      0                  2·(N−1)·D      (DDP over the world)
//   zero1, zero2  R·(J−1)·D              R·(J−1)·D          2·(M−1)·D
//                 (updated parameter shards after the step; gradients reduce-scattered over the
//                 shard group, then the shard all-reduced over its replica group)
//   zero3         2·R·(J−1)·D            R·(J−1)·D          2·(M−1)·D
//                 (forward and backward gathers; with hpz only the forward one crosses nodes:
//                 R·(J−1)·D)
// The replica all-reduce: S replica groups, each of R ranks on M nodes, each reducing a shard
// of D/S: S·2·(M−1)·D/S. Only the inter phase of the hierarchical collectives crosses nodes,
// which is why J (not I) drives the all-gather/reduce-scatter terms. per_node = total / N.
//
// Wires (PlanInput::param_wire, grad_wire, replica_wire; EngineConfig's inter_param_wire,
// inter_grad_wire, replica_wire): each term's e·s per shard becomes the shard's encoded size,
// encodedBytes(wire, s) (hsdp/quantize.h: 4 or 2 bytes per element, int8 1 + 4/B, int4
// 0.5 + 4/B with B = quant_block), summed per unit: all-gather 2·R·(J−1)·Σ S·enc(s_u) and so on
// (the replica all-reduce's pieces are taken at the shard's rate). Unset wires keep e.
// traffic_by_wire has the three terms with all of them on each wire in turn.
//
// ---- Bytes sent per level per step (one optimizer step, no gradient accumulation) ----------
// What the transports count (Comm::bytesSent, docs/collectives.md "Bytes sent") on each level's
// communicators, summed over every rank: the engine's StepAccounting bytes_intra/inter/replica
// and the examples' "bytes:" line must equal these to the byte (fp32; tests/plan/level_bytes.sh).
// A gather pass over the hierarchical schedule sends, per unit, (J−1)·s_u elements per rank on
// the inter level and then (I−1)·J·s_u on the intra level (each rank passes on the J shards the
// inter phase brought); a reduce-scatter the mirror. Summed over the W = R·I·J ranks:
//   inter  (g_inter + 1)·R·(J−1)·D           intra  (g_intra + 1)·R·J·(I−1)·D
// with g the gather passes per step: zero3 2 (forward, backward; with hpz the backward one is
// intra only: g_inter = 1), zero1/zero2 1 (the updated parameters after the step), and the
// one reduce-scatter. In zero3 a gather pass counts each unit once per use (unit_uses: D_g =
// e·Σ k_u·P_u in place of D for the gathers), but with hpz the inter level once per unit (the
// later uses gather from the node's secondary partition). The replica all-reduce of each shard (s_u
// elements over R ranks, counted as the ring: 2·(R−1)·s_u per group) over the S groups: replica
// 2·(R−1)·D; mode none over the world: 2·(W−1)·D. Here D = e·ΣP on every level: the encoded wires
// are not modelled per level, and the engine's replica all-reduce is fp32 whatever the policy (so
// with bf16 the engine's replica bytes are twice this).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hsdp/config.h"
#include "hsdp/dtype.h"
#include "hsdp/parse.h"
#include "hsdp/quantize.h"
#include "hsdp/status.h"

namespace hsdp {

// The planner speaks the engine's ShardMode and DType (hsdp/config.h, hsdp/dtype.h). Its dtype
// is the precision policy: bf16 (bf16 compute and communication, fp32 master and moments) or
// fp32 (what train_mlp runs).
StatusOr<DType> parsePlanDType(std::string_view name);  // bf16, fp32
const char* planDTypeName(DType t);                     // "bf16" | "fp32"

struct PlanInput {
  std::vector<uint64_t> units;  // parameter count per unit (each > 0)
  // Times each unit is used in one forward pass (empty: once each). zero3 gathers a unit for
  // each use, in forward and again in backward: a tied embedding used as the input embedding
  // and as the LM head (train_gpt's wte) is used twice. Other modes gather once per step.
  std::vector<uint32_t> unit_uses;
  int nodes = 1;
  int gpus_per_node = 1;
  int intra_shard = 1;
  int inter_shard = 1;
  ShardMode mode = ShardMode::kZero3;
  bool hpz = false;
  DType param_dtype = DType::kBFloat16;
  bool offload_cpu = false;
  // The wires across nodes; unset: the policy's element type (param_dtype's e bytes). A
  // quantized (int8/int4) parameter or gradient wire across nodes needs the fp32 policy, and a
  // quantized parameter wire mode zero3, as in the engine.
  std::optional<Wire> param_wire, grad_wire, replica_wire;
  uint32_t quant_block = kDefaultQuantBlock;
};

// Per-rank bytes, the categories of MemoryReport.
struct PlanMemory {
  uint64_t params = 0;
  uint64_t grads = 0;
  uint64_t optimizer = 0;      // fp32 master (bf16 only) + two moments; 0 on the GPU with offload
  uint64_t hpz_secondary = 0;  // zero3 + hpz: the intra-node secondary parameter partition
  uint64_t gathered_peak = 0;  // pool of full-unit blocks (peak = capacity)
  uint64_t comm_estimate = 0;  // transport scratch: an estimate (MPI, hierarchical, 1 chunk)
  uint64_t modelStateTotal() const { return params + grads + optimizer + hpz_secondary; }
  uint64_t total() const { return modelStateTotal() + gathered_peak + comm_estimate; }
};

// Bytes crossing node boundaries in one step, summed over the whole job.
struct PlanTraffic {
  uint64_t all_gather = 0;
  uint64_t reduce_scatter = 0;
  uint64_t all_reduce = 0;
  uint64_t total() const { return all_gather + reduce_scatter + all_reduce; }
};

// Bytes sent on each level of the mesh in one step, summed over every rank (see the top).
struct PlanLevels {
  uint64_t intra = 0;
  uint64_t inter = 0;
  uint64_t replica = 0;
  uint64_t total() const { return intra + inter + replica; }
};

// The cross-node bytes of one step with every collective on `wire` (blocks of quant_block).
struct PlanWireTraffic {
  Wire wire;
  PlanTraffic traffic;
};

struct Plan {
  PlanInput input;
  int world = 0, shard_group = 0, replicas = 0, replica_nodes = 0;  // W, S, R, M
  int elem_bytes = 0;                 // e: bytes per parameter/gradient element (2 or 4)
  int optim_bytes_per_elem = 0;       // 12 (bf16) or 8 (fp32)
  uint64_t total_params = 0;          // Ψ
  uint64_t padded_params = 0;         // ΣP
  uint64_t shard_params = 0;          // Σs
  uint64_t largest_unit = 0;          // max n_u
  uint64_t largest_padded = 0;        // P_max
  uint64_t largest_shard = 0;         // s_max
  int gathered_blocks = 0;            // pool blocks of e·P_max
  PlanMemory gpu;                     // per GPU
  uint64_t host_pinned_per_rank = 0;  // offload cpu only
  uint64_t host_pinned_per_node = 0;  // G · per rank
  PlanTraffic cross_node;             // total over all nodes, per step, on the input's wires
  std::vector<PlanWireTraffic> traffic_by_wire;  // fp32, bf16, int8, int4
  PlanLevels per_level;                          // bytes sent per level, all ranks, per step
  uint64_t crossNodePerNode() const { return cross_node.total() / input.nodes; }
  // "I4xJ2 zero3+hpz"
  std::string label() const;
};

// Errors (InvalidArgument, naming the value): no units or a unit of 0 parameters, nodes/GPUs/
// factors < 1, a factor that does not divide G or N, mode none with S > 1, hpz outside zero3
// (zero1/zero2 keep whole parameters; none has no shards), hpz with intra_shard 1 (the
// secondary partition would be a whole copy) or inter_shard 1 (the shard group is already
// inside the node; hpz would change nothing), a bad quant_block, a quantized parameter wire
// across nodes outside zero3, a quantized parameter or gradient wire with the bf16 policy.
Status validatePlanInput(const PlanInput& in);
StatusOr<Plan> makePlan(const PlanInput& in);

// Ψ split into `units` near-equal units (see the top of this file). Errors: units < 1, Ψ < units.
StatusOr<std::vector<uint64_t>> splitUnits(uint64_t total, int64_t units);

// parseCount ("7.5e9") and parseByteSize ("80GiB"): hsdp/parse.h.
// One unit per line: "COUNT", "NAME COUNT" or "NAME COUNT USES" (USES: the times the unit is
// used in one forward, 1 to 9999, default 1; PlanInput::unit_uses); blank lines and text after
// '#' are ignored. Errors: "FILE:LINE: ..." naming the text. `uses`, when given, gets one entry
// per unit.
StatusOr<std::vector<uint64_t>> parseUnitsText(std::string_view text, std::string_view file,
                                               std::vector<uint32_t>* uses = nullptr);
// The file `path` (hsdp/files.h: a regular file, a FIFO or device refused unread) of at most
// kMaxUnitsFileBytes, parsed as above; errors name "--layers" and the path.
constexpr uint64_t kMaxUnitsFileBytes = uint64_t{64} << 20;
StatusOr<std::vector<uint64_t>> readUnitsFile(const std::string& path,
                                              std::vector<uint32_t>* uses = nullptr);

// Every valid configuration for the machine and model of `base`: each I | G, J | N and mode
// (none only with I = J = 1; zero3+hpz where I > 1 and J > 1), with base's dtype and offload.
std::vector<Plan> enumeratePlans(const PlanInput& base);
// Sorts by cross-node bytes per step, then per-GPU total, then mode, I, J (all ascending).
void rankPlans(std::vector<Plan>* plans);

// hsdp-plan --json: the plan as one JSON object (the categories above by their JSON names, the
// wires, the cross-node bytes on each wire); with budget > 0 also "mem_budget" and "fits".
std::string planJson(const Plan& plan, uint64_t budget = 0);
// hsdp-plan --auto --json: {"mem_budget", "considered": ranked.size(), "fits": [the plans of
// `ranked` (rankPlans' order) whose per-GPU total is within budget, as planJson]}.
std::string planAutoJson(const std::vector<Plan>& ranked, uint64_t budget);

// An SVG chart: one row per plan, per-GPU memory (stacked by category) on the left and
// cross-node bytes per step (stacked by collective) on the right; `budget` > 0 draws the budget
// line and greys plans over it. Well-formed standalone XML.
std::string planChartSvg(const std::vector<Plan>& plans, uint64_t budget, std::string_view title);

// hsdp::files::writeFileAtomically (hsdp/files.h), kept under this name: a temporary file in the
// same directory, fsynced and renamed over `path` (never a symbolic link, device, FIFO, socket or
// directory); on any error the temporary is removed and `path` is untouched.
[[nodiscard]] Status writeFileAtomically(const std::string& path, std::string_view content);

// "1.23 GiB", "456.0 MiB", "12.0 KiB", "17 B".
std::string formatBytes(uint64_t bytes);

}  // namespace hsdp
