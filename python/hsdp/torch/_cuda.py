"""hsdp.torch on a CUDA mesh (docs/torch.md, "CUDA").

A mesh built with `session.mesh(..., device="cuda")` keeps the engine's state in the CUDA memory
space of its GPU and runs its collectives on NCCL (python/src/cuda_binding.cc). What changes for
the model, and only that, is here:

- placement(): every parameter must be on the mesh's device; errors name the parameter (and say
  so when this hsdp was built without CUDA);
- attach(): the runtime's views of the engine's buffers become torch tensors on the device
  (DLPack over the engine's gathered parameters and full gradient, no copy) where the host path
  uses torch.from_numpy, so gradients accumulate in place in the engine's device gradient buffer
  exactly as they do in host memory;
- the engine's compute stream follows torch's current stream (torch.cuda.current_stream), the
  stream the model's forward kernels run on and autograd runs their backward on: the engine
  orders its gathers, reductions and optimizer step against it with CUDA events
  (ShardedModel::setComputeStream), so nothing here synchronises the device.
"""

from typing import List, Optional

import torch

from .. import _errors, _hsdp
from ._plan import PlannedParam


def placement(params: List[PlannedParam], mesh) -> Optional[torch.device]:
    """The model's device: None on a host mesh, the mesh's CUDA device on a CUDA mesh. Every
    parameter must be there; the first that is not is the error (the model is not touched)."""
    want = mesh.device
    for pp in params:
        d = pp.param.device
        if str(d) == want:
            continue
        if d.type == "cuda" and want == "cpu":
            if not _hsdp.cuda_built:
                raise _errors.FailedPreconditionError(
                    f"parameter '{pp.name}' is on {d}: this hsdp was built without CUDA "
                    "(HSDP_WITH_CUDA=OFF, or no CUDA toolkit and NCCL when it was configured), "
                    "so it keeps models in host memory only; build it with CUDA and NCCL "
                    "(docs/gpu.md), or move the model to the CPU")
            raise _errors.InvalidArgumentError(
                f"parameter '{pp.name}' is on {d} and the mesh on the host: build the mesh with "
                f"session.mesh(..., device='{d}') (docs/torch.md, 'CUDA')")
        raise _errors.InvalidArgumentError(
            f"parameter '{pp.name}' is on {d}, the mesh on {want}: move the model there first "
            f"(model.to('{want}')), or build the mesh on {d}")
    return None if want == "cpu" else torch.device(want)


def attach(rt, engine, device: torch.device) -> None:
    """The runtime on the engine's CUDA buffers: device views, and torch's current stream as the
    engine's compute stream from now on (first set here, before the weights are first read)."""
    rt.params_tensor = engine.device_params_view
    rt.grads_tensor = engine.device_grads_view
    rt.empty = torch.empty(0, device=device)
    rt.follow_stream = _StreamFollower(engine, device)
    rt.follow_stream()


class _StreamFollower:
    """Sets the engine's compute stream to torch's current stream on `device` when it changed.
    Called between steps only (the runtime's sync_stream: no unit gathered), as
    ShardedModel::setComputeStream requires; the engine orders the new stream after the work
    already on the old one with an event."""

    def __init__(self, engine, device: torch.device):
        self.e, self.device, self.stream = engine, device, None

    def __call__(self) -> None:
        s = torch.cuda.current_stream(self.device).cuda_stream
        if s != self.stream:
            self.e.set_compute_stream(s)
            self.stream = s
