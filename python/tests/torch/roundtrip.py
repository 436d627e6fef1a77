"""hsdp.torch checkpoints, exports and weights in, under mpirun -np 4 (2 virtual nodes x 2):

1. A tiny HF GPT-2 sharded zero3 over 2x2 trains 3 steps, saves, trains 2 more (the
   uninterrupted run). A fresh model (other weights) sharded zero2 over 4x1 loads the checkpoint
   (resharded on the fly) and trains the same 2 steps: the same losses (1e-5) and parameters
   (1e-3: two rounding orders apart; a load that lost the moments or a shard moves them by the
   learning rate, 1e-1 of their scale).
2. The checkpoint read back by another implementation: `hsdp-ckpt verify` passes and
   hsdp.checkpoint.open gives every tensor equal to what the model held at the save.
3. Exported safetensors + config.json load into HF GPT2LMHeadModel.from_pretrained: its loss on a
   held-out batch equals the sharded model's (1e-5).
4. Weights in: that from_pretrained model, sharded, gives the same first loss as unsharded.
"""

import copy
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mpi4py import MPI

import torch

import hsdp
import hsdp.checkpoint
import hsdp.torch
from models import batch_loss, build, global_batch

HP = dict(kind="adamw", lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)


def train(model, sharded, comm, steps, first):
    rank, world = comm.Get_rank(), comm.Get_size()
    losses = []
    for step in range(first, first + steps):
        x = global_batch("gpt2", step, 2 * world)
        loss = batch_loss(model, "gpt2", x[2 * rank:2 * rank + 2])
        loss.backward()
        sharded.step()
        losses.append(comm.allreduce(loss.item()) / world)
    return losses


def eval_loss(model, x):
    with torch.no_grad():
        return batch_loss(model, "gpt2", x).item()


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def main() -> int:
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    tmp = Path(comm.bcast(tempfile.mkdtemp(prefix="hsdp-torch-") if rank == 0 else None))
    session = hsdp.Session.attach()
    fails, checks = [], []

    def check(ok, what):
        checks.append(what)
        if not ok:
            fails.append(what)
        if rank == 0:
            print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)

    # 1. Save on 2x2 zero3, resume on 4x1 zero2.
    torch.manual_seed(11)
    a = build("gpt2")
    sa = hsdp.torch.shard(a, session.mesh(intra_shard=2, inter_shard=2),
                          units=list(a.transformer.h), mode="zero3", optimizer=HP)
    train(a, sa, comm, 3, 0)
    saved = sa.save(str(tmp / "ckpt"))
    check(saved["step"] == 3 and saved["written"] is True and saved["writer_group"] == -1
          and saved["bytes"] > 0, f"save() returned {saved} (step 3, written by this job)")
    at_save = sa.full_state_dict()
    cont = train(a, sa, comm, 2, 3)
    final = sa.full_state_dict()

    torch.manual_seed(99)
    b = build("gpt2")
    sb = hsdp.torch.shard(b, session.mesh(intra_shard=4, inter_shard=1, ranks_per_node=4),
                          units=list(b.transformer.h), mode="zero2", optimizer=HP)
    sb.load(str(tmp / "ckpt"))
    check(sb.step_count == 3, f"resumed at step {sb.step_count} (saved at 3)")
    resumed = train(b, sb, comm, 2, 3)
    lerr = max(abs(x - y) / abs(y) for x, y in zip(resumed, cont))
    check(lerr <= 1e-5, f"resumed losses {resumed} vs uninterrupted {cont} (rel {lerr:.2e})")
    got = sb.full_state_dict()
    perr = max(rel(got[n], final[n]) for n in final)
    check(perr <= 1e-3 and got.keys() == final.keys(),
          f"resumed parameters vs uninterrupted: max_rel_err {perr:.2e}")

    # 2. Read back by hsdp-ckpt verify and hsdp.checkpoint.
    if rank == 0:
        tool = Path(os.environ.get("HSDP_BUILD_DIR", "../../../build")) / "tools" / "hsdp-ckpt"
        r = subprocess.run([str(tool), "verify", saved["dir"]], capture_output=True, text=True)
        check(r.returncode == 0, f"hsdp-ckpt verify {saved['dir']}: exit {r.returncode} "
                                 f"{r.stdout.strip()[-200:]} {r.stderr.strip()[-200:]}")
        ck = hsdp.checkpoint.open(saved["dir"])
        names = set(ck.names())
        check(names == set(at_save), f"checkpoint names {sorted(names - set(at_save))[:3]} / "
                                     f"{sorted(set(at_save) - names)[:3]} differ from the model's")
        worst = max((torch.from_numpy(ck.tensor(n)) - at_save[n]).abs().max().item()
                    for n in at_save if n in names)
        check(worst == 0, f"hsdp.checkpoint tensors equal the model's at the save ({worst})")

    # 3. Export -> from_pretrained: the same held-out loss.
    hf = tmp / "hf"
    if rank == 0:
        hf.mkdir()
        a.config.save_pretrained(hf)
    comm.barrier()
    sa.export_safetensors(str(hf / "model.safetensors"))
    held = global_batch("gpt2", 1000, 4)
    mine = eval_loss(a, held)
    from transformers import GPT2LMHeadModel
    loaded = GPT2LMHeadModel.from_pretrained(hf).train()
    theirs = eval_loss(loaded, held)
    check(abs(mine - theirs) <= 1e-5 * abs(theirs),
          f"from_pretrained(export) loss {theirs:.6f} vs sharded {mine:.6f}")

    # 4. Weights in: from_pretrained, sharded, gives the unsharded model's first loss.
    plain = eval_loss(loaded, held)
    c = copy.deepcopy(loaded)
    sc = hsdp.torch.shard(c, session.mesh(intra_shard=2, inter_shard=1),
                          units=list(c.transformer.h), mode="zero3", optimizer=HP)
    first = eval_loss(c, held)
    check(abs(first - plain) <= 1e-6 * abs(plain),
          f"first loss after shard {first:.6f} vs unsharded {plain:.6f}")

    for s in (sa, sb, sc):
        s.close()
    all_fails = comm.allgather(fails)
    session.close()
    bad = [f for fs in all_fails for f in fs]
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"{len(checks) - len(fails)} passed, {len(fails)} failed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
