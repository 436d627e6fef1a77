"""hsdp's MPI session, mesh and hierarchical collectives, under mpirun.

    s = hsdp.Session.init()                  # or, after `from mpi4py import MPI`: attach()
    mesh = s.mesh(intra_shard=2, inter_shard=2)
    c = mesh.collectives(gather_wire="bf16") # the inter-node phase's wire, per direction
    full = c.all_gather(shard)               # shard k at offset k * shard.size
    mine = c.reduce_scatter(full)            # the sum of block c.shard_index over the group
    c.all_reduce(buf)                        # in place
    s.close()                                # also at interpreter exit

Arrays are host arrays: numpy, or anything with DLPack or the buffer protocol; float32 (also
bfloat16 through DLPack, int32, int64, uint8 for the exact wires), C-contiguous. Errors are
exceptions carrying hsdp's message; nothing aborts the interpreter.
"""

import atexit
import os
import warnings
import weakref
from typing import Any, Dict, Optional

import numpy as np

from . import _errors, _hsdp

__all__ = ["Session", "Mesh", "Collectives"]

_live = weakref.WeakSet()
_atexit_registered = False


def _close_all() -> None:
    for s in list(_live):
        s.close()


def _track(s: "_hsdp.Session") -> None:
    # Registered when the first Session exists, so that it runs before mpi4py's finalizer
    # (atexit runs last-registered first, and mpi4py registered when it initialised MPI).
    global _atexit_registered
    _live.add(s)
    if not _atexit_registered:
        atexit.register(_close_all)
        _atexit_registered = True


class Collectives:
    """Hierarchical all-gather / reduce-scatter / all-reduce over the mesh's shard group:
    across nodes (inter_shard ranks) and inside the node (intra_shard ranks)."""

    def __init__(self, impl: "_hsdp.Collectives"):
        self._c = impl

    @property
    def group_size(self) -> int:
        """Ranks of the shard group (intra_shard x inter_shard)."""
        return self._c.group_size

    @property
    def shard_index(self) -> int:
        """This rank's shard k: its block of a reduce-scatter, its place in an all-gather."""
        return self._c.shard_index

    def all_gather(self, shard: Any, out: Optional[Any] = None, *,
                   wire: Optional[str] = None) -> Any:
        """Every rank's `shard` -> `out` (group_size * shard.size elements, shard k at offset
        k * shard.size). wire: this call's inter-node wire (fp32, bf16, int8, int4) instead of the
        collectives' gather_wire. Returns out (a new 1-D numpy array when not given)."""
        if out is None:
            a = np.asarray(shard)
            out = np.empty(a.size * self.group_size, dtype=a.dtype)
        self._c._all_gather(shard, out, wire)
        return out

    def reduce_scatter(self, full: Any, out: Optional[Any] = None, *, op: str = "sum") -> Any:
        """`full` (group_size * n elements on every rank) -> `out` (n elements): the reduction
        (sum, or avg) over the group of block shard_index."""
        if out is None:
            a = np.asarray(full)
            out = np.empty(a.size // max(self.group_size, 1), dtype=a.dtype)
        self._c._reduce_scatter(full, out, op)
        return out

    def all_reduce(self, buf: Any, *, op: str = "sum") -> Any:
        """In-place all-reduce (sum, or avg) of `buf` over the shard group; returns buf."""
        self._c._all_reduce(buf, op)
        return buf


class Mesh:
    """The two-level mesh: a shard group is intra_shard ranks on each of inter_shard nodes;
    what is not sharded is replicated."""

    def __init__(self, impl: "_hsdp.Mesh"):
        self._m = impl

    @property
    def shape(self) -> Dict[str, int]:
        """world, nodes, ranks_per_node, intra_shard, inter_shard, shard_group, replicas."""
        return self._m.shape

    @property
    def coords(self) -> Dict[str, int]:
        """This rank's place: node, local_rank, intra/inter group and index, shard_rank, ..."""
        return self._m.coords

    @property
    def device(self) -> str:
        """Where the engine keeps a model's state on this mesh: "cpu", or "cuda:N"."""
        return self._m.device

    def describe(self) -> str:
        return self._m.describe()

    def collectives(self, *, chunks: int = 1, gather_wire: str = "fp32",
                    reduce_wire: str = "fp32", allreduce_wire: str = "fp32",
                    quant_block: int = 2048) -> Collectives:
        """Hierarchical collectives over this mesh's shard group.

        chunks: pipeline depth (chunk c's intra phase runs while later chunks cross nodes).
        gather_wire, reduce_wire, allreduce_wire: the inter-node wire of all-gathers,
            reduce-scatters and all-reduces of float32 data: fp32 (exact), bf16, int8 or int4
            (block-quantized with one fp32 scale per quant_block elements). The intra-node
            phase always moves the data as it is.
        """
        return Collectives(self._m._collectives("shard", chunks, gather_wire, reduce_wire,
                                                allreduce_wire, quant_block))

    def __repr__(self) -> str:
        return f"<hsdp.Mesh {self.describe()}>"


def _device_arg(device: Any):
    """("cpu" | "cuda", index or -1) of "cpu", "cuda", "cuda:N" or a torch.device."""
    text = str(device)
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return "cpu", -1
    if kind == "cuda" and (not index or index.isdigit()):
        return "cuda", int(index) if index else -1
    raise _errors.InvalidArgumentError(
        f"device '{text}': expected 'cpu', 'cuda' or 'cuda:N'")


class HsdpTuningWarning(RuntimeWarning):
    """Session.attach() under Open MPI: hsdp's MPI tuning (applied before MPI_Init) is off."""


_attach_warned = False


class Session:
    """hsdp inside an MPI job. Use init() when hsdp starts MPI, attach() when the application
    (mpi4py) did. close() (or the end of a `with` block, or the interpreter's exit) frees hsdp's
    MPI objects and, after init(), finalizes MPI."""

    def __init__(self, impl: "_hsdp.Session"):
        self._s = impl
        # The binding's object, not this wrapper: a Mesh or a sharded model keeps it alive after
        # the wrapper is gone, and it must still be closed (MPI, the watchdog) before exit.
        _track(impl)

    @classmethod
    def init(cls) -> "Session":
        """MPI_Init_thread with hsdp's process tuning. FailedPreconditionError when MPI is already
        initialised (use attach())."""
        return cls(_hsdp.Session.init())

    @classmethod
    def attach(cls) -> "Session":
        """Join the application's MPI (e.g. `from mpi4py import MPI` first). hsdp runs on a
        duplicate of MPI_COMM_WORLD and never finalizes MPI. Under Open MPI it warns once, on
        rank 0 (HsdpTuningWarning), that hsdp's Open MPI tuning applies only to init()."""
        s = cls(_hsdp.Session.attach())
        global _attach_warned
        if s.rank == 0 and not _attach_warned and "OMPI_COMM_WORLD_SIZE" in os.environ:
            _attach_warned = True
            warnings.warn(
                "hsdp.Session.attach(): MPI was initialised by the application, so hsdp's Open "
                "MPI tuning (the TCP eager limit and links, yield when idle: set before "
                "MPI_Init) is not in effect; call hsdp.Session.init() instead (with mpi4py, set "
                "mpi4py.rc.initialize = False first; docs/torch.md)",
                HsdpTuningWarning, stacklevel=2)
        return s

    @property
    def rank(self) -> int:
        return self._s.rank

    @property
    def size(self) -> int:
        return self._s.size

    @property
    def owns_mpi(self) -> bool:
        return self._s.owns_mpi

    @property
    def closed(self) -> bool:
        return self._s.closed

    def barrier(self) -> None:
        self._s.barrier()

    def mesh(self, *, intra_shard: int = 0, inter_shard: int = 0,
             ranks_per_node: Optional[int] = None, intra_transport: str = "",
             inter_transport: str = "", device: Any = "cpu") -> Mesh:
        """Build the mesh (collective over the job).

        intra_shard: ranks of a node that shard a unit (0: all of them).
        inter_shard: nodes that shard a unit (0: 1).
        ranks_per_node: consecutive ranks form nodes of this size (an emulated cluster on one
            machine, as HSDP_RANKS_PER_NODE); default: HSDP_RANKS_PER_NODE, else by host.
        intra_transport, inter_transport: "mpi", "ucx", "nccl" ("": HSDP_TRANSPORT_*, else mpi;
            on a CUDA mesh nccl).
        device: where a model sharded on this mesh keeps its state, as torch's
            init_device_mesh(device_type) says it: "cpu" (host memory, MPI/UCX), or "cuda" /
            "cuda:N" / a torch.device (the engine's CUDA memory space on that GPU, NCCL over an
            NCCL world; "cuda": HSDP_CUDA_DEVICE, else the rank's index on its host modulo the
            visible GPUs, torch's usual torch.cuda.set_device(local_rank)). A build without
            CUDA, or a rank without a GPU, is a FailedPreconditionError on every rank.
        """
        kind, index = _device_arg(device)
        return Mesh(self._s._mesh(intra_shard, inter_shard, ranks_per_node or 0,
                                  intra_transport, inter_transport, kind, index))

    def close(self) -> None:
        self._s.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<hsdp.Session closed>"
        return f"<hsdp.Session rank {self.rank} of {self.size}>"
