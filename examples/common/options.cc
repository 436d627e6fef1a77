#include "common/options.h"

#include <limits>

#include "hsdp/parse.h"

namespace examples {

hsdp::Status checkModelFits(uint64_t largest_unit, uint64_t total_params, uint64_t activation_bytes,
                            bool check, const std::string& what) {
  // Saturating: a sum past 2^64 is as unallocatable as the largest count checkedAllocation names.
  auto mul = [](uint64_t a, uint64_t b) {
    return hsdp::checkedMul(a, b).value_or(std::numeric_limits<uint64_t>::max());
  };
  auto add = [](uint64_t a, uint64_t b) {
    return hsdp::checkedAdd(a, b).value_or(std::numeric_limits<uint64_t>::max());
  };
  uint64_t bytes = add(mul(largest_unit, 8), activation_bytes);
  if (check) bytes = add(bytes, mul(total_params, 16));
  return hsdp::checkedAllocation(bytes, 1, what).status();
}

hsdp::Status configure(const Options& opt, int world_size, hsdp::EngineConfig* cfg,
                       hsdp::MeshSpec* mesh_spec) {
  HSDP_ASSIGN_OR_RETURN(cfg->mode, hsdp::parseShardMode(opt.mode));
  HSDP_ASSIGN_OR_RETURN(cfg->adam.kind, hsdp::parseOptimizerKind(opt.optimizer));
  cfg->adam.lr = opt.lr;
  cfg->adam.weight_decay = opt.weight_decay;
  cfg->adam.eps = opt.eps;
  if (opt.steps < 0) return hsdp::invalidArgument("--steps ", opt.steps, " must be >= 0");
  if (opt.batch <= 0 || opt.batch % world_size != 0)
    return hsdp::invalidArgument("--batch ", opt.batch, " must be a positive multiple of the ",
                                 world_size, " ranks (each rank trains on an equal slice)");
  // In 64 bits: accum x ranks of two ints cannot overflow (in int, 2^30 x 4 wrapped to 0).
  const int64_t micro_ranks = int64_t{opt.accum} * world_size;
  if (opt.accum <= 0 || opt.batch % micro_ranks != 0)
    return hsdp::invalidArgument("--accum ", opt.accum, " must be positive and --batch ", opt.batch,
                                 " a multiple of accum x ranks = ", micro_ranks);
  if (!(opt.clip_norm >= 0))
    return hsdp::invalidArgument("--clip-norm ", opt.clip_norm, " must be >= 0");
  cfg->clip_norm = opt.clip_norm;
  cfg->offload.cpu = opt.offload == "cpu";
  cfg->hpz = opt.hpz;
  if (opt.max_gathered < 0)
    return hsdp::invalidArgument("--max-gathered ", opt.max_gathered, " must be >= 0");
  cfg->pipeline.max_gathered_units = opt.max_gathered;
  HSDP_ASSIGN_OR_RETURN(cfg->precision.param_dtype, hsdp::parseDType(opt.param_dtype));
  HSDP_ASSIGN_OR_RETURN(cfg->precision.reduce_dtype, hsdp::parseDType(opt.reduce_dtype));
  if (opt.intra_shard_given && opt.intra_shard <= 0)
    return hsdp::invalidArgument("--intra-shard ", opt.intra_shard, " must be positive");
  if (opt.inter_shard_given && opt.inter_shard <= 0)
    return hsdp::invalidArgument("--inter-shard ", opt.inter_shard, " must be positive");
  if (opt.ckpt.save_every < 0)
    return hsdp::invalidArgument("--save-every ", opt.ckpt.save_every, " must be >= 0");
  if (opt.ckpt.keep < 0) return hsdp::invalidArgument("--keep ", opt.ckpt.keep, " must be >= 0");
  if (opt.ckpt.save_dir.empty() &&
      (opt.ckpt.save_every > 0 || opt.ckpt.async_save || opt.ckpt.keep > 0))
    return hsdp::invalidArgument("--save-every, --async-save and --keep need --save-dir");
  if (opt.ckpt.resume == "latest" && opt.ckpt.save_dir.empty())
    return hsdp::invalidArgument("--resume latest needs --save-dir (the root it names)");
  if (opt.check && !opt.ckpt.init_from.empty())
    return hsdp::invalidArgument(
        "--check trains the reference from the built-in "
        "initialisation; it cannot follow --init-from");
  mesh_spec->intra_shard = opt.intra_shard;
  mesh_spec->inter_shard = opt.inter_shard;
  if (cfg->mode == hsdp::ShardMode::kNone) {  // plain data parallel: nothing is sharded
    if (mesh_spec->intra_shard == 0) mesh_spec->intra_shard = 1;
    if (mesh_spec->inter_shard == 0) mesh_spec->inter_shard = 1;
  }
  return hsdp::okStatus();
}

}  // namespace examples
