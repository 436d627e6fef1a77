// Internal to the engine: a unit as the model registered it (name, flat layout, frozen), with
// what the optimizer step keeps of it: the weight-decay spans of this rank's shard, the Adam
// moments and CPU offload's host copies. Its parameters (memory and lifecycle) are the
// ParamGroup's (engine/param_group.h: UnitParams), its gradient the GradReducer's
// (engine/grad_reducer.h: UnitGrad), both by unit index.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/host_buffer.h"
#include "core/memory_space.h"
#include "engine/optimizer_step.h"
#include "hsdp/flat_layout.h"

namespace hsdp::engine {

struct Unit {
  std::string name;
  FlatLayout layout;
  bool frozen = false;  // UnitOptions::frozen: no gradient, no optimizer state, never reduced
  std::vector<DecaySpan> decay_spans;  // this rank's shard; one span when every param decays

  // ---- memory, allocated once in finalize() (sharded_model.cc) ----
  // The Adam moments of this rank's shard, in the engine's memory space (host or device,
  // core/memory_space.h); with CPU offload host memory.
  SpaceBuffer exp_avg, exp_avg_sq;
  // With CPU offload on a device: host copies of the fp32 master shard and of the gradient shard
  // (the moments above are host memory too); the step's job copies grad in, steps, copies the
  // master back. On host memory the shards themselves are NUMA-placed and stepped in place.
  HostBuffer host_master, host_grad;
  // With offload on a device and bf16 parameters: the bf16 copy the CPU Adam writes, uploaded
  // into the bf16 shard (on the host the CPU Adam writes that shard itself).
  HostBuffer host16;
  // The space's per-unit offload state (pinned registrations, copy events; HostCopies); declared
  // after the host buffers so that it goes first (unpins before they are freed).
  std::unique_ptr<HostCopies::OffloadSlot> offload;
};

}  // namespace hsdp::engine
