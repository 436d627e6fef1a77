// What the MLP training examples share (train_mlp on host memory, train_mlp_gpu on a CUDA device):
// the MLP's flags on top of every example's (common/options.h), the printed report (header,
// per-step table) and the --check parity against the single-process Eigen reference, and the
// training loop both run. Two programs, one set of flags and one output format: a run on either
// is read the same way, and the tests and scripts that parse
// "parity vs eigen reference: max_rel_err=<v> PASS" work on both.
//
// `world` below is always a communicator over HOST memory (the MPI world): the report's
// all-gathers and the verdict's broadcast move host values. The engine's own collectives
// (gatherFullParameters) run on the mesh, which may be NCCL.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "common/options.h"
#include "hsdp/config.h"
#include "hsdp/mesh.h"
#include "hsdp/sharded_model.h"
#include "hsdp/status.h"
#include "hsdp/transport.h"
#include "mlp/mlp.h"

namespace mlp {

struct Options {
  examples::Options common;  // the flags every example has
  std::string dims = "32,1000,333,128,10";
  // After training: the mean loss over this many held-out samples (train_mlp; 0: none).
  int val_samples = 0;
};

// Parses argv into *opt. Returns an exit code when the program should end now: 0 after --help
// (printed by rank 0), kExitUsage after a parse error (printed by every rank); nullopt to go on.
std::optional<int> parseCommandLine(const char* program, const char* description, int argc,
                                    char** argv, int rank, Options* opt);

// The options checked and turned into the model spec, the engine configuration and the mesh
// factors. A non-OK Status is bad input that every rank sees alike. cfg->device is left as it is
// (the caller's choice).
[[nodiscard]] hsdp::Status configure(const Options& opt, int world_size, Spec* spec,
                                     hsdp::EngineConfig* cfg, hsdp::MeshSpec* mesh_spec);

// Registers one unit per linear layer ("fc<l>": weight out x in, bias out), finalizes the model
// (collective) and loads the same deterministic initial values (mlp::initLayer) on every rank.
[[nodiscard]] hsdp::Status buildModel(hsdp::ShardedModel& model, const Spec& spec);

// Rank 0 prints the run's header (program, ranks and nodes, mesh, mode and model, then
// `extra_line` when not empty) and the per-step table's column titles.
void printHeader(const char* program, const hsdp::Comm& world, const hsdp::Mesh& mesh,
                 const hsdp::EngineConfig& cfg, const Spec& spec, const Options& opt,
                 const std::string& extra_line = "");

// The training loop both examples share: until the model has committed opt.common.steps steps,
// beginStep() then train_step(start) (the step's mean loss; `start` says the step and, elastic,
// the data slot; a step the elastic quorum did not commit, kAborted, is run again), each timed and
// printed as a table row (mean loss, the model's grad norm, the slowest rank's time, samples/s, the
// most exposed communication), saves as the checkpoint flags say, then the offload summary, the
// memory table and, with --check, the parity against the Eigen reference:
//   parity vs eigen reference: max_rel_err=<v> PASS|FAIL
// Failures follow common/failure.h: a failing step ends the job through abort_comm (`world`, or on
// a device the NCCL world whose abort stops in-flight kernels); a non-finite loss or gradient
// norm stops every rank. Returns the program's exit code (1: parity FAIL).
int trainAndReport(const char* program, hsdp::Comm& world, hsdp::Comm& abort_comm,
                   const hsdp::Mesh& mesh, hsdp::ShardedModel& model, const Spec& spec,
                   const hsdp::EngineConfig& cfg, const Options& opt,
                   const std::function<hsdp::StatusOr<float>(const hsdp::StepStart&)>& train_step);

}  // namespace mlp
