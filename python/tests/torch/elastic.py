"""hsdp.torch in elastic mode, one replica group of a job hsdp-elastic started (elastic_test.sh
kills a rank of one group mid-run and the launcher restarts it): the hand-written MLP of
models.py sharded over the group's ranks, trained with the loop of docs/torch.md "Elastic mode"
(begin_step, the step's data slot, clip_grad_norm_ and step, the step again on AbortedError).

At the end every rank replays, in plain PyTorch, the membership the quorums committed (which
groups each committed step averaged, each on its own slot of the step's global batch): the
reference's gradient of step s is the mean over the present groups of each group's mean gradient
over its slice, clipped by torch.nn.utils.clip_grad_norm_, stepped by torch.optim.AdamW. Every
parameter of the group must equal the reference's (max |a-b| / max |b| per tensor) within the
torch parity tests' tolerance (1e-5), and so must, for every step this group committed, the norm
clip_grad_norm_ returned and the group's loss (against the reference's loss on its slice).

    hsdp-elastic --groups 3 --np 2 -- run.sh BUILD --torch elastic.py --steps 40 [--mode zero2]

Prints (rank 0 of each group) "elastic: step S attempt A: groups ... present", "elastic: group G
healed to step S from group D", "elastic: step S attempt A not committed", and the verdict
"parity vs plain PyTorch (replayed membership ...): ... PASS|FAIL".
"""

import argparse
import copy
import os
import time

import mpi4py

mpi4py.rc.initialize = False  # hsdp.Session.init() starts MPI, with hsdp's Open MPI tuning
from mpi4py import MPI  # noqa: E402

import torch  # noqa: E402

import hsdp  # noqa: E402
import hsdp.torch  # noqa: E402
from models import batch_loss, build, global_batch, no_decay_names, rel, verdict  # noqa: E402

HP = dict(kind="adamw", lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
TOL = 1e-5  # parity.py's fp32 tolerance


def lr_at(step: int) -> float:
    return HP["lr"] * min(1.0, (step + 1) / 5)  # a warm-up: a healed group follows the step


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="zero3")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=24, help="the global batch of every step")
    ap.add_argument("--clip", type=float, default=0.5, help="below the norms: every step clips")
    ap.add_argument("--degraded-sleep", type=float, default=2.0,
                    help="seconds each step waits while a group is missing, so that the "
                         "restarted group rejoins (and heals) before the others finish")
    a = ap.parse_args()
    torch.set_num_threads(1)
    session = hsdp.Session.init()
    comm = MPI.COMM_WORLD  # this group's ranks (one mpirun per group)
    rank, size = comm.Get_rank(), comm.Get_size()

    torch.manual_seed(1234)
    model = build("mlp")
    init = copy.deepcopy(model)
    nd = no_decay_names(model)
    mesh = session.mesh(intra_shard=size, inter_shard=1)  # the groups are the replicas
    sharded = hsdp.torch.shard(model, mesh, units=list(model.blocks), mode=a.mode, optimizer=HP,
                               no_decay=nd)
    if not sharded.elastic:
        raise SystemExit("elastic.py runs under hsdp-elastic (HSDP_ELASTIC_* unset)")
    groups = int(os.environ["HSDP_ELASTIC_GROUPS"])  # hsdp-elastic sets it

    norms, losses, healed = {}, {}, None
    aborted = 0
    while sharded.step_count < a.steps:
        start = sharded.begin_step()
        if rank == 0:
            print(f"elastic: step {start.step} attempt {start.attempt}: groups "
                  f"{','.join(map(str, start.present))} present (this is group {start.group})",
                  flush=True)
        if start.healed:
            healed = start
            if rank == 0:
                print(f"elastic: group {start.group} healed to step {start.step} from group "
                      f"{start.healed_from}: {start.heal_bytes} bytes per rank in "
                      f"{start.heal_seconds:.3f} s", flush=True)
            check_views(sharded)
        if start.step >= a.steps:
            break
        if len(start.present) < groups:
            time.sleep(a.degraded_sleep)
        sharded.set_lr(lr_at(start.step))
        mine = global_batch("mlp", start.step, a.batch)[start.batch_slice(a.batch)]
        per = mine.shape[0] // size
        loss = batch_loss(model, "mlp", mine[rank * per:(rank + 1) * per])
        loss.backward()
        try:
            norm = sharded.clip_grad_norm_(a.clip)
            sharded.step()
        except hsdp.AbortedError as e:
            aborted += 1
            if rank == 0:
                print(f"elastic: step {start.step} attempt {start.attempt} not committed; "
                      f"running it again ({e})", flush=True)
            continue
        norms[start.step] = norm.item()
        losses[start.step] = comm.allreduce(loss.item(), op=MPI.SUM) / size
        if rank == 0:
            print(f"step {start.step + 1}/{a.steps} loss {losses[start.step]:.6f} "
                  f"grad_norm {norms[start.step]:.6f}", flush=True)

    members = sharded.elastic_membership(a.steps)
    full = sharded.full_state_dict()
    want, ref_norms, ref_losses = replay(init, nd, members, groups, a, one_at_a_time=False)
    other, _, _ = replay(init, nd, members, groups, a, one_at_a_time=True)
    # As parity.py: within the tolerance, or 10x the distance between two plain runs that differ
    # only in summation order (Adam turns a gradient's rounding into up to lr a step).
    worst = max(rel(full[n], want[n]) / max(TOL, 10 * rel(other[n], want[n])) for n in want)
    norm_err = max((abs(norms[s] - ref_norms[s]) / ref_norms[s] for s in norms), default=0.0)
    me = start.group
    loss_err = max((abs(losses[s] - ref_losses[s][me]) / abs(ref_losses[s][me]) for s in losses),
                   default=0.0)
    ok = (len(full) == len(want) and worst <= 1 and norm_err <= TOL and loss_err <= TOL
          and len(members) == a.steps)
    degraded = sum(1 for m in members if len(m) < groups)
    return verdict(comm, ok,
                   f"parity vs plain PyTorch (replayed membership: {degraded} of {a.steps} steps "
                   f"without every group; this group committed {len(norms)}, aborted {aborted}"
                   f"{', healed from group %d' % healed.healed_from if healed else ''}): "
                   f"params {worst:.2f} of their allowance, norm_rel_err={norm_err:.3e} "
                   f"loss_rel_err={loss_err:.3e} tol={TOL:g}", sharded, session)


def check_views(sharded) -> None:
    """After a heal: every parameter the model holds between steps views the engine's live
    buffer and holds the healed values (zero3 holds none between steps: each forward binds)."""
    if sharded._rt.zero3:
        bad = [pp.name for pp in sharded._params if pp.param.numel() != 0]
    else:
        full = sharded.full_state_dict()
        bad = [pp.name for pp in sharded._params
               if not torch.equal(pp.param.detach().reshape(-1), full[pp.name].reshape(-1))]
    if bad:
        raise SystemExit(f"after the heal, parameter '{bad[0]}' does not view the healed state")


def replay(init, nd, members, groups, a, one_at_a_time):
    """Plain PyTorch over the committed membership: step s averages the present groups' mean
    gradients over their own slices (elastic_data keep: slot = group index of `groups`).
    one_at_a_time: each sample's gradient on its own (another summation order: the floor)."""
    ref = copy.deepcopy(init)
    decay = [p for n, p in ref.named_parameters() if n not in nd]
    plain = [p for n, p in ref.named_parameters() if n in nd]
    opt = torch.optim.AdamW([{"params": decay}, {"params": plain, "weight_decay": 0.0}],
                            lr=HP["lr"], betas=HP["betas"], eps=HP["eps"],
                            weight_decay=HP["weight_decay"])
    norms, losses = {}, {}
    n = a.batch // groups
    for s, present in enumerate(members):
        x = global_batch("mlp", s, a.batch)
        losses[s] = {}
        for g in present:
            rows = x[g * n:(g + 1) * n]
            if one_at_a_time:
                for r in range(n):
                    (batch_loss(ref, "mlp", rows[r:r + 1]) / (n * len(present))).backward()
                continue
            loss = batch_loss(ref, "mlp", rows)
            losses[s][g] = loss.item()
            (loss / len(present)).backward()
        norms[s] = torch.nn.utils.clip_grad_norm_(ref.parameters(), a.clip).item()
        for group in opt.param_groups:
            group["lr"] = lr_at(s)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach() for k, v in ref.named_parameters()}, norms, losses


if __name__ == "__main__":
    raise SystemExit(main())
