// The flags hsdp's programs share, declared once: each flag's name, type, range, accepted values,
// default and error message are here, and a program adds them by group (train_mlp, train_gpt,
// train_mlp_gpu) or one by one in its own words (hsdp-topo, hsdp-plan, hsdp-ckpt, gpt_bench):
//   mesh        --mode --intra-shard --inter-shard --hpz
//   precision   --param-dtype --reduce-dtype
//   offload     --offload
//   checkpoint  --save-dir --save-every --async-save --keep --resume --export --init-from
//               --optimizer-from
//   failure     --allow-nonfinite
//   replicas    --replica-policy --sync-every --outer-lr --outer-momentum --fragments
//               --sync-delay
// and engineConfig(): the parsed flags checked and mapped onto EngineConfig and MeshSpec, once.
// Errors read as everywhere else (hsdp/cli.h): "--intra-shard 0 must be positive",
// "--offload: gpu not in {none,cpu}", "--save-every, --async-save and --keep need --save-dir".
// Header-only on CLI11, installed with the package's CLI component:
//   find_package(hsdp 0.2 REQUIRED COMPONENTS CLI)
//   target_link_libraries(my_trainer PRIVATE hsdp::cli)   # hsdp::hsdp and CLI11::CLI11 with it
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "hsdp/cli.h"
#include "hsdp/config.h"
#include "hsdp/dtype.h"
#include "hsdp/mesh.h"
#include "hsdp/status.h"

namespace hsdp::cli {

// The largest shard factor a flag accepts (a documented maximum: no value sizes a loop unbounded).
constexpr int kMaxShardFactor = 1 << 20;

// --save-dir ... --optimizer-from: what a training program does with checkpoints (the examples'
// common/checkpointing.h carries them out on hsdp/checkpoint.h).
struct CheckpointFlags {
  std::string save_dir;
  int save_every = 0;  // 0: save after the last step only
  bool async_save = false;
  int keep = 0;        // keep_last; 0 keeps all
  std::string resume;  // a checkpoint directory, a root with `latest`, or "latest" (--save-dir)
  std::string export_path;
  std::string init_from;
  // --optimizer-from checkpoint|flags: whose optimizer settings a resumed run uses
  // (hsdp::LoadOptions::optimizer_from).
  std::string optimizer_from = "checkpoint";
};

// The values of the shared flags of a training program, at their defaults.
struct EngineFlags {
  // mesh
  std::string mode = "zero3";
  int intra_shard = 0;  // 0: the mode's default (every rank of a node; 1 in mode none)
  int inter_shard = 0;  // 0: 1
  bool hpz = false;
  // precision
  std::string param_dtype = "fp32";
  std::string reduce_dtype = "fp32";
  // offload
  std::string offload = "none";
  // failure
  bool allow_nonfinite = false;  // train on through a nan/inf loss or gradient norm
  // replicas (EngineConfig::replica_sync, docs/semi_sync.md)
  std::string replica_policy = "sync";
  int sync_every = 1;
  float outer_lr = 0.7f;
  float outer_momentum = 0.9f;
  int fragments = 1;
  int sync_delay = 0;
  CheckpointFlags ckpt;
};

// ---- each flag, declared once ----------------------------------------------------------------
// `help` is what --help says: the training programs' words (kHelp*) by default; a program whose
// flag is narrower (hsdp-plan's input, hsdp-ckpt's reshard target, gpt_bench's overlap part)
// gives its own. `checked` (a name flag): false leaves the name to the program to check with its
// own message (hsdp-plan names the planner's error).

inline constexpr const char* kHelpMode = "Sharding mode: none | zero1 | zero2 | zero3";
inline constexpr const char* kHelpIntraShard =
    "Ranks per node that shard each unit (divides ranks per node; default: all, or 1 in mode "
    "none)";
inline constexpr const char* kHelpInterShard =
    "Nodes that shard each unit (divides the node count; default 1)";
inline constexpr const char* kHelpHpz =
    "hpZ: keep each unit's intra-node partition after forward so backward re-gathers stay inside "
    "the node (zero3, intra_shard > 1, inter_shard > 1)";
inline constexpr const char* kHelpParamDtype =
    "fp32 | bf16: parameters all-gathered (and computed on) as bf16 roundings";
inline constexpr const char* kHelpOffload =
    "none | cpu: optimizer state in host memory, stepped by the CPU Adam while backward runs "
    "(zero1/zero2/zero3)";

namespace detail {
inline CLI::Option* addName(CLI::App& app, const std::string& flag, std::string& out,
                            const std::string& help, const std::vector<std::string>& names,
                            bool checked) {
  CLI::Option* o = app.add_option(flag, out, help);
  if (checked) o->check(CLI::IsMember(names));
  return o;
}
}  // namespace detail

inline CLI::Option* addModeFlag(CLI::App& app, std::string& mode,
                                const std::string& help = kHelpMode, bool checked = true) {
  return detail::addName(app, "--mode", mode, help, {"none", "zero1", "zero2", "zero3"}, checked);
}

struct ShardFactorHelp {
  std::string intra = kHelpIntraShard;
  std::string inter = kHelpInterShard;
};
struct ShardFactorOptions {
  CLI::Option* intra;
  CLI::Option* inter;
};
// --intra-shard and --inter-shard, each in [1, most].
inline ShardFactorOptions addShardFactorFlags(CLI::App& app, int& intra, int& inter,
                                              const ShardFactorHelp& help = {},
                                              int most = kMaxShardFactor) {
  return {addInt(app, "--intra-shard", intra, help.intra, 1, most),
          addInt(app, "--inter-shard", inter, help.inter, 1, most)};
}

inline CLI::Option* addHpzFlag(CLI::App& app, bool& hpz, const std::string& help = kHelpHpz) {
  return app.add_flag("--hpz", hpz, help);
}

inline CLI::Option* addParamDtypeFlag(CLI::App& app, std::string& dtype,
                                      const std::string& help = kHelpParamDtype,
                                      bool checked = true) {
  return detail::addName(app, "--param-dtype", dtype, help, {"fp32", "bf16"}, checked);
}

inline CLI::Option* addReduceDtypeFlag(CLI::App& app, std::string& dtype) {
  return detail::addName(app, "--reduce-dtype", dtype, "fp32 | bf16: gradient reduce-scatter dtype",
                         {"fp32", "bf16"}, true);
}

inline CLI::Option* addOffloadFlag(CLI::App& app, std::string& offload,
                                   const std::string& help = kHelpOffload, bool checked = true) {
  return detail::addName(app, "--offload", offload, help, {"none", "cpu"}, checked);
}

inline CLI::Option* addAllowNonfiniteFlag(CLI::App& app, bool& allow) {
  return app.add_flag("--allow-nonfinite", allow,
                      "Train on when the loss or the gradient norm is not finite (default: stop "
                      "with an error naming the step)");
}

// --replica-policy sync|local_sgd|diloco and its settings (EngineConfig::replica_sync).
inline void addReplicaFlags(CLI::App& app, EngineFlags& f) {
  detail::addName(
      app, "--replica-policy", f.replica_policy,
      "sync | local_sgd | diloco: how replica groups stay together (sync: gradients "
      "averaged every step; local_sgd: parameters averaged every --sync-every steps; "
      "diloco: outer Nesterov step on the averaged parameter change; docs/semi_sync.md)",
      {"sync", "local_sgd", "diloco"}, true);
  addInt(app, "--sync-every", f.sync_every,
         "H: inner steps between replica syncs (local_sgd, diloco)", 1, kMaxShardFactor);
  addReal(app, "--outer-lr", f.outer_lr, "diloco's outer learning rate", RealRange::above(0));
  addReal(app, "--outer-momentum", f.outer_momentum, "diloco's outer Nesterov momentum",
          RealRange::halfOpen(0, 1));
  addInt(app, "--fragments", f.fragments,
         "F: units split into F fragments synced at staggered steps (streaming; 1: all at once)", 1,
         kMaxShardFactor);
  addInt(app, "--sync-delay", f.sync_delay,
         "tau: inner steps a fragment's outer all-reduce overlaps before it is applied (streaming "
         "DiLoCo's delay; 0: at once; < --sync-every)",
         0, kMaxShardFactor);
}

inline void addCheckpointFlags(CLI::App& app, CheckpointFlags& flags) {
  app.add_option("--save-dir", flags.save_dir,
                 "Checkpoint root: <dir>/step-NNNNNNNN per save, <dir>/latest names the newest");
  addInt(app, "--save-every", flags.save_every,
         "Save every K steps (and after the last); 0: after the last step only", 0);
  app.add_flag("--async-save", flags.async_save,
               "Snapshot into host memory and write in the background while training goes on");
  addInt(app, "--keep", flags.keep, "Keep only the newest K checkpoints (0: all)", 0);
  app.add_option("--resume", flags.resume,
                 "Load a checkpoint (directory, root with `latest`, or 'latest' of --save-dir) "
                 "and train on to --steps; any mesh and mode");
  app.add_option("--export", flags.export_path,
                 "After training, write the full parameters as safetensors");
  app.add_option("--init-from", flags.init_from,
                 "Initialise the parameters from a safetensors file or index");
  detail::addName(app, "--optimizer-from", flags.optimizer_from,
                  "checkpoint | flags: with --resume, the optimizer settings (kind, lr, betas, "
                  "eps, weight decay) of the checkpoint or of the flags; a difference is printed",
                  {"checkpoint", "flags"}, true);
}

// ---- the groups of a training program ----------------------------------------------------------

inline void addMeshFlags(CLI::App& app, EngineFlags& f) {
  addModeFlag(app, f.mode);
  addShardFactorFlags(app, f.intra_shard, f.inter_shard);
  addHpzFlag(app, f.hpz);
}
inline void addPrecisionFlags(CLI::App& app, EngineFlags& f) {
  addParamDtypeFlag(app, f.param_dtype);
  addReduceDtypeFlag(app, f.reduce_dtype);
}
inline void addOffloadFlags(CLI::App& app, EngineFlags& f) { addOffloadFlag(app, f.offload); }
inline void addFailureFlags(CLI::App& app, EngineFlags& f) {
  addAllowNonfiniteFlag(app, f.allow_nonfinite);
}

// ---- the flags to the engine's configuration, once ---------------------------------------------

// How the checkpoint flags combine: InvalidArgument naming them.
[[nodiscard]] inline Status checkCheckpointFlags(const CheckpointFlags& c) {
  if (c.save_every < 0) return invalidArgument("--save-every ", c.save_every, " must be >= 0");
  if (c.keep < 0) return invalidArgument("--keep ", c.keep, " must be >= 0");
  if (c.save_dir.empty() && (c.save_every > 0 || c.async_save || c.keep > 0))
    return invalidArgument("--save-every, --async-save and --keep need --save-dir");
  if (c.resume == "latest" && c.save_dir.empty())
    return invalidArgument("--resume latest needs --save-dir (the root it names)");
  return okStatus();
}

// The flags checked and mapped: cfg->mode, hpz, precision, offload.cpu and replica_sync; the shard
// factors into *mesh (mode none: 1 and 1 where not given; otherwise 0, the mesh's default, stays);
// the checkpoint flags' combination. Every other field of cfg and *mesh is left as it is (the
// program's own flags: the optimizer, clipping, the rate limiter, the device). A non-OK Status
// is bad input that every rank sees alike.
[[nodiscard]] inline Status engineConfig(const EngineFlags& f, EngineConfig* cfg, MeshSpec* mesh) {
  HSDP_ASSIGN_OR_RETURN(cfg->mode, parseShardMode(f.mode));
  cfg->offload.cpu = f.offload == "cpu";
  cfg->hpz = f.hpz;
  HSDP_ASSIGN_OR_RETURN(cfg->precision.param_dtype, parseDType(f.param_dtype));
  HSDP_ASSIGN_OR_RETURN(cfg->precision.reduce_dtype, parseDType(f.reduce_dtype));
  if (f.intra_shard < 0)
    return invalidArgument("--intra-shard ", f.intra_shard, " must be positive");
  if (f.inter_shard < 0)
    return invalidArgument("--inter-shard ", f.inter_shard, " must be positive");
  HSDP_RETURN_IF_ERROR(checkCheckpointFlags(f.ckpt));
  HSDP_ASSIGN_OR_RETURN(cfg->replica_sync.policy, parseReplicaPolicy(f.replica_policy));
  cfg->replica_sync.sync_every = f.sync_every;
  cfg->replica_sync.outer_lr = f.outer_lr;
  cfg->replica_sync.outer_momentum = f.outer_momentum;
  cfg->replica_sync.fragments = f.fragments;
  cfg->replica_sync.sync_delay = f.sync_delay;
  mesh->intra_shard = f.intra_shard;
  mesh->inter_shard = f.inter_shard;
  if (cfg->mode == ShardMode::kNone) {  // plain data parallel: nothing is sharded
    if (mesh->intra_shard == 0) mesh->intra_shard = 1;
    if (mesh->inter_shard == 0) mesh->inter_shard = 1;
  }
  return okStatus();
}

}  // namespace hsdp::cli
