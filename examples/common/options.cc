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
  if (opt.max_gathered < 0)
    return hsdp::invalidArgument("--max-gathered ", opt.max_gathered, " must be >= 0");
  cfg->pipeline.max_gathered_units = opt.max_gathered;
  cfg->trace_dir = opt.trace;
  HSDP_RETURN_IF_ERROR(hsdp::cli::engineConfig(opt, cfg, mesh_spec));
  if (opt.check && !opt.ckpt.init_from.empty())
    return hsdp::invalidArgument(
        "--check trains the reference from the built-in "
        "initialisation; it cannot follow --init-from");
  return hsdp::okStatus();
}

}  // namespace examples
