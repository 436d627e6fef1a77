"""hsdp.torch on a CUDA mesh against plain PyTorch on the same GPU, under mpirun (ctest label gpu):
every rank trains the MLP of models.py on cuda sharded by hsdp.torch (session.mesh(...,
device="cuda"): the engine's CUDA memory space, NCCL) on its slice of each global batch, and beside
it one plain PyTorch copy on the same device trains on the whole global batch with
torch.optim.AdamW (the independent truth). Each step this rank's loss must equal the reference's
on the same slice before its step, and the norm clip_grad_norm_ returns torch's
clip_grad_norm_ of the reference, within 1e-5; at the end every parameter (gathered by hsdp) the
reference's (max |a-b| / max |b| per tensor) within 1e-5 or 10x the distance between two plain
PyTorch runs that differ only in summation order (parity.py says why). Also: the model's
parameters are tensors on the mesh's device while it trains (views of the engine's buffers) and no
gradient byte was copied (they accumulate in the engine's device gradient buffer).

--stream runs forward, backward, clip_grad_norm_ and step on a side stream of torch's (with
torch.cuda.stream): the engine follows torch's current stream, so nothing else changes.

Exit 77 (ctest: skipped) on every rank when any rank's torch sees no CUDA device or this hsdp was
built without CUDA: the ranks agree first over hsdp's host collectives.

    mpirun -np 2 bash tests/common/per_rank_host.sh python cuda_parity.py --mode zero3 --intra 2
"""

import argparse
import contextlib
import copy
import sys

import numpy as np
import torch

import hsdp
import hsdp.torch
from models import MLP, batch_loss, global_batch, no_decay_names

SKIP = 77


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="zero3")
    ap.add_argument("--intra", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--stream", action="store_true", help="train on a side stream of torch's")
    a = ap.parse_args()
    torch.set_num_threads(1)
    session = hsdp.Session.init()
    rank, world = session.rank, session.size
    why = ("this hsdp was built without CUDA" if not hsdp._hsdp.cuda_built else
           "torch sees no CUDA device" if not torch.cuda.is_available() else "")
    # Every rank skips, or none: one host all-reduce over a virtual node of the whole world.
    missing = np.array([1 if why else 0], dtype=np.int32)
    session.mesh(ranks_per_node=world).collectives().all_reduce(missing)
    if missing[0]:
        if rank == 0:
            print(f"cuda_parity: {missing[0]} of {world} ranks cannot run it (rank 0: "
                  f"{why or 'can'}): skipped, exit {SKIP}", flush=True)
        session.close()
        return SKIP

    mesh = session.mesh(intra_shard=a.intra, device="cuda")
    dev = torch.device(mesh.device)
    torch.cuda.set_device(dev)
    # Plain fp32 on both sides (no TF32), as the C++ GPU example's pedantic cuBLAS.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1234)
    model = MLP().to(dev)
    ref = copy.deepcopy(model)
    ref2 = copy.deepcopy(model)  # the noise floor: the same steps, another summation order
    hp = dict(kind="adamw", lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    nd = no_decay_names(model)
    sharded = hsdp.torch.shard(model, mesh, units=list(model.blocks), mode=a.mode,
                               optimizer=hp, no_decay=nd)

    def adamw(m):
        decay = [p for n, p in m.named_parameters() if n not in nd]
        plain = [p for n, p in m.named_parameters() if n in nd]
        return torch.optim.AdamW([{"params": decay}, {"params": plain, "weight_decay": 0.0}],
                                 lr=hp["lr"], betas=hp["betas"], eps=hp["eps"],
                                 weight_decay=hp["weight_decay"])

    opt, opt2 = adamw(ref), adamw(ref2)
    side = torch.cuda.Stream(dev) if a.stream else None
    tol, batch = 1e-5, 4 * world
    per = batch // world
    failures = []
    for step in range(a.steps):
        x = global_batch("mlp", step, batch).to(dev)
        mine = x[rank * per:(rank + 1) * per]
        with torch.no_grad():  # the reference on this rank's slice, before its step
            want_loss = batch_loss(ref, "mlp", mine).item()
        ctx = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
        with ctx:
            if side is not None:
                side.wait_stream(torch.cuda.default_stream(dev))  # x was made on the default
            loss = batch_loss(model, "mlp", mine)
            loss.backward()
            on_device = all(p.device == dev for p in model.parameters())
            norm = sharded.clip_grad_norm_(a.clip)
            sharded.step()
            got_loss = loss.item()  # waits for the stream the loss was computed on
        ref_loss = batch_loss(ref, "mlp", x)
        ref_loss.backward()
        for r in range(batch):  # one sample at a time: another summation order
            (batch_loss(ref2, "mlp", x[r:r + 1]) / batch).backward()
        ref_norms = []
        for m, o in ((ref, opt), (ref2, opt2)):
            ref_norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), a.clip).item())
            o.step()
            o.zero_grad(set_to_none=True)
        floor = abs(ref_norms[1] - ref_norms[0]) / ref_norms[0]
        loss_err = abs(got_loss - want_loss) / max(abs(want_loss), 1e-12)
        norm_err = abs(norm.item() - ref_norms[0]) / ref_norms[0]
        if not on_device:
            failures.append(f"step {step + 1}: a parameter is not on {dev}")
        if not loss_err <= tol:
            failures.append(f"step {step + 1}: loss {got_loss:.7g}, torch {want_loss:.7g}")
        if not (norm.dtype == torch.float32 and norm.device == dev
                and norm_err <= max(tol, 10 * floor)):
            failures.append(f"step {step + 1}: clip_grad_norm_ {norm!r}, torch {ref_norms[0]:.7g}")
        if rank == 0:
            print(f"step {step + 1}/{a.steps} loss {got_loss:.6f} ref {want_loss:.6f} "
                  f"grad_norm {norm.item():.6f} ref {ref_norms[0]:.6f}", flush=True)

    def rel(a_, b_):
        return ((a_ - b_).abs().max() / b_.abs().max().clamp_min(1e-30)).item()

    full = sharded.full_state_dict()
    want = {n: p.detach().cpu() for n, p in ref.named_parameters()}
    other = {n: p.detach().cpu() for n, p in ref2.named_parameters()}
    worst, where = 0.0, ""
    for n, t in full.items():
        e, allowed = rel(t, want[n]), max(tol, 10 * rel(other[n], want[n]))
        if not e <= allowed:
            failures.append(f"parameter '{n}': max_rel_err {e:.3e} > {allowed:.3e}")
        if not e <= worst:
            worst, where = e, n
    if set(full) != set(want):
        failures.append(f"full_state_dict has {sorted(full)}, the model {sorted(want)}")
    copied = sharded.stats()["bytes_copied"]
    if copied:
        failures.append(f"{copied} gradient bytes copied (want 0: they accumulate in place)")
    for f in failures:
        print(f"rank {rank}: {f}", flush=True)
    if rank == 0:
        print(f"cuda parity vs plain PyTorch on {dev} ({world} ranks, {a.mode}"
              f"{', side stream' if side is not None else ''}): max_rel_err={worst:.3e} ({where}) "
              f"bytes_copied={copied} {'FAIL' if failures else 'PASS'} on rank 0", flush=True)
    sharded.close()
    session.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
