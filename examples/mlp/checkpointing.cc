#include "mlp/checkpointing.h"

#include <cstdio>
#include <string>

namespace mlp {
namespace {

void printSaved(const hsdp::Comm& world, const hsdp::SaveResult& r) {
  if (world.rank() != 0) return;
  const double mib = r.bytes / 1048576.0;
  const size_t slash = r.dir.find_last_of('/');
  std::printf("checkpoint %s: %.2f MiB in %.3f s (%.1f MiB/s) -> %s\n",
              r.dir.substr(slash + 1).c_str(), mib, r.seconds,
              r.seconds > 0 ? mib / r.seconds : 0.0, r.dir.c_str());
  std::fflush(stdout);
}

int last_saved = -1;  // the step of this run's last save into --save-dir

// One line per optimizer setting where the checkpoint's differs from the flags' (rank 0).
void printDifferences(const hsdp::LoadResult& r, const hsdp::AdamConfig& flags, const Options& opt,
                      const RestoreHints& hints) {
  const bool from_ckpt = opt.optimizer_from == "checkpoint";
  auto line = [&](const char* setting, const std::string& saved, const char* flag,
                  const std::string& configured) {
    const std::string theirs = flag ? std::string(flag) : std::string("the configured ") + setting;
    std::printf("resume: checkpoint %s %s differs from %s %s; using %s (--optimizer-from %s)\n",
                setting, saved.c_str(), theirs.c_str(), configured.c_str(),
                from_ckpt ? "the checkpoint's" : theirs.c_str(), opt.optimizer_from.c_str());
  };
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  const hsdp::AdamConfig& c = r.optimizer;
  if (c.kind != flags.kind)
    line("optimizer", hsdp::optimizerName(c.kind), "--optimizer", hsdp::optimizerName(flags.kind));
  if (hints.lr_at) {
    // The schedule sets every step's rate: compare with the rate it gave the last saved step.
    const float want = r.step > 0 ? hints.lr_at(r.step - 1) : flags.lr;
    if (c.lr != want)
      std::printf(
          "resume: checkpoint lr %s differs from the schedule's %s at step %lld (--lr %s); "
          "the schedule sets every step's rate from --lr\n",
          num(c.lr).c_str(), num(want).c_str(), static_cast<long long>(r.step),
          num(flags.lr).c_str());
  } else if (c.lr != flags.lr) {
    line("lr", num(c.lr), "--lr", num(flags.lr));
  }
  if (c.beta1 != flags.beta1) line("beta1", num(c.beta1), nullptr, num(flags.beta1));
  if (c.beta2 != flags.beta2)
    line("beta2", num(c.beta2), hints.beta2_flag ? "--beta2" : nullptr, num(flags.beta2));
  if (c.eps != flags.eps) line("eps", num(c.eps), "--eps", num(flags.eps));
  if (c.weight_decay != flags.weight_decay)
    line("weight_decay", num(c.weight_decay), "--weight-decay", num(flags.weight_decay));
  std::fflush(stdout);
}

}  // namespace

hsdp::StatusOr<int> restore(const char* program, hsdp::Comm& world, hsdp::ShardedModel& model,
                            const Options& opt, const RestoreHints& hints) {
  if (!opt.init_from.empty()) {
    HSDP_RETURN_IF_ERROR(model.loadWeights(opt.init_from));
    if (world.rank() == 0) std::printf("initialised from %s\n", opt.init_from.c_str());
  }
  if (opt.resume.empty()) return 0;
  const std::string path = opt.resume == "latest" ? opt.save_dir : opt.resume;
  const hsdp::AdamConfig flags = model.config().adam;  // what the flags configured
  hsdp::LoadOptions lo;
  lo.optimizer_from = opt.optimizer_from == "flags" ? hsdp::OptimizerFrom::kConfig
                                                    : hsdp::OptimizerFrom::kCheckpoint;
  HSDP_ASSIGN_OR_RETURN(hsdp::LoadResult r, model.load(path, lo));
  if (world.rank() == 0) printDifferences(r, flags, opt, hints);
  if (opt.resume == "latest" || opt.resume == opt.save_dir) last_saved = static_cast<int>(r.step);
  if (r.step > opt.steps)
    return hsdp::invalidArgument("--resume: the checkpoint is at step ", r.step, ", past --steps ",
                                 opt.steps, " (--steps counts the total)");
  if (world.rank() == 0) {
    std::printf("resumed from %s at step %lld (%.2f MiB read by rank 0 in %.3f s)\n", r.dir.c_str(),
                static_cast<long long>(r.step), r.bytes_read / 1048576.0, r.seconds);
    std::fflush(stdout);
  }
  return static_cast<int>(r.step);
}

hsdp::Status afterStep(hsdp::Comm& world, hsdp::ShardedModel& model, const Options& opt,
                       int steps_done, bool last) {
  if (opt.save_dir.empty()) return hsdp::okStatus();
  const bool due = (opt.save_every > 0 && steps_done % opt.save_every == 0) || last;
  if (!due || steps_done == last_saved) return hsdp::okStatus();
  hsdp::SaveOptions so;
  so.keep_last = opt.keep;
  so.user["train_mlp.next_step"] = std::to_string(steps_done);  // the data position
  so.user["train_mlp.seed"] = std::to_string(opt.seed);
  last_saved = steps_done;
  if (!opt.async_save) {
    HSDP_ASSIGN_OR_RETURN(hsdp::SaveResult r, model.save(opt.save_dir, so));
    printSaved(world, r);
    return hsdp::okStatus();
  }
  if (model.saveInFlight()) {
    HSDP_ASSIGN_OR_RETURN(hsdp::SaveResult r, model.waitForSave());
    printSaved(world, r);
  }
  HSDP_RETURN_IF_ERROR(model.saveAsync(opt.save_dir, so));
  if (world.rank() == 0) {
    std::printf("checkpoint of step %d: writing in the background\n", steps_done);
    std::fflush(stdout);
  }
  return hsdp::okStatus();
}

hsdp::Status finishCheckpoints(hsdp::Comm& world, hsdp::ShardedModel& model, const Options& opt) {
  if (model.saveInFlight()) {
    HSDP_ASSIGN_OR_RETURN(hsdp::SaveResult r, model.waitForSave());
    printSaved(world, r);
  }
  if (opt.export_path.empty()) return hsdp::okStatus();
  HSDP_ASSIGN_OR_RETURN(std::vector<std::string> files, model.exportSafetensors(opt.export_path));
  if (world.rank() == 0)
    for (const std::string& f : files) std::printf("exported %s\n", f.c_str());
  return hsdp::okStatus();
}

}  // namespace mlp
