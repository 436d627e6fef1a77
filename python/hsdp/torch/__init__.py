"""PyTorch models on hsdp: shard any nn.Module on hsdp's engine, FSDP2-style.

    import hsdp, hsdp.torch
    session = hsdp.Session.init()                         # under mpirun / srun --mpi=pmix
    mesh = session.mesh(intra_shard=4, inter_shard=1)
    sharded = hsdp.torch.shard(model, mesh, units=list(model.transformer.h), mode="zero3",
                               optimizer=dict(kind="adamw", lr=3e-4, weight_decay=0.1))
    for batch in loader:
        model(**batch).loss.backward()                    # gathers, reductions: hooks
        sharded.step()                                    # hsdp's Adam/AdamW on the shards
    sharded.save("ckpt")                                  # hsdp-ckpt and hsdp.checkpoint read it
    sharded.export_safetensors("model.safetensors")       # from_pretrained loads it

The engine (libhsdp) holds the shards, the gathered units and the gradients; the model's
parameters view the engine's memory. Guide: docs/torch.md.
"""

import contextlib
import hashlib
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch
from torch import nn

from .. import _errors, _hsdp
from ..collectives import Mesh
from . import _elastic
from ._elastic import StepStart
from . import _cuda
from ._plan import NoDecay, plan
from ._runtime import Runtime, TrainingState

__all__ = ["shard", "ShardedModule", "TrainingState", "StepStart"]

_OPTIMIZER_KEYS = {"kind", "lr", "betas", "eps", "weight_decay"}


def _digest(t: torch.Tensor) -> int:
    h = hashlib.blake2b(t.detach().cpu().contiguous().numpy().tobytes(), digest_size=8).digest()
    return int.from_bytes(h, "little", signed=True)


class ShardedModule:
    """A model sharded by hsdp.torch.shard: its optimizer, checkpoints and exports. The model
    itself is still called as before; hooks do the gathering and the reductions."""

    def __init__(self, model: nn.Module, engine, groups, units, params, runtime: Runtime,
                 mesh: Mesh):
        self.module = model
        self._e = engine
        self._groups, self._units, self._params = groups, units, params
        self._rt = runtime
        self._mesh = mesh
        self._clip = 0.0

    # ---- training ----
    def step(self) -> None:
        """hsdp's Adam/AdamW on every shard (with offload, the CPU Adam): waits for the pending
        reductions, clips (clip_grad_norm_), steps. Raises FailedPreconditionError when a unit
        had no backward since the last step. Elastic mode: AbortedError when the quorum did not
        commit the step (nothing applied; run it again from begin_step())."""
        self._check_reduced("step")
        self._rt.sync_stream()
        try:
            self._e.step()
        except _errors.AbortedError:
            _elastic.drop_step(self._rt)
            raise
        self._rt.reduced.clear()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip the global gradient norm (over every shard and replica) to max_norm; 0 turns
        clipping off. Returns the total norm before clipping as a float32 scalar tensor on the
        model's device, the same on every rank, as torch.nn.utils.clip_grad_norm_ and FSDP2 do.
        Call it after backward and before step(): it waits for the pending reductions (step() would wait for
        them anyway) and the norm is computed once, over the reduced shards; step() scales the
        gradient by max_norm / (norm + 1e-6) when that is below 1, inside its Adam pass. With
        offload="cpu" give clip_norm= to shard() (units without clipping step during backward).
        Elastic mode: the norm of the quorum's average gradient, so the quorum decides the step
        here (step() then applies it): AbortedError when it did not commit, as from step()."""
        max_norm = float(max_norm)
        self._check_reduced("clip_grad_norm_")
        self._rt.sync_stream()
        if max_norm != self._clip:
            self._e.set_clip_norm(max_norm)
            self._clip = max_norm
        try:
            norm = self._e.grad_norm()
        except _errors.AbortedError:
            _elastic.drop_step(self._rt)
            raise
        # On the model's device, as torch.nn.utils.clip_grad_norm_ returns it (a CUDA mesh: the
        # gradients' device; host memory otherwise).
        return torch.tensor(norm, dtype=torch.float32, device=self._rt.empty.device)

    def _check_reduced(self, what: str) -> None:
        if self._rt.state != TrainingState.IDLE:
            raise _errors.FailedPreconditionError(
                f"{what}() inside the model's {self._rt.state.value}: call it after backward")
        missing = [self._units[u].name or "<root>" for u in range(len(self._units))
                   if not self._units[u].frozen and u not in self._rt.reduced]
        if missing:
            raise _errors.FailedPreconditionError(
                f"{what}() without a backward: unit '{missing[0]}' has no reduced gradient since "
                f"the last step ({len(missing)} of {len(self._units)} units; inside no_sync() "
                "nothing is reduced)")

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next step() (with offload="cpu" and no clipping, units step
        during backward: set it before backward)."""
        lr = float(lr)
        if lr != self._e.lr:
            self._e.set_lr(lr)

    @property
    def lr(self) -> float:
        return self._e.lr

    @property
    def last_grad_norm(self) -> float:
        """The global gradient norm of the last step() (before clipping; what clip_grad_norm_
        returned when it was called)."""
        return self._e.last_grad_norm

    @property
    def step_count(self) -> int:
        return self._e.step_count

    # ---- elastic mode (docs/torch.md "Elastic mode"; hsdp-elastic's environment turns it on) ----
    @property
    def elastic(self) -> bool:
        """True when this process is one replica group of an elastic job (started by
        hsdp-elastic: HSDP_ELASTIC_ENDPOINT and the group's index and count are set)."""
        return self._e.elastic

    def begin_step(self) -> StepStart:
        """Collective over the group, before each step's forward: joins the step's quorum, and
        heals this group (parameters, Adam's moments, step count from a healthy group) when it
        (re)joined or missed a committed step. Returns the step to run and the data slot to
        train on (StepStart). Without elastic mode: step_count, slot 0 of 1, no communication."""
        return _elastic.begin_step(self)

    def elastic_membership(self, steps: int) -> List[List[int]]:
        """Collective over the group: the groups whose quorum committed each of steps
        [0, steps), what a reference replays (elastic mode only)."""
        return _elastic.membership(self, steps)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation: backward passes inside add into the unsharded gradients and
        reduce nothing; the first backward outside reduces the sum (as DDP/FSDP's no_sync)."""
        prev = self._rt.sync
        self._rt.sync = False
        try:
            yield
        finally:
            self._rt.sync = prev

    def stats(self) -> Dict[str, Any]:
        """Since the last call: seconds blocked on communication (exposed), gradient bytes copied
        instead of accumulated in place; and the engine's memory report (bytes per rank)."""
        out = {"exposed_comm_s": self._e.take_exposed_comm_seconds(),
               "bytes_copied": self._rt.bytes_copied,
               "memory": self._e.memory_report()}
        total, exposed = self._e.take_optimizer_seconds()
        out["optimizer_s"], out["optimizer_exposed_s"] = total, exposed
        self._rt.bytes_copied = 0
        return out

    # ---- state ----
    def full_state_dict(self) -> Dict[str, torch.Tensor]:
        """Collective over the shard group: every stored parameter whole, by state_dict name
        (fp32 masters; new tensors)."""
        out: Dict[str, torch.Tensor] = {}
        for u, eu in enumerate(self._units):
            flat = torch.from_numpy(self._e.gather_full(u))
            for pp in eu.params:
                out[pp.name] = flat[pp.offset:pp.offset + pp.param_numel].view(pp.shape).clone()
        return out

    def save(self, root: str, *, name: str = "", keep_last: int = 0) -> Dict[str, Any]:
        """Collective: hsdp's sharded checkpoint <root>/<name> (default step-<8 digits>) and
        <root>/latest, as ShardedModel::save (hsdp-ckpt and hsdp.checkpoint read it). Returns
        dir, step, bytes, seconds, and in elastic mode whether this group wrote it (`written`;
        one group of the committed quorum does, `writer_group`: docs/elastic.md)."""
        self._idle("save")
        return self._e.save(str(root), name, keep_last)

    def load(self, path: str, *, optimizer_state: bool = True) -> Dict[str, Any]:
        """Collective: a checkpoint saved on any mesh and mode (resharded on the fly) into this
        model: parameters and, by default, Adam's moments, the step count and settings."""
        self._idle("load")
        r = self._e.load(str(path), optimizer_state)
        self._refresh()
        return r

    def export_safetensors(self, out: str, *, dtype: str = "float32") -> List[str]:
        """Collective: the full parameters as safetensors by state_dict name, written by rank 0
        (HF shards and an index above 4 GiB); from_pretrained loads it (tied weights once)."""
        self._idle("export_safetensors")
        return self._e.export_safetensors(str(out), dtype)

    def close(self) -> None:
        """Free the engine's memory; the model's parameters become empty."""
        for pp in self._params:
            pp.param.data = torch.empty(0)
            pp.param.grad = None
        self._e.close()

    def _idle(self, what: str) -> None:
        if self._rt.state != TrainingState.IDLE or self._rt.final_queued:
            raise _errors.FailedPreconditionError(f"{what}() during forward or backward")

    def _refresh(self) -> None:
        """After a load: the views of modes that keep parameters whole are rebound."""
        if not self._rt.zero3:
            for g in self._groups:
                self._rt.wait(g)
                self._rt.reshard(g)

    def __repr__(self) -> str:
        n = sum(pp.param_numel for pp in self._params)
        return (f"<hsdp.torch.ShardedModule {type(self.module).__name__}: {n} parameters in "
                f"{len(self._units)} units, {self._e.mode}, {self._e.shard_count} shards>")


def _settings(mode, optimizer, param_dtype, reduce_dtype, offload, hpz, clip_norm, wires,
              max_gathered, timeout_s):
    s = _hsdp.EngineSettings()
    s.mode = mode
    opt = dict(optimizer or {})
    unknown = set(opt) - _OPTIMIZER_KEYS
    if unknown:
        raise _errors.InvalidArgumentError(
            f"optimizer key '{sorted(unknown)[0]}' is not one of {sorted(_OPTIMIZER_KEYS)}")
    s.optimizer = str(opt.get("kind", "adamw"))
    s.lr = float(opt.get("lr", 1e-3))
    betas = opt.get("betas", (0.9, 0.999))
    s.beta1, s.beta2 = float(betas[0]), float(betas[1])
    s.eps = float(opt.get("eps", 1e-8))
    s.weight_decay = float(opt.get("weight_decay", 0.01 if s.optimizer == "adamw" else 0.0))
    s.param_dtype, s.reduce_dtype = param_dtype, reduce_dtype
    if offload not in (None, "cpu"):
        raise _errors.InvalidArgumentError(f"offload '{offload}': expected None or 'cpu'")
    s.offload_cpu = offload == "cpu"
    s.hpz = bool(hpz)
    s.clip_norm = float(clip_norm)
    for k, v in (wires or {}).items():
        if k not in ("inter_param_wire", "inter_grad_wire", "replica_wire", "quant_block"):
            raise _errors.InvalidArgumentError(f"wires key '{k}' is not one of inter_param_wire, "
                                               "inter_grad_wire, replica_wire, quant_block")
        setattr(s, k, v)
    s.max_gathered_units = int(max_gathered)
    s.timeout_s = timeout_s
    return s


def shard(model: nn.Module, mesh: Mesh, *, units: Sequence[nn.Module] = (), mode: str = "zero3",
          param_dtype: str = "float32", reduce_dtype: str = "float32",
          offload: Optional[str] = None, optimizer: Optional[Dict[str, Any]] = None,
          no_decay: NoDecay = None, clip_norm: float = 0.0, hpz: bool = False,
          wires: Optional[Dict[str, Any]] = None, prefetch: int = 1, max_gathered: int = 0,
          timeout_s: Optional[float] = None,
          elastic_data: Optional[str] = None) -> ShardedModule:
    """Shard `model` over `mesh` on hsdp's engine (collective over the job).

    units: submodules that each become an hsdp unit, gathered just in time (a transformer's
        blocks); the parameters left over form the root unit, gathered for the whole step.
    mode: none, zero1, zero2, zero3. param_dtype / reduce_dtype: float32 or bf16.
    offload: None or "cpu" (the optimizer state in host memory, stepped by the CPU Adam while
        backward runs). hpz: ZeRO++'s secondary partition (zero3, intra and inter > 1).
    optimizer: kind ("adamw" or "adam"), lr, betas, eps, weight_decay -- torch.optim.AdamW's
        defaults and semantics (decay applies to every parameter not named by no_decay: a list
        of state_dict names, or a predicate (name, param) -> True to exclude).
    wires: inter_param_wire, inter_grad_wire, replica_wire (fp32, bf16, int8, int4),
        quant_block. prefetch: units gathered ahead. timeout_s: the watchdog's limit.
    elastic_data: under hsdp-elastic (elastic mode), which data a group trains on while groups
        are missing: "keep" (its own slice; default) or "redistribute" (the groups present share
        the whole batch); default HSDP_ELASTIC_DATA. Elastic mode itself is the launcher's.

    The model's current values are the initial weights; they must be equal on every rank
    (checked). Errors name the module or parameter, on every rank; the model is then unchanged.
    """
    if getattr(model, "_hsdp_sharded", None) is not None:
        raise _errors.FailedPreconditionError(
            f"{type(model).__name__} is already sharded by hsdp.torch (once per model: its "
            "parameters live in that engine)")
    if not isinstance(mesh, Mesh):
        raise _errors.InvalidArgumentError(f"mesh is a {type(mesh).__name__}, not an hsdp.Mesh")
    if int(prefetch) < 0:
        raise _errors.InvalidArgumentError(f"prefetch {prefetch} must be >= 0")
    groups, units_, params = plan(model, list(units), no_decay)
    device = _cuda.placement(params, mesh)  # None: host memory
    settings = _settings(mode, optimizer, param_dtype, reduce_dtype, offload, hpz, clip_norm,
                         wires, max_gathered, timeout_s)
    settings.elastic_data = elastic_data
    engine = _hsdp.ShardedModel.create(mesh._m, settings)
    try:
        for eu in units_:
            # A 0-dim parameter (a scalar temperature) is one element of shape [1] to the engine
            # (its checkpoints and exports); the model keeps viewing it as shape ().
            engine.add_unit(eu.name, [(pp.rel, list(pp.shape) or [1], pp.decay)
                                      for pp in eu.params],
                            eu.frozen)
        engine.finalize()
        differ = engine.agree_digests([_digest(pp.param) for pp in params])
        for pp, r in zip(params, differ):
            if r >= 0:
                raise _errors.InvalidArgumentError(
                    f"parameter '{pp.name}' differs between rank 0 and rank {r}: every rank must "
                    "start from the same weights (seed the init, or load the same checkpoint)")
        for u, eu in enumerate(units_):
            offsets = {name: off for name, _, off in engine.unit_params(u)}
            for pp in eu.params:
                pp.offset = offsets[pp.rel]
                engine.set_parameter(u, pp.rel,
                                     pp.param.detach().cpu().contiguous().numpy().ravel())
    except BaseException:
        engine.close()
        raise
    rt = Runtime(engine, groups, units_, zero3=(mode == "zero3"), prefetch=int(prefetch))
    if device is not None:
        _cuda.attach(rt, engine, device)
    sharded = ShardedModule(model, engine, groups, units_, params, rt, mesh)
    sharded._clip = float(clip_norm)
    for pp in params:
        pp.param.grad = None
    _install_hooks(model, groups, params, rt)
    model._hsdp_sharded = sharded
    if rt.zero3:
        for pp in params:
            pp.param.data = rt.empty
    else:
        sharded._refresh()  # the parameters view the engine's whole copies from now on
    return sharded


def _install_hooks(model: nn.Module, groups, params, rt: Runtime) -> None:
    model.register_forward_pre_hook(rt.root_pre_forward, prepend=True, with_kwargs=True)
    model.register_forward_hook(rt.root_post_forward, with_kwargs=True, always_call=True)
    for g in groups[1:]:
        g.module.register_forward_pre_hook(lambda m, a, g=g: rt.pre_forward(g), prepend=True)
        g.module.register_forward_hook(lambda m, a, out, g=g: rt.post_forward(g, out))
    for pp in params:
        if pp.param.requires_grad:
            pp.param.register_post_accumulate_grad_hook(rt.post_accumulate)
