// The flags train_mlp (and train_mlp_gpu) and train_gpt share, and their check: one spelling, one
// check and one error message per flag in every program. Each program keeps its own flags beside
// these (mlp::Options, gpt::Options) and its own --help wording (common/flags.h adds the groups).
#pragma once

#include <cstdint>
#include <string>

#include "common/checkpointing.h"
#include "hsdp/config.h"
#include "hsdp/mesh.h"
#include "hsdp/status.h"

namespace examples {

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
  uint64_t seed = 1234;
  double tolerance = 1e-5;
  // --steps is the total: a resumed run trains from the checkpoint's step up to it.
  CheckpointFlags ckpt;
};

// The shared options checked and turned into the engine configuration and the mesh factors. A
// non-OK Status is bad input that every rank sees alike. cfg->device is left as it is (the
// caller's choice).
[[nodiscard]] hsdp::Status configure(const Options& opt, int world_size, hsdp::EngineConfig* cfg,
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

}  // namespace examples
