// Internal to the engine: the configurations ShardedModel::create refuses, each named before
// anything is allocated, so that every rank reaches the same verdict with no collective.
#pragma once

#include "hsdp/config.h"
#include "hsdp/mesh.h"
#include "hsdp/status.h"

namespace hsdp::engine {

// Every combination the engine cannot run on `mesh` (the resolved `cfg`): InvalidArgument,
// Unimplemented or FailedPrecondition naming the setting.
[[nodiscard]] Status checkConfig(const Mesh& mesh, const EngineConfig& cfg);
// EngineConfig::clip_norm's check (finite, >= 0): create(), setClipNorm and load (a
// checkpoint's) use it.
[[nodiscard]] Status checkClipNorm(float clip_norm);

}  // namespace hsdp::engine
