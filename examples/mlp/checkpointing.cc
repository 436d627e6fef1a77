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

}  // namespace

hsdp::StatusOr<int> restore(const char* program, hsdp::Comm& world, hsdp::ShardedModel& model,
                            const Options& opt) {
  if (!opt.init_from.empty()) {
    HSDP_RETURN_IF_ERROR(model.loadWeights(opt.init_from));
    if (world.rank() == 0) std::printf("initialised from %s\n", opt.init_from.c_str());
  }
  if (opt.resume.empty()) return 0;
  const std::string path = opt.resume == "latest" ? opt.save_dir : opt.resume;
  HSDP_ASSIGN_OR_RETURN(hsdp::LoadResult r, model.load(path));
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
