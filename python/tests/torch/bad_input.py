"""hsdp.torch.shard and ShardedModule on bad input, under mpirun (every rank): each case raises
the named hsdp error on every rank, naming the module or parameter, without a hang, and leaves
the model as it was (the same parameter objects, the same values). Exit 0 when every case does.
"""

import sys

from mpi4py import MPI

import torch
from torch import nn

import hsdp
import hsdp.torch
from models import MLP


def snapshot(m):
    return [(n, p, p.detach().clone()) for n, p in m.named_parameters()]


def unchanged(m, snap) -> bool:
    now = list(m.named_parameters())
    return len(now) == len(snap) and all(
        n == n0 and p is p0 and p.shape == v0.shape and torch.equal(p.detach(), v0)
        for (n, p), (n0, p0, v0) in zip(now, snap))


class Shared(nn.Module):
    """Two blocks that use one Linear: a parameter in two units."""

    def __init__(self):
        super().__init__()
        lin = nn.Linear(4, 4)
        self.a = nn.Sequential(lin)
        self.b = nn.Sequential(lin)

    def forward(self, x):
        return self.b(self.a(x))


def claiming(device: str):
    """A model whose fc0.weight says it is on `device` (a Parameter subclass reporting it; this
    host may have no such device): what shard() checks before it reads a byte of it."""
    class OnDevice(nn.Parameter):
        @property
        def device(self):
            return torch.device(device)

    def build():
        m = MLP()
        m.fc0.weight = OnDevice(m.fc0.weight.detach())
        return m
    return build


def main() -> int:
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    session = hsdp.Session.attach()
    mesh = session.mesh(intra_shard=comm.Get_size())
    failures = []

    def case(name, build, call, error, words):
        torch.manual_seed(7)
        m = build()
        snap = snapshot(m)
        try:
            call(m)
            failures.append(f"{name}: no error")
        except error as e:
            missing = [w for w in words if w not in str(e)]
            if missing:
                failures.append(f"{name}: message lacks {missing}: {e}")
        except Exception as e:  # noqa: BLE001 -- any other exception is a failure of the case
            failures.append(f"{name}: {type(e).__name__} instead of {error.__name__}: {e}")
        if not unchanged(m, snap):
            failures.append(f"{name}: the model changed")
        if rank == 0:
            print(f"{name}: done", flush=True)

    stray = nn.Linear(3, 3)
    case("unit not a submodule", MLP,
         lambda m: hsdp.torch.shard(m, mesh, units=[m.blocks[0], stray]),
         hsdp.InvalidArgumentError, ["units[1]", "Linear", "not a submodule"])
    case("parameter in two units", Shared,
         lambda m: hsdp.torch.shard(m, mesh, units=[m.a, m.b]),
         hsdp.InvalidArgumentError, ["'a.0.weight'", "two units", "'a'", "'b'"])

    def perturbed():
        m = MLP()
        if rank == comm.Get_size() - 1:
            with torch.no_grad():
                m.blocks[1].fc.weight[0, 0] += 1.0
        return m
    # Only the last rank's copy differs, yet every rank raises (a digest per parameter, agreed).
    case("model differs between ranks", perturbed,
         lambda m: hsdp.torch.shard(m, mesh, units=list(m.blocks)), hsdp.InvalidArgumentError,
         ["'blocks.1.fc.weight'", "differs between rank 0 and rank"])
    case("float64 model", lambda: MLP().double(),
         lambda m: hsdp.torch.shard(m, mesh, units=list(m.blocks)),
         hsdp.InvalidArgumentError, ["'fc0.weight'", "torch.float64"])
    case("unknown mode", MLP, lambda m: hsdp.torch.shard(m, mesh, mode="zero4"),
         hsdp.InvalidArgumentError, ["zero4"])
    case("unknown optimizer key", MLP,
         lambda m: hsdp.torch.shard(m, mesh, optimizer=dict(lr=1e-3, momentum=0.9)),
         hsdp.InvalidArgumentError, ["momentum"])
    case("negative learning rate", MLP,
         lambda m: hsdp.torch.shard(m, mesh, optimizer=dict(lr=-1.0)),
         hsdp.InvalidArgumentError, ["learning rate -1"])
    case("the model itself as a unit", MLP, lambda m: hsdp.torch.shard(m, mesh, units=[m]),
         hsdp.InvalidArgumentError, ["units[0]", "the model itself"])

    # CUDA (docs/torch.md, "CUDA"): a CUDA model on a host mesh; in a build without CUDA that is
    # what the error says. A device hsdp.torch does not run on at all.
    if hsdp._hsdp.cuda_built:
        case("CUDA model on a host mesh", claiming("cuda:0"),
             lambda m: hsdp.torch.shard(m, mesh, units=list(m.blocks)), hsdp.InvalidArgumentError,
             ["'fc0.weight'", "cuda:0", "on the host", "device='cuda:0'"])
    else:
        case("CUDA model, hsdp built without CUDA", claiming("cuda:0"),
             lambda m: hsdp.torch.shard(m, mesh, units=list(m.blocks)),
             hsdp.FailedPreconditionError, ["'fc0.weight'", "cuda:0", "built without CUDA"])
    case("model on the meta device", claiming("meta"),
         lambda m: hsdp.torch.shard(m, mesh, units=list(m.blocks)), hsdp.UnimplementedError,
         ["'fc0.weight'", "meta", "CPU or on a CUDA GPU"])
    case("unknown mesh device", MLP, lambda m: session.mesh(device="tpu"),
         hsdp.InvalidArgumentError, ["'tpu'", "'cuda'"])
    # A CUDA mesh where it cannot be: a build without CUDA, or ranks without a GPU (every rank
    # fails alike, before NCCL starts). On a GPU host with a CUDA build it would be made.
    if not (hsdp._hsdp.cuda_built and torch.cuda.is_available()):
        case("CUDA mesh without CUDA or a GPU", MLP,
             lambda m: session.mesh(intra_shard=comm.Get_size(), device="cuda"),
             hsdp.FailedPreconditionError,
             ["device='cuda'", "built without CUDA" if not hsdp._hsdp.cuda_built
              else "no CUDA device visible"])

    # After a successful shard: step() without a backward, and a second shard of the same model.
    torch.manual_seed(7)
    m = MLP()
    sharded = hsdp.torch.shard(m, mesh, units=list(m.blocks))
    try:
        sharded.step()
        failures.append("step() without backward: no error")
    except hsdp.FailedPreconditionError as e:
        if "without a backward" not in str(e) or "unit '" not in str(e):
            failures.append(f"step() without backward: {e}")
    try:
        sharded.clip_grad_norm_(1.0)
        failures.append("clip_grad_norm_() without backward: no error")
    except hsdp.FailedPreconditionError as e:
        if "clip_grad_norm_() without a backward" not in str(e) or "unit '" not in str(e):
            failures.append(f"clip_grad_norm_() without backward: {e}")
    try:
        hsdp.torch.shard(m, mesh, units=list(m.blocks))
        failures.append("second shard: no error")
    except hsdp.FailedPreconditionError as e:
        if "already sharded" not in str(e):
            failures.append(f"second shard: {e}")
    # The sharded model still trains after the refused calls.
    loss = m(torch.randn(4, 16)).square().mean()
    loss.backward()
    sharded.step()
    if sharded.step_count != 1:
        failures.append(f"step_count {sharded.step_count} after one step")
    sharded.close()

    all_failures = comm.allgather(failures)
    session.close()
    bad = [f"rank {r}: {f}" for r, fs in enumerate(all_failures) for f in fs]
    if rank == 0:
        print("\n".join(bad) if bad else "bad input: every case refused on every rank", flush=True)
        print(f"{0 if bad else 1} passed, {1 if bad else 0} failed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
