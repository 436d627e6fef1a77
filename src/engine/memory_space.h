// Internal to the engine: how ShardedModel gets the memory space it keeps its buffers in, by its
// Device (hsdp/config.h). The interfaces a space implements, and the registry device spaces add
// themselves to, are core's (core/memory_space.h), so that a backend below the engine can
// implement them. One engine (engine/sharded_model.cc) runs on either space:
//
//  - host (core/memory_space.h: hostMemorySpace, core/memory_space_host.cc): HostBuffer, memcpy,
//    loops and the CPU Adam; collectives are waited for on the host. This is the engine as it
//    was before the seam, operation for operation, so host results are bit for bit unchanged.
//  - CUDA (cuda/cuda_space.h: device buffers, kernels from cuda/kernels.h, the offload and
//    snapshot copies; cuda/nccl_space.cc: NCCL collectives on them and the
//    registration as "cuda", in CUDA builds only): "waiting" for a collective is a stream waiting
//    on an event, so the host runs ahead and only waits where the public contract needs a host
//    value.
#pragma once

#include "core/memory_space.h"
#include "hsdp/config.h"

namespace hsdp {

// The space registered for `device` (kHost: not registered, use hostMemorySpace). A device this
// build has no space for is a FailedPrecondition saying how to get it.
StatusOr<SpaceBundle> createMemorySpace(Device device, void* compute_stream);
// OK when createMemorySpace(device, ...) has a factory to call, else its FailedPrecondition.
Status memorySpaceAvailable(Device device);

}  // namespace hsdp
