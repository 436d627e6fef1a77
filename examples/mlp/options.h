// What the MLP training examples share (train_mlp on host memory, train_mlp_gpu on a CUDA device):
// the command line, its validation into an engine configuration, the printed report (header,
// per-step table, memory) and the --check parity against the single-process Eigen reference.
// Two programs, one set of flags and one output format: a run on either is read the same way,
// and the tests and scripts that parse "parity vs eigen reference: max_rel_err=<v> PASS" work on
// both.
//
// `world` below is always a communicator over HOST memory (the MPI world): the report's
// all-gathers and the verdict's broadcast move host values. The engine's own collectives
// (gatherFullParameters) run on the mesh, which may be NCCL.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hsdp/config.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/sharded_model.h"
#include "hsdp/status.h"
#include "hsdp/transport.h"
#include "mlp/mlp.h"

namespace mlp {

struct Options {
  std::string mode = "zero3";
  int intra_shard = 0;  // 0: mode's default
  int inter_shard = 0;
  bool intra_shard_given = false;
  bool inter_shard_given = false;
  int steps = 10;
  int batch = 48;
  int accum = 1;
  std::string offload = "none";
  std::string param_dtype = "fp32";
  bool hpz = false;
  int max_gathered = 0;
  std::string reduce_dtype = "fp32";
  float clip_norm = 0.0f;
  bool check = false;
  bool allow_nonfinite = false;  // --allow-nonfinite: train on through a nan/inf loss or norm
  float lr = 1e-3f;
  float weight_decay = 0.01f;
  // 1e-5, not PyTorch's 1e-8: see docs/design.md, "Parity and Adam's eps".
  float eps = 1e-5f;
  std::string optimizer = "adamw";
  std::string dims = "32,1000,333,128,10";
  uint64_t seed = 1234;
  double tolerance = 1e-5;
  // Checkpoints (mlp/checkpointing.h). --steps is the total: a resumed run trains from the
  // checkpoint's step up to it.
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
  // After training: the mean loss over this many held-out samples (train_mlp; 0: none).
  int val_samples = 0;
};

// Exit codes of the examples: bad input (every rank sees it alike), a failure while training.
constexpr int kExitUsage = 2;
constexpr int kExitRuntime = 3;

// "<program> [rank r]: error: <what>" on stderr. Every rank parses the same argv, so every rank
// reaches the same verdict and prints it.
void printError(const char* program, int rank, const std::string& what);
// kExitUsage for what the user can fix (InvalidArgument, NotFound, FailedPrecondition: a bad
// path, a corrupt or mismatching checkpoint), else kExitRuntime (a full disk, an I/O error).
int exitCodeOf(const hsdp::Status& s);

// Parses argv into *opt (every flag of both examples). Returns an exit code when the program
// should end now: 0 after --help (printed by rank 0), kExitUsage after a parse error (printed by
// every rank); nullopt to go on.
std::optional<int> parseCommandLine(const char* program, const char* description, int argc,
                                    char** argv, int rank, Options* opt);

// What both examples hold once started: the MPI session, its world, the parsed options.
struct Started {
  std::unique_ptr<hsdp::mpi::Session> session;  // declared first: finalizes MPI last
  std::unique_ptr<hsdp::Comm> world;
  Options opt;
};

// The MPI half of start(), for programs with flags of their own: starts the session and fills
// out->session and out->world (out->opt is left as it is). Returns the exit code when the program
// must end now (a bad HSDP_* setting: kExitUsage; MPI failing: kExitRuntime), reported by every
// rank; nullopt to go on.
std::optional<int> startMpi(const char* program, int* argc, char*** argv, Started* out);

// Starts MPI (hsdp::mpi::Session) and parses argv on every rank. Returns the exit code when the
// program must end now (a bad HSDP_* setting: kExitUsage; --help: 0; a bad flag: kExitUsage; MPI
// failing: kExitRuntime), each reported by every rank; nullopt to go on with *out filled.
std::optional<int> start(const char* program, const char* description, int* argc, char*** argv,
                         Started* out);

// The options checked and turned into the model spec, the engine configuration and the mesh
// factors. A non-OK Status is bad input that every rank sees alike. cfg->device is left as it is
// (the caller's choice).
hsdp::Status configure(const Options& opt, int world_size, Spec* spec, hsdp::EngineConfig* cfg,
                       hsdp::MeshSpec* mesh_spec);

// Shapes a user gives size memory; their products must fit what one process may allocate
// (hsdp::allocatableBytes) before anything is allocated. A lower bound of one rank's need:
// the largest unit gathered with its gradient (8 bytes a parameter), `activation_bytes` (the
// caller's count for one micro-batch), and, with --check, the reference's whole model with its
// gradient and Adam moments (16 bytes a parameter). InvalidArgument naming `what` (the flags as
// written), the bytes and the limit; products that overflow 64 bits are named the same way.
[[nodiscard]] hsdp::Status checkModelFits(uint64_t largest_unit, uint64_t total_params,
                                          uint64_t activation_bytes, bool check,
                                          const std::string& what);

// Registers one unit per linear layer ("fc<l>": weight out x in, bias out), finalizes the model
// (collective) and loads the same deterministic initial values (mlp::initLayer) on every rank.
[[nodiscard]] hsdp::Status buildModel(hsdp::ShardedModel& model, const Spec& spec);

// The header's first two lines (the caller prints them on rank 0 only):
//   hsdp <program>: <n> ranks on <k> [virtual ]nodes (<names>)
//   mesh: <Mesh::describe()>
void printNodeMap(const char* program, const hsdp::Comm& world, const hsdp::Mesh& mesh);

// Rank 0 prints the run's header (program, ranks and nodes, mesh, mode and model, then
// `extra_line` when not empty) and the per-step table's column titles.
void printHeader(const char* program, const hsdp::Comm& world, const hsdp::Mesh& mesh,
                 const hsdp::EngineConfig& cfg, const Spec& spec, const Options& opt,
                 const std::string& extra_line = "");

// Collective over `world`: every rank's loss, step time and exposed communication, and rank 0
// prints one table row (mean loss, the model's grad norm, the slowest rank's time, samples/s,
// the most exposed communication).
[[nodiscard]] hsdp::Status printStepRow(hsdp::Comm& world, const hsdp::ShardedModel& model,
                                        const Options& opt, int step, float loss, float time_ms,
                                        float exposed_comm_ms);

// With CPU offload, rank 0 prints how much CPU Adam time per step the run spent and how much of
// it step() waited for (the totals of ShardedModel::takeOptimizerSeconds over the run).
void printOffloadSummary(const hsdp::Comm& world, const hsdp::EngineConfig& cfg, const Options& opt,
                         double optim_total_s, double optim_exposed_s);

// Collective over `world`: the per-rank memory table, hsdp-plan's prediction beside rank 0's
// measurement (fp32 policy), and the saving against replicated data parallel.
[[nodiscard]] hsdp::Status printMemory(hsdp::Comm& world, const hsdp::Mesh& mesh,
                                       const hsdp::ShardedModel& model, const Spec& spec,
                                       const hsdp::EngineConfig& cfg);

// printMemory for any model: unit_numels holds each unit's parameter count (the plan's units;
// their sum is the model's size).
[[nodiscard]] hsdp::Status printMemory(hsdp::Comm& world, const hsdp::Mesh& mesh,
                                       const hsdp::ShardedModel& model,
                                       const std::vector<uint64_t>& unit_numels,
                                       const hsdp::EngineConfig& cfg);

// --check: gathers every unit's parameters (collective over the mesh), trains the Eigen reference
// on rank 0 with the roundings this configuration applies (mlp::trainReference, the bf16 tree of
// the mesh), broadcasts the verdict over `world`, and rank 0 prints
//   parity vs eigen reference: max_rel_err=<v> PASS|FAIL
// Returns the program's exit code: 0 on PASS, 1 on FAIL. A failing collective ends the job
// (world.abortJob(kExitRuntime)): ranks could otherwise disagree about what comes next.
int checkParity(const char* program, hsdp::Comm& world, const hsdp::Mesh& mesh,
                hsdp::ShardedModel& model, const Spec& spec, const hsdp::EngineConfig& cfg,
                const Options& opt);

// The training loop both examples share: opt.steps calls of train_step(step) (the step's mean
// loss), each timed and printed as a table row (printStepRow), then the offload summary, the
// memory table and, with --check, the parity check. A failing step ends the job through
// abort_comm.abortJob(kExitRuntime) (ranks may disagree about the next collective: never hang);
// abort_comm is `world` or, on a device, the NCCL world whose abort stops in-flight kernels.
// Returns the program's exit code.
int trainAndReport(const char* program, hsdp::Comm& world, hsdp::Comm& abort_comm,
                   const hsdp::Mesh& mesh, hsdp::ShardedModel& model, const Spec& spec,
                   const hsdp::EngineConfig& cfg, const Options& opt,
                   const std::function<hsdp::StatusOr<float>(int step)>& train_step);

}  // namespace mlp
