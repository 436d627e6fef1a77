"""hsdp: hybrid sharded data parallelism (ZeRO / FSDP / HSDP), from Python.

A thin binding over libhsdp (C++): nothing here is a second implementation.

    hsdp.plan(...)                       per-GPU memory and cross-node traffic (hsdp-plan)
    hsdp.topology.discover()             hosts, ranks, node level and mesh (hsdp-topo)
    hsdp.checkpoint.open(dir)            a checkpoint's tensors as numpy arrays (hsdp-ckpt)
    hsdp.Session.init() / attach()       MPI, meshes and hierarchical collectives under mpirun

Errors are exceptions under hsdp.Error carrying hsdp's message (hsdp._errors).
Guide: docs/python.md.
"""

import os as _os
import sys as _sys

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
from .collectives import Collectives, Mesh, Session  # noqa: E402

__version__ = _hsdp.__version__

__all__ = ["plan", "Plan", "AutoPlan", "topology", "checkpoint", "Session", "Mesh", "Collectives",
           *_errors.__all__]
