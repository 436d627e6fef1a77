"""Elastic mode for hsdp.torch (docs/torch.md "Elastic mode", docs/elastic.md): the engine's
beginStep() as ShardedModule.begin_step(), and what the runtime does around it.

A process started by hsdp-elastic (its HSDP_ELASTIC_* variables) is one replica group of an
elastic job; its loop has the C++ loop's shape:

    while sharded.step_count < steps:
        start = sharded.begin_step()              # quorum, ring, heal; the step and data slot
        if start.step >= steps:
            break
        sharded.set_lr(schedule(start.step))
        model(slice start.slot of start.slots of step start.step's batch).backward()
        try:
            sharded.clip_grad_norm_(1.0)          # the quorum's average gradient's norm
            sharded.step()
        except hsdp.AbortedError:                 # the quorum did not commit: nothing applied
            continue                              # the same step again, from begin_step()

On an abort the runtime drops the step's state (reduced units, gradient views); after a heal it
rebinds the parameter views over the engine's buffers.
"""

import dataclasses
from typing import List, Tuple

from .. import _errors
from ._runtime import Runtime, TrainingState


@dataclasses.dataclass(frozen=True)
class StepStart:
    """What begin_step() says about the step to run (the engine's StepStart).

    step: the step to run (the job's committed step count; the schedule and the batch follow it).
    attempt: the step's attempt (a step run again after an abort has a new one).
    group: this group's index; present: the groups of the step's quorum.
    slot, slots: train on slice `slot` of `slots` equal parts of the step's global batch
        (elastic_data "keep": slot = the group's index of the job's groups; "redistribute": its
        place among the groups present). Without elastic mode: slot 0 of 1.
    healed, healed_from: this group received its state (parameters, Adam's moments, the step
        count) from group healed_from before this step; heal_bytes / heal_seconds: what this
        rank received (healed) or sent (donor) for heals.
    """

    step: int
    attempt: int
    group: int
    present: Tuple[int, ...]
    slot: int
    slots: int
    healed: bool
    healed_from: int
    heal_bytes: int
    heal_seconds: float

    def batch_slice(self, global_batch: int) -> slice:
        """This group's rows of a global batch of `global_batch` rows (it must split into
        `slots` equal parts)."""
        if global_batch % self.slots:
            raise _errors.InvalidArgumentError(
                f"global batch {global_batch} does not split into {self.slots} group slots")
        n = global_batch // self.slots
        return slice(self.slot * n, (self.slot + 1) * n)


def begin_step(sharded) -> StepStart:
    """ShardedModule.begin_step(): the engine's beginStep between steps, then the views rebound
    after a heal."""
    rt: Runtime = sharded._rt
    if rt.state != TrainingState.IDLE or rt.final_queued:
        raise _errors.FailedPreconditionError(
            "begin_step() during forward or backward: call it before the step's forward")
    if rt.reduced:
        raise _errors.FailedPreconditionError(
            f"begin_step() after a backward that was not stepped ({len(rt.reduced)} units hold "
            "a reduced gradient): call step() first")
    d = sharded._e.begin_step()
    d["present"] = tuple(d["present"])
    start = StepStart(**d)
    if start.healed:
        rebind(sharded)
    return start


def rebind(sharded) -> None:
    """After a heal: every parameter view points at the engine's live buffers again. The heal
    writes the masters and Adam's moments in place and zero1/zero2 gather the whole parameters
    into the buffers they had (nothing is reallocated today), so this re-reads the engine's views
    rather than trusting that: a unit kept whole (zero1/zero2, the root group) is gathered and its
    parameters rebound; zero3 units hold no view between steps (each forward binds them)."""
    rt: Runtime = sharded._rt
    rt.grad_flat.clear()
    sharded._refresh()


def drop_step(rt: Runtime) -> None:
    """After a step the quorum did not commit (AbortedError from step() or clip_grad_norm_):
    the engine dropped every unit's gradient; the runtime forgets what it knew of them, so the
    step's forward and backward run again from begin_step() as a fresh step."""
    rt.reduced.clear()
    rt.grad_flat.clear()
    for g in rt.groups:
        for pp in g.params:
            pp.param.grad = None


def membership(sharded, steps: int) -> List[List[int]]:
    """Collective over the group: for each of steps [0, steps), the groups whose quorum
    committed it (what a reference replays)."""
    if not sharded._e.elastic:
        raise _errors.FailedPreconditionError(
            "elastic_membership(): elastic mode is off (start the job with hsdp-elastic)")
    return [list(m) for m in sharded._e.elastic_membership(int(steps))]
