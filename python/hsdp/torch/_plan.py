"""Which engine unit holds which parameter: the plan hsdp.torch.shard registers with the engine.

Each module of `units` is a group; the parameters no unit holds form the root group. A group is
one or more engine units (one flat padded buffer each): one for its trainable parameters, one for
its frozen ones (the engine freezes whole units), and the root group one per top-level child plus
the unit named "" for the model's own parameters (a bare nn.Parameter on it). An
engine unit is named by a module path and its parameters by their path below it, so that
"<unit>.<param>" -- the name checkpoints and exports carry -- is the parameter's state_dict name.
A parameter reachable under several names (GPT-2's tied lm_head / wte) is stored once, under its
first name, in the innermost group that holds every module using it.
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence, Union

import torch
from torch import nn

from .. import _errors

NoDecay = Union[None, Sequence[str], Callable[[str, nn.Parameter], bool]]


@dataclass
class PlannedParam:
    param: nn.Parameter
    name: str                 # the state_dict name it is stored under
    aliases: List[str]        # every other name of the same parameter
    rel: str = ""             # its name inside its engine unit
    decay: bool = True
    unit: int = -1            # engine unit index
    offset: int = 0           # flat offset in the unit (filled after finalize)
    shape: tuple = ()
    param_numel: int = 0


@dataclass
class EngineUnit:
    name: str
    frozen: bool
    params: List[PlannedParam] = field(default_factory=list)


@dataclass
class Group:
    module: nn.Module
    prefix: str                         # module path ("" for the root)
    is_root: bool
    units: List[int] = field(default_factory=list)
    params: List[PlannedParam] = field(default_factory=list)
    trainable: int = 0                  # parameters that get a gradient
    by_param: Dict[int, PlannedParam] = field(default_factory=dict)  # id(param) ->


class _Unnamed(Exception):
    """A parameter directly on a module whose name another engine unit has."""


def _bad(msg: str) -> Exception:
    return _errors.InvalidArgumentError(msg)


def _under(name: str, prefix: str) -> bool:
    return prefix == "" or name.startswith(prefix + ".")


def _module_path(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def _common_prefix(paths: List[str]) -> str:
    parts = [p.split(".") if p else [] for p in paths]
    out: List[str] = []
    for column in zip(*parts):
        if any(c != column[0] for c in column):
            break
        out.append(column[0])
    return ".".join(out)


def _split(params: List[PlannedParam], floor: str, taken: set) -> List[List]:
    """Engine units for `params` (all under module path `floor`): one named by their longest
    common module path when that name is free, else one per next path component below it."""
    name = _common_prefix([_module_path(p.name) for p in params])
    if name and name not in taken and (name == floor or _under(name, floor)):
        return [[name, params]]
    by_child: Dict[str, List[PlannedParam]] = {}
    for p in params:
        rest = p.name[len(name) + 1:] if name else p.name
        if "." not in rest:
            raise _Unnamed(p.name, name)
        child = (name + "." if name else "") + rest.split(".", 1)[0]
        by_child.setdefault(child, []).append(p)
    out = []
    for child, ps in by_child.items():
        out += _split(ps, child, taken) if child in taken else [[child, ps]]
    return out


def _join(eu: EngineUnit, pp: PlannedParam, index: int) -> None:
    pp.rel = pp.name[len(eu.name) + 1:] if eu.name else pp.name
    pp.unit = index
    eu.params.append(pp)


def _decays(no_decay: NoDecay) -> Callable[[str, nn.Parameter], bool]:
    if no_decay is None:
        return lambda name, p: True
    if callable(no_decay):
        return lambda name, p: not no_decay(name, p)
    names = set(no_decay)
    return lambda name, p: name not in names


def plan(model: nn.Module, units: Sequence[nn.Module], no_decay: NoDecay = None):
    """(groups, engine units, params) for `model` split into `units`; errors name the module or
    parameter and change nothing."""
    if not isinstance(model, nn.Module):
        raise _bad(f"model is a {type(model).__name__}, not a torch.nn.Module")
    paths: Dict[int, str] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(m), name)
    groups: List[Group] = [Group(model, "", True)]
    seen: Dict[int, int] = {}
    for i, u in enumerate(units):
        if not isinstance(u, nn.Module):
            raise _bad(f"units[{i}] is a {type(u).__name__}, not a torch.nn.Module")
        if id(u) not in paths:
            raise _bad(f"units[{i}] ({type(u).__name__}) is not a submodule of the model")
        if u is model:
            raise _bad(f"units[{i}] is the model itself: its parameters form the root unit; "
                       "list its submodules")
        if id(u) in seen:
            raise _bad(f"units[{i}] ('{paths[id(u)]}') is listed twice (also units[{seen[id(u)]}])")
        seen[id(u)] = i
        groups.append(Group(u, paths[id(u)], False))

    def innermost(name: str) -> int:
        best = 0
        for g, grp in enumerate(groups):
            if _under(name, grp.prefix) and len(grp.prefix) >= len(groups[best].prefix):
                best = g
        return best

    by_id: Dict[int, PlannedParam] = {}
    owners: Dict[int, List[int]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in by_id:
            by_id[id(p)].aliases.append(name)
        else:
            by_id[id(p)] = PlannedParam(p, name, [], shape=tuple(p.shape),
                                        param_numel=p.numel())
        owners.setdefault(id(p), []).append(innermost(name))
    if not by_id:
        raise _bad("the model has no parameters")
    decays = _decays(no_decay)
    for pid, pp in by_id.items():
        p = pp.param
        if p.dtype != torch.float32:
            raise _bad(f"parameter '{pp.name}' is {p.dtype}: hsdp keeps float32 masters (make the "
                       "model float32; param_dtype='bf16' gathers bf16)")
        if p.device.type not in ("cpu", "cuda"):
            raise _errors.UnimplementedError(
                f"parameter '{pp.name}' is on {p.device}: hsdp.torch runs models on the CPU or "
                "on a CUDA GPU (docs/torch.md, 'CUDA')")
        if p.numel() == 0:
            raise _bad(f"parameter '{pp.name}' has no elements")
        # Shared by modules of several groups: the innermost group holding all of them.
        gs = set(owners[pid])
        g = gs.pop() if len(gs) == 1 else max(
            (k for k, grp in enumerate(groups)
             if all(_under(groups[o].prefix, grp.prefix) or groups[o].prefix == grp.prefix
                    for o in owners[pid])),
            key=lambda k: len(groups[k].prefix))
        if g not in owners[pid]:  # two units, neither inside the other, share it
            a, b = sorted({groups[o].prefix for o in owners[pid]} - {groups[g].prefix})[:2]
            raise _bad(f"parameter '{pp.name}' is in two units, '{a}' and '{b}' (also named "
                       f"'{pp.aliases[0]}'): a shared parameter must belong to one unit, or to "
                       "the root (leave them out of units, or list a module holding both)")
        pp.decay = bool(decays(pp.name, p))
        groups[g].params.append(pp)
        groups[g].by_param[pid] = pp
        groups[g].trainable += 1 if p.requires_grad else 0

    engine_units: List[EngineUnit] = []
    reserved = {grp.prefix for grp in groups if grp.prefix}  # each group's own name
    used: set = set()
    for grp in groups:
        # The model's own parameters (a bare nn.Parameter on it: no module path to name a unit
        # by) form the root unit, the engine unit named "" (their names alone in checkpoints and
        # exports). Frozen ones beside trainable ones ride in it, as below.
        direct = [pp for pp in grp.params if grp.is_root and "." not in pp.name]
        direct_ids = {id(pp) for pp in direct}
        if direct:
            trainable = any(pp.param.requires_grad for pp in direct)
            eu = EngineUnit("", not trainable)
            for pp in direct:
                if trainable and not pp.param.requires_grad:
                    pp.decay = False
                _join(eu, pp, len(engine_units))
            used.add("")
            grp.units.append(len(engine_units))
            engine_units.append(eu)
        for frozen in (False, True):
            ps = [pp for pp in grp.params
                  if (not pp.param.requires_grad) == frozen and id(pp) not in direct_ids]
            if not ps:
                continue
            try:
                split = _split(ps, grp.prefix, used | (reserved - {grp.prefix}))
            except _Unnamed as e:
                if not frozen:
                    raise _bad(f"parameter '{e.args[0]}' sits directly on module "
                               f"'{e.args[1] or '<model>'}', whose name another unit has: "
                               "hsdp.torch cannot name its unit; move it into a submodule")
                # A frozen parameter beside trainable ones of its module rides in their unit:
                # its gradient stays zero and it has no weight decay, so Adam leaves it exactly
                # as it is (it is reduced and has moments, which a unit of its own avoids).
                for pp in ps:
                    home = [u for u in grp.units if _under(pp.name, engine_units[u].name)]
                    if not home:
                        raise _bad(f"frozen parameter '{pp.name}' sits directly on module "
                                   f"'{e.args[1] or '<model>'}', whose name another unit has: "
                                   "move it into a submodule")
                    pp.decay = False
                    best = max(home, key=lambda u: len(engine_units[u].name))
                    _join(engine_units[best], pp, best)
                continue
            for name, members in split:
                used.add(name)
                eu = EngineUnit(name, frozen)
                for pp in members:
                    _join(eu, pp, len(engine_units))
                grp.units.append(len(engine_units))
                engine_units.append(eu)
    groups = [g for g in groups if g.params or g.is_root]
    return groups, engine_units, [pp for grp in groups for pp in grp.params]
