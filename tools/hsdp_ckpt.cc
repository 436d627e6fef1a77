// hsdp-ckpt: checkpoints without a job (no MPI, no GPU): inspect, verify, reshard for another
// mesh, export to safetensors, diff. docs/checkpoint.md describes the format.
//
//   hsdp-ckpt inspect DIR [--json]
//   hsdp-ckpt verify DIR
//   hsdp-ckpt reshard DIR OUT --world W --ranks-per-node R --intra-shard I --inter-shard J
//                     --mode none|zero1|zero2|zero3
//   hsdp-ckpt export DIR OUT.safetensors [--dtype fp32|bf16] [--max-shard-size BYTES]
//   hsdp-ckpt diff A B
//
// verify, reshard, export and diff print a progress line on stderr when it is a terminal (phase,
// done of total, rate, time left; --quiet: none) and stop on SIGINT or SIGTERM: what they wrote
// is removed, the message names what was left unfinished, the exit code is 128 + the signal.
//
// DIR is a checkpoint directory or a root whose `latest` names one. Exit codes: 0 success (diff:
// identical), 1 a checkpoint that fails verification (diff: different), 2 bad input, 3 a failure
// of the machine (a full disk, an I/O error, too little memory, the open-file limit).
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>

#include "hsdp/checkpoint.h"
#include "hsdp/cli.h"
#include "hsdp/files.h"
#include "hsdp/flags.h"
#include "hsdp/stop.h"

namespace {

// Everything printed passes through files::printable: nothing from a file reaches the terminal raw.
void print(FILE* to, const std::string& text) {
  std::fputs(hsdp::files::printable(text).c_str(), to);
}

bool progress_shown = false;  // a progress line is on stderr (ended before other output)
void endProgress() {
  if (progress_shown) std::fputs("\r\033[K", stderr);
  progress_shown = false;
}

int fail(const hsdp::Status& s, int code) {
  endProgress();
  if (hsdp::stopRequested() && s.code() == hsdp::StatusCode::kAborted) {
    print(stderr, "hsdp-ckpt: " + s.message() + "\n");
    return 128 + hsdp::stopSignal();
  }
  print(stderr, "hsdp-ckpt: error: " + s.toString() + "\n");
  return code;
}

// "1.5 GiB"-style for bytes, plain counts otherwise.
std::string amount(double v, const char* unit) {
  if (std::string(unit) != "bytes") return hsdp::strCat(static_cast<uint64_t>(v), " ", unit);
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (v >= 1024 && i < 4) v /= 1024, ++i;
  char b[32];
  std::snprintf(b, sizeof b, "%.1f %s", v, units[i]);
  return b;
}

// A progress line on a terminal, at most five times a second: phase, done of total, rate, time
// left. Silent when stderr is not a terminal or with --quiet.
void showProgress(bool quiet) {
  if (quiet || !isatty(STDERR_FILENO)) return;
  using Clock = std::chrono::steady_clock;
  struct State {
    std::string phase;
    Clock::time_point start, last;
  };
  auto st = std::make_shared<State>();
  hsdp::setOfflineProgress([st](const hsdp::OfflineProgress& p) {
    const auto now = Clock::now();
    if (st->phase != p.phase) st->phase = p.phase, st->start = now;
    if (now - st->last < std::chrono::milliseconds(200) && p.done < p.total) return;
    st->last = now;
    const double s = std::chrono::duration<double>(now - st->start).count();
    const double rate = s > 0 ? p.done / s : 0;
    std::string line = hsdp::strCat("hsdp-ckpt: ", p.phase, " ", amount(p.done, p.unit), " of ",
                                    amount(p.total, p.unit));
    if (p.total > 0) line += hsdp::strCat(" (", 100 * p.done / p.total, "%)");
    if (rate > 0) {
      line += ", " + amount(rate, p.unit) + "/s";
      if (p.total > p.done)
        line += hsdp::strCat(", ", static_cast<uint64_t>((p.total - p.done) / rate), " s left");
    }
    std::fputs(("\r\033[K" + line).c_str(), stderr);
    progress_shown = true;
  });
}

// Bad input (no checkpoint there, a bad flag value) is 2; a checkpoint that does not hold is 1;
// the machine's failure is 3.
int codeOf(const hsdp::Status& s) {
  if (hsdp::cli::exitCodeOf(s) == hsdp::cli::kExitRuntime) return hsdp::cli::kExitRuntime;
  const std::string& m = s.message();
  // A data file that is a link, a FIFO or a device is refused unread: bad input, not damage.
  if (m.find("not a regular file") != std::string::npos ||
      m.find("a symbolic link") != std::string::npos)
    return 2;
  const bool damaged =
      m.find("data file") != std::string::npos || m.find("checksum") != std::string::npos;
  return damaged ? 1 : 2;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"hsdp checkpoints without a job: inspect, verify, reshard, export, diff",
               "hsdp-ckpt"};
  app.require_subcommand(1);
  std::string dir, out, other, mode = "zero3", dtype = "fp32";
  bool json = false, quiet = false;
  hsdp::MeshTarget target;
  uint64_t max_shard = uint64_t{4} << 30;

  CLI::App* inspect =
      app.add_subcommand("inspect", "Step, mode, mesh, parameters, files, checksums");
  inspect->add_option("DIR", dir, "Checkpoint directory (or a root with `latest`)")->required();
  inspect->add_flag("--json", json, "JSON instead of a table");
  CLI::App* verify = app.add_subcommand("verify", "Recompute every checksum");
  verify->add_option("DIR", dir, "Checkpoint directory")->required();
  verify->add_flag("--quiet", quiet, "No progress line");
  CLI::App* reshard = app.add_subcommand("reshard", "Rewrite for another mesh (streaming)");
  reshard->add_option("DIR", dir, "Checkpoint directory")->required();
  reshard->add_option("OUT", out, "New checkpoint directory (must not exist)")->required();
  reshard->add_flag("--quiet", quiet, "No progress line");
  constexpr int kMax = 1 << 20;  // ranks, ranks per node
  hsdp::cli::addInt(*reshard, "--world", target.world_size, "Ranks of the target job", 1, kMax)
      ->required();
  hsdp::cli::addInt(*reshard, "--ranks-per-node", target.ranks_per_node, "Ranks per node", 1, kMax)
      ->required();
  const hsdp::cli::ShardFactorOptions factors = hsdp::cli::addShardFactorFlags(
      *reshard, target.intra_shard, target.inter_shard,
      {"Ranks per node that shard a unit", "Nodes that shard a unit"});
  factors.intra->required();
  factors.inter->required();
  hsdp::cli::addModeFlag(*reshard, mode, "none | zero1 | zero2 | zero3");
  CLI::App* exp = app.add_subcommand("export", "Full weights as safetensors");
  exp->add_option("DIR", dir, "Checkpoint directory")->required();
  exp->add_option("OUT", out, "Output .safetensors")->required();
  exp->add_flag("--quiet", quiet, "No progress line");
  exp->add_option("--dtype", dtype, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  hsdp::cli::addInt(*exp, "--max-shard-size", max_shard,
                    "Bytes per file before HF-style shards and an index (default 4 GiB)",
                    uint64_t{1});
  CLI::App* diff = app.add_subcommand("diff", "Per-tensor max abs/rel difference");
  diff->add_option("A", dir, "Checkpoint A")->required();
  diff->add_option("B", other, "Checkpoint B")->required();
  diff->add_flag("--quiet", quiet, "No progress line");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, "hsdp-ckpt");
  }

  if (inspect->parsed()) {
    auto text = hsdp::inspectCheckpoint(dir, json);
    if (!text.ok()) return fail(text.status(), codeOf(text.status()) == 3 ? 3 : 2);
    print(stdout, *text);
    return text->find("FAIL") != std::string::npos ||
                   text->find("\"checksums_ok\": false") != std::string::npos
               ? 1
               : 0;
  }
  // The long commands: progress on a terminal, SIGINT/SIGTERM stop them cleanly (fail() exits
  // 128 + the signal).
  if (hsdp::Status s = hsdp::installStopSignals({SIGINT, SIGTERM}); !s.ok()) return fail(s, 3);
  showProgress(quiet);
  if (verify->parsed()) {
    hsdp::Status s = hsdp::verifyCheckpoint(dir);
    if (!s.ok()) return fail(s, codeOf(s));
    endProgress();
    print(stdout, dir + ": every checksum holds\n");
    return 0;
  }
  if (reshard->parsed()) {
    auto m = hsdp::parseShardMode(mode);
    if (!m.ok()) return fail(m.status(), 2);
    target.mode = *m;
    const auto t0 = std::chrono::steady_clock::now();
    hsdp::Status s = hsdp::reshardCheckpoint(dir, out, target);
    if (!s.ok()) return fail(s, codeOf(s));
    endProgress();
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.3f",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    print(stdout,
          hsdp::strCat("resharded ", dir, " -> ", out, " for ", target.world_size, " ranks (",
                       target.ranks_per_node, " per node, intra_shard ", target.intra_shard,
                       ", inter_shard ", target.inter_shard, ", ", mode, ") in ", secs, " s\n"));
    return 0;
  }
  if (exp->parsed()) {
    hsdp::ExportOptions o;
    o.dtype = dtype == "bf16" ? hsdp::DType::kBFloat16 : hsdp::DType::kFloat32;
    o.max_shard_bytes = max_shard;
    auto files = hsdp::exportCheckpoint(dir, out, o);
    if (!files.ok()) return fail(files.status(), codeOf(files.status()));
    endProgress();
    for (const std::string& f : *files) print(stdout, "wrote " + f + "\n");
    return 0;
  }
  auto d = hsdp::diffCheckpoints(dir, other);
  if (!d.ok()) return fail(d.status(), codeOf(d.status()));
  endProgress();
  std::printf("step %lld vs %lld\n%-40s %14s %14s\n", static_cast<long long>(d->step_a),
              static_cast<long long>(d->step_b), "tensor", "max_abs", "max_rel");
  for (const hsdp::TensorDiff& t : d->tensors)
    std::printf("%-40s %14.6g %14.6g\n", hsdp::files::quote(t.name, 64).c_str(), t.max_abs,
                t.max_rel);
  std::printf("%s\n", d->identical() ? "identical" : "different");
  return d->identical() ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // the library returns Status; this is the last guard
    return fail(hsdp::Status(hsdp::StatusCode::kInternal, e.what()), 3);
  }
}
