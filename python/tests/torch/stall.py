"""The watchdog under hsdp.torch (tests/faults/expect_fault.sh runs it): 4 ranks train a tiny
GPT-2 sharded zero3 with timeout_s=3; at step 2 the last rank stops itself (SIGSTOP) before its
forward. Every other rank must end, as in C++, with the named cause (the collective it waited
on and the stopped rank) and exit code 3, within seconds: no hang."""

import argparse
import os
import signal
import sys
import time

import torch

import hsdp
import hsdp.torch
from models import batch_loss, build, global_batch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="")  # expect_fault.sh finds the job's processes by it
    ap.parse_args()
    torch.set_num_threads(1)
    session = hsdp.Session.init()
    rank, world = session.rank, session.size
    torch.manual_seed(3)
    model = build("gpt2")
    sharded = hsdp.torch.shard(model, session.mesh(intra_shard=2, inter_shard=1),
                               units=list(model.transformer.h), timeout_s=3)
    for step in range(4):
        if step == 2 and rank == world - 1:
            print(f"fault_program [rank {rank}]: stopping at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        x = global_batch("gpt2", step, 2 * world)[2 * rank:2 * rank + 2]
        batch_loss(model, "gpt2", x).backward()
        sharded.step()
    print(f"rank {rank}: trained through the stall (the watchdog did not fire)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
