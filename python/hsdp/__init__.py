"""hsdp: hybrid sharded data parallelism (ZeRO / FSDP / HSDP), from Python.

A thin binding over libhsdp (C++): nothing here is a second implementation.

    hsdp.plan(...)                       per-GPU memory and cross-node traffic (hsdp-plan)
    hsdp.topology.discover()             hosts, ranks, node level and mesh (hsdp-topo)
    hsdp.checkpoint.open(dir)            a checkpoint's tensors as numpy arrays (hsdp-ckpt)
    hsdp.Session.init() / attach()       MPI, meshes and hierarchical collectives under mpirun
    hsdp.torch.shard(model, mesh, ...)   PyTorch models on hsdp's engine (pip install hsdp[torch])

Errors are exceptions under hsdp.Error carrying hsdp's message (hsdp._errors).
Guide: docs/python.md.
"""

import os as _os
import sys as _sys


def _prefer_torch_cuda_libraries() -> None:
    """A process holds one library per soname: where PyTorch's wheel brings NCCL and the CUDA
    runtime (the nvidia-* packages, newer than the system's), load those before the extension
    links the system's, so that torch, imported after hsdp, finds the symbols it needs. hsdp runs
    on them unchanged (both keep their ABI within a major version)."""
    import importlib.util
    import ctypes
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    for root in (spec.submodule_search_locations or []) if spec else []:
        for lib in ("cu13/lib/libcudart.so.13", "nccl/lib/libnccl.so.2"):
            path = _os.path.join(root, lib)
            if _os.path.exists(path):
                try:
                    ctypes.CDLL(path, mode=_os.RTLD_GLOBAL)
                except OSError:
                    pass


_prefer_torch_cuda_libraries()

# Open MPI loads its components with dlopen and they expect libmpi's symbols to be global (what
# mpi4py arranges too); a Python extension is otherwise loaded RTLD_LOCAL.
_flags = _sys.getdlopenflags()
_sys.setdlopenflags(_flags | _os.RTLD_GLOBAL)
try:
    from . import _hsdp
finally:
    _sys.setdlopenflags(_flags)

from . import _errors  # noqa: E402
from ._errors import (  # noqa: E402
    AbortedError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
    UnimplementedError,
)
from ._hsdp import AutoPlan, Plan, plan  # noqa: E402
from . import checkpoint, topology  # noqa: E402
from .collectives import Collectives, HsdpTuningWarning, Mesh, Session  # noqa: E402

__version__ = _hsdp.__version__

__all__ = ["plan", "Plan", "AutoPlan", "topology", "checkpoint", "Session", "Mesh", "Collectives",
           "HsdpTuningWarning",
           *_errors.__all__]
