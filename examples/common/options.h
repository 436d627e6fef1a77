// The flags train_mlp (and train_mlp_gpu) and train_gpt share, and their check: one spelling, one
// check and one error message per flag in every program. The mesh, precision, offload,
// checkpoint and failure flags are hsdp's own (hsdp/flags.h: hsdp::cli::EngineFlags, declared
// once for every program); the training loop's are the examples' (common/flags.h). Each program
// keeps its own flags beside these (mlp::Options, gpt::Options).
#pragma once

#include <cstdint>
#include <string>

#include "hsdp/config.h"
#include "hsdp/flags.h"
#include "hsdp/mesh.h"
#include "hsdp/status.h"

namespace examples {

struct Options : hsdp::cli::EngineFlags {
  int steps = 10;
  int batch = 48;
  int accum = 1;
  int max_gathered = 0;
  float clip_norm = 0.0f;
  bool check = false;
  float lr = 1e-3f;
  float weight_decay = 0.01f;
  // 1e-5, not PyTorch's 1e-8: see docs/design.md, "Parity and Adam's eps".
  float eps = 1e-5f;
  std::string optimizer = "adamw";
  uint64_t seed = 1234;
  double tolerance = 1e-5;
  // --trace DIR: each rank's step timeline in DIR (EngineConfig::trace_dir, docs/trace.md).
  std::string trace;
  // --steps is the total: a resumed run trains from the checkpoint's step up to it (ckpt, the
  // checkpoint flags, is EngineFlags').
};

// The shared options checked and turned into the engine configuration and the mesh factors
// (hsdp::cli::engineConfig, then the optimizer, clipping and the rate limiter). A non-OK Status
// is bad input that every rank sees alike. cfg->device is left as it is (the caller's choice).
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
