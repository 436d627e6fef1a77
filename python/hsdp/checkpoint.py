"""hsdp.checkpoint: hsdp checkpoints from Python (what hsdp-ckpt does, and tensors as arrays).

    ck = hsdp.checkpoint.open("ckpt")             # a checkpoint dir, or a root with `latest`
    ck.step, ck.mode, ck.mesh, ck.units
    w = ck["h.3.attn.c_attn.weight"]               # numpy float32, full (unsharded) shape
    m = ck.optimizer_state("h.3.attn.c_attn.weight")   # {"exp_avg": ..., "exp_avg_sq": ...}
    torch.from_dlpack(w)                           # no copy (numpy arrays speak DLPack)
    ck.verify()                                    # every data file's xxHash64
    hsdp.checkpoint.reshard("ckpt", "ckpt-8", world=8, ranks_per_node=4, intra_shard=4,
                            inter_shard=1, mode="zero3")
    hsdp.checkpoint.export_safetensors("ckpt", "model.safetensors")
    hsdp.checkpoint.diff("a", "b").identical

A tensor that lies in one data file as one run (any tensor of a checkpoint saved on one rank) is
mapped in place, copy on write: no bytes are copied, and writing to the array never changes the
file. Any other is assembled from the shards that hold its pieces. Every chunk's xxHash64 is
checked on the way unless verify=False. Each call is the library's own code (hsdp/checkpoint.h),
the same as hsdp-ckpt's.
"""

import os
from typing import Any, Dict, Iterator, List, Union

import numpy as np

from . import _hsdp
from ._hsdp import CheckpointDiff, CheckpointTensor, TensorDiff

__all__ = ["Checkpoint", "CheckpointTensor", "CheckpointDiff", "TensorDiff", "open", "inspect",
           "verify", "reshard", "export_safetensors", "diff"]

PathLike = Union[str, "os.PathLike[str]"]


def _path(p: PathLike) -> str:
    return os.fspath(p)


class Checkpoint:
    """An opened checkpoint. Indexing by name gives the full fp32 master parameter."""

    def __init__(self, path: PathLike):
        self._r = _hsdp.CheckpointReader.open(_path(path))
        self._summary = self._r.summary(checksums=False)
        self._by_name = {t.name: t for t in self._r.tensors}

    # ---- what the manifest says ----
    @property
    def dir(self) -> str:
        """The checkpoint directory (a root's `latest` resolved)."""
        return self._r.dir

    @property
    def step(self) -> int:
        return self._r.step

    @property
    def mode(self) -> str:
        """The sharding mode it was saved under: none, zero1, zero2 or zero3."""
        return self._summary["mesh"]["mode"]

    @property
    def mesh(self) -> Dict[str, Any]:
        """The mesh it was saved on (world_size, num_nodes, ranks_per_node, intra_shard, ...)."""
        return dict(self._summary["mesh"])

    @property
    def optimizer(self) -> Dict[str, Any]:
        """The optimizer settings saved with it (kind, lr, betas, eps, weight_decay, ...)."""
        return dict(self._summary["optimizer"])

    @property
    def units(self) -> List[Dict[str, Any]]:
        """The units (layers) with their parameters' names and shapes, and whether frozen."""
        return list(self._summary["units"])

    @property
    def parameters(self) -> Dict[str, CheckpointTensor]:
        """name -> CheckpointTensor (shape, numel, dtype 'float32', has_moments)."""
        return dict(self._by_name)

    @property
    def files(self) -> List[Dict[str, Any]]:
        """The data files: name, writing rank, bytes."""
        return [{k: f[k] for k in ("name", "rank", "bytes")} for f in self._summary["files"]]

    @property
    def checksums_ok(self) -> bool:
        """Whether every data file's xxHash64 holds (reads every byte of the checkpoint)."""
        return bool(self._r.summary(checksums=True)["checksums_ok"])

    def info(self, checksums: bool = False) -> Dict[str, Any]:
        """hsdp-ckpt inspect --json's object; with checksums=True every file is hashed."""
        return self._r.summary(checksums=checksums)

    def names(self) -> List[str]:
        """Every parameter's name, in unit and parameter order."""
        return [t.name for t in self._r.tensors]

    def keys(self) -> List[str]:
        return self.names()

    def __len__(self) -> int:
        return len(self._by_name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    # ---- tensors ----
    def tensor(self, name: str, *, state: str = "param", verify: bool = True,
               mmap: bool = True) -> np.ndarray:
        """One tensor, whole, as a float32 numpy array of the parameter's shape.

        state: "param" (the fp32 master), "exp_avg" or "exp_avg_sq" (Adam's moments).
        verify: check every chunk's xxHash64 (an error names the file and byte range).
        mmap: map the bytes in place when they are contiguous in one file (no copy).
        Raises NotFoundError (a KeyError) for a name the checkpoint lacks.
        """
        return self._r.tensor(name, state, verify, mmap)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.tensor(name)

    def optimizer_state(self, name: str, *, verify: bool = True) -> Dict[str, np.ndarray]:
        """Adam's moments of parameter `name`: {"exp_avg": ..., "exp_avg_sq": ...}.
        NotFoundError for a frozen unit's parameter (it has none)."""
        return {s: self._r.tensor(name, s, verify, True) for s in ("exp_avg", "exp_avg_sq")}

    def is_contiguous(self, name: str, state: str = "param") -> bool:
        """Whether tensor `name` lies in one data file as one run (read without a copy)."""
        return self._r.contiguous(name, state)

    def verify(self) -> None:
        """Recompute every data file's xxHash64; InvalidArgumentError names a failing file and
        the byte range of the first failing chunk."""
        self._r.verify()

    def to_dict(self) -> Dict[str, np.ndarray]:
        """Every parameter as a numpy array (a state dict)."""
        return {n: self[n] for n in self.names()}

    def __repr__(self) -> str:
        m = self._summary["mesh"]
        mode = repr(str(m["mode"]))[1:-1]  # escaped: a manifest's bytes never reach a terminal raw
        return (f"<hsdp.checkpoint.Checkpoint {self.dir!r} step {self.step}, {len(self)} tensors, "
                f"{mode} on {m['world_size']} ranks>")


def open(path: PathLike) -> Checkpoint:  # noqa: A001 (the module's verb, as in hsdp-ckpt)
    """Open the checkpoint at `path` (a checkpoint directory, or a root whose `latest` names one).
    Reads and checks the manifest only; tensors are read when asked for."""
    return Checkpoint(path)


def inspect(path: PathLike, checksums: bool = True) -> Dict[str, Any]:
    """hsdp-ckpt inspect --json: step, mode, mesh, units, files and (with checksums) whether every
    file's xxHash64 holds."""
    return _hsdp._inspect(_path(path), checksums)


def verify(path: PathLike) -> None:
    """hsdp-ckpt verify: raises InvalidArgumentError naming the first failing file and range."""
    _hsdp._verify(_path(path))


def reshard(src: PathLike, dst: PathLike, *, world: int, ranks_per_node: int, intra_shard: int,
            inter_shard: int, mode: str = "zero3") -> None:
    """hsdp-ckpt reshard: write `src` laid out for another mesh into the new directory `dst`
    (streaming; committed atomically). Loading `dst` on that mesh reads each rank's own chunks."""
    _hsdp._reshard(_path(src), _path(dst), world, ranks_per_node, intra_shard, inter_shard, mode)


def export_safetensors(src: PathLike, out: PathLike, *, dtype: str = "fp32",
                       max_shard_bytes: int = 4 << 30) -> List[str]:
    """hsdp-ckpt export: the full parameters as safetensors ("<unit>.<param>" names); above
    max_shard_bytes, HF-style shards plus an index. Returns the files written (index last)."""
    return _hsdp._export_safetensors(_path(src), _path(out), dtype, max_shard_bytes)


def diff(a: PathLike, b: PathLike) -> CheckpointDiff:
    """hsdp-ckpt diff: per tensor (parameters and moments) the max abs and rel difference."""
    return _hsdp._diff(_path(a), _path(b))
