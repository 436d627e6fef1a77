#include "common/checkpointing.h"

#include <cstdio>
#include <string>

namespace examples {
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

// One line per optimizer setting where the checkpoint's differs from the flags' (rank 0).
void printDifferences(const hsdp::LoadResult& r, const hsdp::AdamConfig& flags,
                      const std::string& optimizer_from, const RestoreHints& hints) {
  const bool from_ckpt = optimizer_from == "checkpoint";
  auto line = [&](const char* setting, const std::string& saved, const char* flag,
                  const std::string& configured) {
    const std::string theirs = flag ? std::string(flag) : std::string("the configured ") + setting;
    std::printf("resume: checkpoint %s %s differs from %s %s; using %s (--optimizer-from %s)\n",
                setting, saved.c_str(), theirs.c_str(), configured.c_str(),
                from_ckpt ? "the checkpoint's" : theirs.c_str(), optimizer_from.c_str());
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

hsdp::StatusOr<int> Checkpoints::restore(int steps, const RestoreHints& hints) {
  if (!flags_.init_from.empty()) {
    HSDP_RETURN_IF_ERROR(model_.loadWeights(flags_.init_from, hints.weights));
    if (world_.rank() == 0) std::printf("initialised from %s\n", flags_.init_from.c_str());
  }
  if (flags_.resume.empty()) return 0;
  const std::string path = flags_.resume == "latest" ? flags_.save_dir : flags_.resume;
  const hsdp::AdamConfig configured = model_.config().adam;  // what the flags configured
  hsdp::LoadOptions lo;
  lo.optimizer_from = flags_.optimizer_from == "flags" ? hsdp::OptimizerFrom::kConfig
                                                       : hsdp::OptimizerFrom::kCheckpoint;
  HSDP_ASSIGN_OR_RETURN(hsdp::LoadResult r, model_.load(path, lo));
  if (world_.rank() == 0) printDifferences(r, configured, flags_.optimizer_from, hints);
  if (flags_.resume == "latest" || flags_.resume == flags_.save_dir)
    last_saved_ = static_cast<int>(r.step);
  if (r.step > steps)
    return hsdp::invalidArgument("--resume: the checkpoint is at step ", r.step, ", past --steps ",
                                 steps, " (--steps counts the total)");
  if (world_.rank() == 0) {
    std::printf("resumed from %s at step %lld (%.2f MiB read by rank 0 in %.3f s)\n", r.dir.c_str(),
                static_cast<long long>(r.step), r.bytes_read / 1048576.0, r.seconds);
    std::fflush(stdout);
  }
  return static_cast<int>(r.step);
}

hsdp::Status Checkpoints::afterStep(int steps_done, bool last) {
  if (flags_.save_dir.empty()) return hsdp::okStatus();
  const bool due = (flags_.save_every > 0 && steps_done % flags_.save_every == 0) || last;
  if (!due || steps_done == last_saved_) return hsdp::okStatus();
  hsdp::SaveOptions so;
  so.keep_last = flags_.keep;
  so.user["train_mlp.next_step"] = std::to_string(steps_done);  // the data position
  so.user["train_mlp.seed"] = std::to_string(seed_);
  last_saved_ = steps_done;
  if (!flags_.async_save) {
    HSDP_ASSIGN_OR_RETURN(hsdp::SaveResult r, model_.save(flags_.save_dir, so));
    printSaved(world_, r);
    last_dir_ = r.dir;
    return hsdp::okStatus();
  }
  if (model_.saveInFlight()) {
    HSDP_ASSIGN_OR_RETURN(hsdp::SaveResult r, model_.waitForSave());
    printSaved(world_, r);
    last_dir_ = r.dir;
  }
  HSDP_RETURN_IF_ERROR(model_.saveAsync(flags_.save_dir, so));
  if (world_.rank() == 0) {
    std::printf("checkpoint of step %d: writing in the background\n", steps_done);
    std::fflush(stdout);
  }
  return hsdp::okStatus();
}

hsdp::StatusOr<std::string> Checkpoints::saveForStop(int steps_done) {
  if (model_.saveInFlight()) {
    HSDP_ASSIGN_OR_RETURN(hsdp::SaveResult r, model_.waitForSave());
    printSaved(world_, r);
    last_dir_ = r.dir;
  }
  if (flags_.save_dir.empty()) return std::string();
  if (steps_done == last_saved_ && !last_dir_.empty()) return last_dir_;
  hsdp::SaveOptions so;
  so.keep_last = flags_.keep;
  so.user["train_mlp.next_step"] = std::to_string(steps_done);
  so.user["train_mlp.seed"] = std::to_string(seed_);
  HSDP_ASSIGN_OR_RETURN(hsdp::SaveResult r, model_.save(flags_.save_dir, so));
  printSaved(world_, r);
  last_saved_ = steps_done;
  last_dir_ = r.dir;
  return r.dir;
}

hsdp::Status Checkpoints::finish() {
  if (model_.saveInFlight()) {
    HSDP_ASSIGN_OR_RETURN(hsdp::SaveResult r, model_.waitForSave());
    printSaved(world_, r);
  }
  if (flags_.export_path.empty()) return hsdp::okStatus();
  HSDP_ASSIGN_OR_RETURN(std::vector<std::string> files,
                        model_.exportSafetensors(flags_.export_path));
  if (world_.rank() == 0)
    for (const std::string& f : files) std::printf("exported %s\n", f.c_str());
  return hsdp::okStatus();
}

}  // namespace examples
