"""One rank of bench/torch_bench.sh: HF GPT-2 small (6 layers, d 384, 6 heads, context 128,
vocabulary 256, tied head: 10.8 M parameters) trained on one sequence per rank per step, fp32,
one compute thread per rank, the same initial weights (seed 0) and batches (seed 1000 + step)
for every implementation:

    --impl hsdp    hsdp.torch.shard (zero3; --layout 4x1: intra 4 x inter 1, HSDP with 2
                   replicas; 4x2: intra 4 x inter 2, one shard group of 8)
    --impl fsdp2   PyTorch FSDP2 fully_shard per block and the root, gloo, torch.optim.AdamW
                   (4x1: a 2-D DeviceMesh (replicate 2, shard 4); 4x2: a 1-D mesh of 8)
    --impl alone   the torch compute alone: the same model and optimizer, no communication

Prints one line on rank 0: `result impl=... layout=... step_s=<median> exposed_s=<median>
rss_mb=<max over ranks> copied=<bytes per step> loss=<last>`; step_s is the slowest rank's time
per step (median over the measured steps), exposed_s hsdp's blocked-on-communication time per
step (the slowest rank; FSDP2 and alone report -1: torch does not measure it).
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import mpi4py

# hsdp starts MPI (Session.init: its Open MPI tuning, e.g. the TCP eager limit, applies only
# before MPI_Init); mpi4py then uses that MPI for the barriers and the timing reductions.
mpi4py.rc.initialize = False
mpi4py.rc.finalize = False
from mpi4py import MPI  # noqa: E402

import torch  # noqa: E402

import hsdp  # noqa: E402
import hsdp.torch  # noqa: E402

HP = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def model():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=256, n_positions=128, n_embd=384, n_layer=6, n_head=6,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                     eos_token_id=0)
    return GPT2LMHeadModel(cfg).train()


def my_address() -> str:
    """This node's address (eth0 on the emulated cluster), else loopback."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "eth0"], capture_output=True,
                             text=True, check=False).stdout.split()
        return out[out.index("inet") + 1].split("/")[0]
    except (ValueError, IndexError, OSError):
        return "127.0.0.1"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=["hsdp", "fsdp2", "alone"], required=True)
    ap.add_argument("--layout", choices=["4x1", "4x2"], default="4x1")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    session = hsdp.Session.init()
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    inter = 1 if a.layout == "4x1" else 2
    m = model()
    stats = None
    if a.impl == "hsdp":
        mesh = session.mesh(intra_shard=4, inter_shard=inter)
        sharded = hsdp.torch.shard(m, mesh, units=list(m.transformer.h), mode="zero3",
                                   optimizer=dict(kind="adamw", **HP))
        step_fn, stats = sharded.step, sharded.stats
    else:
        opt_params = None
        if a.impl == "fsdp2":
            import torch.distributed as dist
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0" if my_address() != "127.0.0.1"
                                  else "lo")
            addr = comm.bcast(my_address() if rank == 0 else None)
            dist.init_process_group("gloo", init_method=f"tcp://{addr}:29533", rank=rank,
                                    world_size=world)
            mesh = (init_device_mesh("cpu", (world // 4, 4), mesh_dim_names=("rep", "shard"))
                    if inter == 1 else init_device_mesh("cpu", (world,)))
            for block in m.transformer.h:
                fully_shard(block, mesh=mesh)
            fully_shard(m, mesh=mesh)
        opt_params = m.parameters()
        opt = torch.optim.AdamW(opt_params, **HP)

        def step_fn():
            opt.step()
            opt.zero_grad(set_to_none=True)

    times, exposed, loss = [], [], 0.0
    for step in range(a.warmup + a.steps):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randint(0, 256, (world, 128), generator=g)[rank:rank + 1]
        comm.Barrier()
        t = time.perf_counter()
        out = m(input_ids=x, labels=x)
        out.loss.backward()
        step_fn()
        dt = time.perf_counter() - t
        loss = out.loss.item()
        st = stats() if stats else None
        if step >= a.warmup:
            times.append(comm.allreduce(dt, op=MPI.MAX))
            exposed.append(comm.allreduce(st["exposed_comm_s"] if st else -1.0, op=MPI.MAX))
    rss = comm.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, op=MPI.MAX)
    copied = st["bytes_copied"] if st else 0
    if rank == 0:
        print(f"result impl={a.impl} layout={a.layout if a.impl != 'alone' else '-'} "
              f"step_s={statistics.median(times):.4f} exposed_s={statistics.median(exposed):.4f} "
              f"rss_mb={rss:.0f} copied={copied} loss={loss:.4f}", flush=True)
    if a.impl == "fsdp2":
        import torch.distributed as dist
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
