#include "common/checkpointing.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace examples {
namespace {

void printSaved(const hsdp::Comm& world, const hsdp::SaveResult& r) {
  if (world.rank() != 0) return;
  if (!r.written) {  // elastic: another group of the quorum writes it
    std::printf("checkpoint of step %lld: written by group %d (the writer), not this group\n",
                static_cast<long long>(r.step), r.writer_group);
    std::fflush(stdout);
    return;
  }
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

// The user entry that records the elastic membership of every step up to a save: one item per
// step, "<groups>:<g>,<g>,...;", the job's group count and the groups of the committed quorum.
constexpr const char* kMembershipKey = "elastic.membership";

std::string encodeMembership(const Membership& m) {
  std::string out;
  for (size_t s = 0; s < m.present.size(); ++s) {
    out += std::to_string(m.slices(static_cast<int>(s))) + ":";
    for (size_t i = 0; i < m.present[s].size(); ++i)
      out += (i ? "," : "") + std::to_string(m.present[s][i]);
    out += ";";
  }
  return out;
}

// Parses encodeMembership's text of `steps` steps; an error names the checkpoint and the item.
hsdp::StatusOr<Membership> decodeMembership(const std::string& text, int64_t steps,
                                            const std::string& dir) {
  Membership m;
  auto bad = [&](size_t at, const char* why) {
    return hsdp::invalidArgument("checkpoint ", dir, ": user entry '", kMembershipKey, "' at byte ",
                                 at, ": ", why);
  };
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find(';', pos), colon = text.find(':', pos);
    if (end == std::string::npos || colon == std::string::npos || colon > end)
      return bad(pos, "want '<groups>:<g>,...;'");
    char* e = nullptr;
    const long groups = std::strtol(text.c_str() + pos, &e, 10);
    if (e != text.c_str() + colon || groups < 1 || groups > 1 << 20)
      return bad(pos, "the group count is not a positive number");
    m.step_groups.push_back(static_cast<int>(groups));
    m.present.emplace_back();
    for (size_t p = colon + 1; p < end;) {
      const long g = std::strtol(text.c_str() + p, &e, 10);
      const size_t q = static_cast<size_t>(e - text.c_str());
      if (q == p || g < 0 || g >= groups || (q != end && text[q] != ','))
        return bad(p, "a group index is not in [0, groups)");
      m.present.back().push_back(static_cast<int>(g));
      p = q == end ? end : q + 1;
    }
    if (m.present.back().empty()) return bad(pos, "a step without groups");
    pos = end + 1;
  }
  if (static_cast<int64_t>(m.present.size()) != steps)
    return hsdp::invalidArgument("checkpoint ", dir, ": user entry '", kMembershipKey, "' records ",
                                 m.present.size(), " steps, the checkpoint is at step ", steps);
  return m;
}

}  // namespace

hsdp::StatusOr<Membership> Checkpoints::membership(int steps) {
  if (!model_.elastic()) return hsdp::failedPrecondition("membership: elastic mode is off");
  const int known = static_cast<int>(history_.present.size());
  if (!history_known_ || known > steps)
    return hsdp::failedPrecondition("the resumed checkpoint (step ", resumed_,
                                    ") records no elastic membership ('", kMembershipKey,
                                    "'): the steps before it cannot be replayed");
  HSDP_ASSIGN_OR_RETURN(std::vector<std::vector<int>> more, model_.elasticMembership(steps, known));
  history_.groups = *model_.config().elastic.groups;
  for (std::vector<int>& p : more) {
    history_.step_groups.push_back(history_.groups);
    history_.present.push_back(std::move(p));
  }
  return history_;
}

hsdp::StatusOr<hsdp::SaveOptions> Checkpoints::saveOptions(int steps_done) {
  hsdp::SaveOptions so;
  so.keep_last = flags_.keep;
  so.user["train_mlp.next_step"] = std::to_string(steps_done);  // the data position
  so.user["train_mlp.seed"] = std::to_string(seed_);
  if (model_.elastic() && history_known_) {  // the membership of every step so far
    HSDP_ASSIGN_OR_RETURN(Membership m, membership(steps_done));
    so.user[kMembershipKey] = encodeMembership(m);
  }
  return so;
}

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
  if (model_.elastic()) {
    // The membership of the saving job's steps (what --check replays before this job's own).
    auto it = r.user.find(kMembershipKey);
    history_known_ = it != r.user.end() || r.step == 0;
    resumed_ = r.step;
    if (it != r.user.end()) {
      HSDP_ASSIGN_OR_RETURN(history_, decodeMembership(it->second, r.step, r.dir));
    }
  }
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
  HSDP_ASSIGN_OR_RETURN(hsdp::SaveOptions so, saveOptions(steps_done));
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
  HSDP_ASSIGN_OR_RETURN(hsdp::SaveOptions so, saveOptions(steps_done));
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
