"""The schedule, driven by autograd: module hooks call the engine's verbs.

    root pre-forward     unshard + wait the root group, prefetch the first unit
    unit pre-forward     unshard + wait (prefetched: only the wait), prefetch the next units
    unit post-forward    zero3: reshard; a hook on its outputs for backward
    output grad hook     (pre-backward) unshard + wait again, prefetch the unit before it,
                         point .grad of its parameters at the engine's gradient buffer
    post-accumulate      when every trainable parameter of the unit has its gradient: reduce it
                         (the reduce-scatter runs while earlier units compute) and reshard
    end of backward      reduce what had no gradient (unused parameters), reshard the rest

Parameters are torch tensors viewing the engine's gathered buffer (no copy); gradients
accumulate straight into the engine's full-gradient buffer. zero3 frees a unit's buffer after
forward and gathers it again, maybe at another address, for backward: tensors autograd saved from
it are kept as (unit, offset, shape, strides) by a saved-tensors hook and rebuilt over the new
buffer when backward unpacks them.
"""

import enum
from typing import Dict, List, Optional

import torch
import torch.utils._pytree as pytree

from ._plan import EngineUnit, Group


class TrainingState(enum.Enum):
    IDLE = "idle"                # between steps, or between forward and backward
    FORWARD = "forward"          # inside the root's forward
    BACKWARD = "backward"        # inside autograd's backward


class _Saved:
    """A tensor autograd saved that views a gathered unit: rebuilt from the unit's buffer."""

    __slots__ = ("unit", "offset", "shape", "stride")

    def __init__(self, unit, offset, shape, stride):
        self.unit, self.offset, self.shape, self.stride = unit, offset, shape, stride


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class Runtime:
    def __init__(self, engine, groups: List[Group], units: List[EngineUnit], zero3: bool,
                 prefetch: int):
        self.e = engine
        self.groups = groups
        self.units = units
        self.zero3 = zero3
        self.prefetch = prefetch
        self.state = TrainingState.IDLE
        self.sync = True                       # False inside no_sync(): no reduction
        self.flat: Dict[int, torch.Tensor] = {}        # unit -> gathered buffer (a view)
        self.grad_flat: Dict[int, torch.Tensor] = {}   # unit -> full gradient buffer (a view)
        self.live: Dict[int, int] = {}         # data_ptr of a gathered buffer -> unit
        self.gstate: Dict[int, str] = {id(g): "resharded" for g in groups}
        self.order: List[Group] = []           # the units' forward order, last iteration
        self.seen: List[Group] = []            # ... this iteration
        self.ready: Dict[int, int] = {}        # group -> params with their gradient this backward
        self.done: set = set()                 # groups reduced this backward
        self.final_queued = False
        self.reduced = set()                   # engine units reduced since the last step
        self.bytes_copied = 0                  # gradient bytes copied in (not accumulated in place)
        self.hooks_pushed: Optional[torch.autograd.graph.saved_tensors_hooks] = None
        self.group_of: Dict[int, Group] = {}
        self.empty = torch.empty(0)
        # How torch sees the engine's buffers: host memory through numpy here; on a CUDA mesh
        # _cuda.attach() puts device tensors, the model's device and torch's stream in place.
        self.params_tensor = lambda u: torch.from_numpy(engine.params_view(u))
        self.grads_tensor = lambda u: torch.from_numpy(engine.grads_view(u))
        self.follow_stream = None
        for g in groups:
            for pp in g.params:
                self.group_of[id(pp.param)] = g

    # ---- the verbs, per group ----
    def unshard(self, g: Group) -> None:
        if self.gstate[id(g)] == "resharded":
            for u in g.units:
                self.e.unshard(u)
            self.gstate[id(g)] = "unsharding"

    def wait(self, g: Group) -> None:
        self.unshard(g)
        if self.gstate[id(g)] != "unsharding":
            return
        for u in g.units:
            self.e.wait_for_unshard(u)
            flat = self.params_tensor(u)
            self.flat[u] = flat
            self.live[flat.data_ptr()] = u
            for pp in self.units[u].params:
                pp.param.data = flat[pp.offset:pp.offset + pp.param_numel].view(pp.shape)
        self.gstate[id(g)] = "unsharded"

    def reshard(self, g: Group) -> None:
        if self.gstate[id(g)] == "resharded":
            return
        for u in g.units:
            f = self.flat.pop(u, None)
            if f is not None:
                self.live.pop(f.data_ptr(), None)
            if self.zero3:  # the buffer goes back to the pool: nothing may read it
                for pp in self.units[u].params:
                    pp.param.data = self.empty
            self.e.reshard(u)
        self.gstate[id(g)] = "resharded"

    def bind_grads(self, g: Group) -> None:
        """Point .grad of the group's trainable parameters at the engine's gradient buffer:
        autograd then adds each gradient into it in place (AccumulateGrad's += on an existing
        .grad), the engine's copy-in without a copy."""
        for u in g.units:
            if self.units[u].frozen:
                continue
            if u not in self.grad_flat:
                self.grad_flat[u] = self.grads_tensor(u)
            gf = self.grad_flat[u]
            for pp in self.units[u].params:
                if not pp.param.requires_grad:  # frozen, riding in a trainable unit
                    continue
                view = gf[pp.offset:pp.offset + pp.param_numel].view(pp.shape)
                if pp.param.grad is None or pp.param.grad.data_ptr() != view.data_ptr():
                    if pp.param.grad is not None:  # a gradient torch kept: add it in
                        view.add_(pp.param.grad)
                        self.bytes_copied += view.numel() * 4
                    pp.param.grad = view

    def reduce(self, g: Group) -> None:
        for u in g.units:
            if self.units[u].frozen:
                continue
            if u not in self.grad_flat:  # no gradient reached it: reduce zeros (engine-zeroed)
                self.grad_flat[u] = self.grads_tensor(u)
            for pp in self.units[u].params:
                pp.param.grad = None
            del self.grad_flat[u]
            self.e.reduce_grad(u)
            self.reduced.add(u)

    def sync_stream(self) -> None:
        """On a CUDA mesh, between steps (no unit gathered): torch's current stream becomes the
        engine's compute stream."""
        if self.follow_stream is not None and all(v == "resharded" for v in self.gstate.values()):
            self.follow_stream()

    # ---- forward ----
    def root_pre_forward(self, module, args, kwargs):
        if _in_backward():  # a re-run forward (reentrant activation checkpointing)
            self.wait(self.groups[0])
            return None
        self.sync_stream()
        self.state = TrainingState.FORWARD
        self.seen = []
        if self.zero3 and self.hooks_pushed is None:
            self.hooks_pushed = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
            self.hooks_pushed.__enter__()
        self.wait(self.groups[0])
        if self.order:
            for g in self.order[:self.prefetch]:
                self.unshard(g)
        return None

    def root_post_forward(self, module, args, kwargs, output):
        if _in_backward():
            return None
        self.pop_hooks()
        self.state = TrainingState.IDLE
        if self.seen:
            self.order = self.seen
        if torch.is_grad_enabled() and self.register_pre_backward(self.groups[0], output):
            return None
        for g in self.groups:  # evaluation (no backward follows): free everything
            self.reshard(g)
        return None

    def pop_hooks(self) -> None:
        if self.hooks_pushed is not None:
            self.hooks_pushed.__exit__(None, None, None)
            self.hooks_pushed = None

    def pre_forward(self, g: Group):
        if _in_backward():
            self.wait(g)
            return
        if self.state != TrainingState.FORWARD:  # the unit called outside the model's forward
            self.wait(g)
            return
        self.seen.append(g)
        self.unshard(g)
        if self.order:
            i = len(self.seen) - 1
            for nxt in self.order[i + 1:i + 1 + self.prefetch]:
                self.unshard(nxt)
        self.wait(g)

    def post_forward(self, g: Group, output) -> None:
        if _in_backward():
            return
        registered = torch.is_grad_enabled() and self.register_pre_backward(g, output)
        if self.zero3 or not registered:
            self.reshard(g)

    def register_pre_backward(self, g: Group, output) -> bool:
        tensors = [t for t in pytree.tree_flatten(output)[0]
                   if isinstance(t, torch.Tensor) and t.requires_grad]
        for t in tensors:
            t.register_hook(lambda grad, g=g: self.pre_backward(g))
        return bool(tensors)

    # ---- backward ----
    def pre_backward(self, g: Group) -> None:
        if not self.final_queued:
            self.final_queued = True
            self.state = TrainingState.BACKWARD
            torch.autograd.Variable._execution_engine.queue_callback(self.post_backward_final)
        if id(g) in self.ready or id(g) in self.done:  # one hook per output tensor: once
            return
        self.ready.setdefault(id(g), 0)
        self.wait(g)
        # Prefetch the unit backward reaches next (the one before it in forward order).
        if g in self.order:
            i = self.order.index(g)
            for prev in reversed(self.order[max(0, i - self.prefetch):i]):
                self.unshard(prev)
        self.bind_grads(g)

    def post_accumulate(self, p: torch.nn.Parameter) -> None:
        g = self.group_of[id(p)]
        if id(g) in self.done:
            return
        if id(g) not in self.ready:  # no pre-backward hook saw it (used outside its unit)
            self.ready[id(g)] = 0
            self.wait(g)
            self.bind_grads(g)
        elif p.grad is not None:
            self.adopt_grad(g, p)
        self.ready[id(g)] += 1
        if self.ready[id(g)] == g.trainable:
            self.finish(g)

    def adopt_grad(self, g: Group, p) -> None:
        pp = g.by_param[id(p)]
        gf = self.grad_flat.get(pp.unit)
        if gf is None:
            self.bind_grads(g)
            return
        view = gf[pp.offset:pp.offset + pp.param_numel].view(pp.shape)
        if p.grad.data_ptr() != view.data_ptr():
            # Autograd replaced .grad by old + new out of place (create_graph=True): ours is old.
            view.copy_(p.grad)
            self.bytes_copied += view.numel() * 4
            p.grad = view

    def finish(self, g: Group) -> None:
        self.done.add(id(g))
        if self.sync:
            self.reduce(g)
        self.reshard(g)

    def post_backward_final(self) -> None:
        for g in self.groups:
            if id(g) not in self.done and g.trainable:
                if id(g) not in self.ready:  # no gradient at all: still one for the step
                    self.wait(g)
                    self.bind_grads(g)
                self.done.add(id(g))
                if self.sync:
                    self.reduce(g)
        for g in self.groups:
            self.reshard(g)
        self.ready.clear()
        self.done.clear()
        self.final_queued = False
        self.state = TrainingState.IDLE

    # ---- saved tensors of zero3 units ----
    def pack(self, t: torch.Tensor):
        if t.device != self.empty.device or not self.live:
            return t
        u = self.live.get(t.untyped_storage().data_ptr())
        if u is None:
            return t
        return _Saved(u, t.storage_offset(), tuple(t.shape), t.stride())

    def unpack(self, x):
        if not isinstance(x, _Saved):
            return x
        if x.unit not in self.flat:  # backward reached it before its pre-backward hook
            g = next(g for g in self.groups if x.unit in g.units)
            self.wait(g)
        return self.flat[x.unit].as_strided(x.shape, x.stride, x.offset)
