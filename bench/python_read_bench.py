#!/usr/bin/env python3
"""Reading a checkpoint's tensors into numpy from Python: hsdp.checkpoint against numpy.fromfile of
the same bytes (issue 32's measure; target: hsdp at >= 0.8x fromfile's throughput).

    build/pyenv/bin/python bench/python_read_bench.py [--ckpt DIR] [--repeats 5] [--world 8]

Without --ckpt it trains train_gpt for one step at d 1024 x 7 layers (88.5 M parameters: 1.06 GB
of fp32 masters and Adam moments) on one rank and saves it, then reshards that checkpoint for
--world ranks (4 per node, zero3), so both layouts are read:
  1 rank   every tensor is one run in one file: hsdp maps it (no copy) and hashes it (verify)
  W ranks  every tensor is spread over the ranks' files: hsdp assembles it from its chunks
Rows (all parameters and both Adam moments, every byte of the checkpoint's tensors):
  numpy.fromfile          np.fromfile per chunk run into a fresh array per tensor (no checks)
  hsdp (verify)           ck.tensor(name, state): the default, every chunk's xxHash64 checked
  hsdp (no verify)        ck.tensor(..., verify=False), then every page touched (a sum), since
                          a mapping not yet read has read nothing
  hsdp (assembled)        ck.tensor(..., mmap=False): read into a fresh array, checked
The page cache is warm for every row (each row reads the same files; the first round warms it
and is not counted); medians of --repeats rounds, rows interleaved within a round.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import hsdp

REPO = Path(__file__).resolve().parents[1]


def make_checkpoint(build: Path, work: Path) -> Path:
    root = work / "ckpt1"
    cmd = [str(REPO / "scripts" / "mpirun-local"), "-np", "1", str(build / "examples" / "train_gpt"),
           "--preset", "tiny", "--d-model", "1024", "--layers", "7", "--heads", "8", "--context",
           "64", "--batch", "1", "--steps", "1", "--eval-batches", "0", "--save-dir", str(root)]
    subprocess.run(cmd, check=True, capture_output=True)
    return root


def runs(ckdir):
    """Per (tensor, state): the byte runs [(file, offset, count)] of the manifest, merged where
    contiguous (what a reader without hsdp would issue as fromfile calls)."""
    m = json.loads((Path(ckdir) / "manifest.json").read_text())
    files = [str(Path(ckdir) / f["name"]) for f in m["files"]]
    out = []
    for t in m["tensors"]:
        rs = []
        for f, off, start, count, _ in t["chunks"]:
            if rs and rs[-1][0] == files[f] and rs[-1][1] + 4 * rs[-1][2] == off:
                rs[-1][2] += count
            else:
                rs.append([files[f], off, count, start])
        out.append((t["name"], t["state"], int(np.prod(t["shape"], dtype=np.int64)), rs))
    return out


def read_fromfile(plan):
    total = 0
    for _, _, n, rs in plan:
        if len(rs) == 1:
            a = np.fromfile(rs[0][0], dtype="<f4", count=rs[0][2], offset=rs[0][1])
        else:
            a = np.empty(n, dtype="<f4")
            for path, off, count, start in rs:
                a[start:start + count] = np.fromfile(path, dtype="<f4", count=count, offset=off)
        total += a.nbytes
    return total


def read_hsdp(ck, plan, verify=True, mmap=True, touch=False):
    total = 0
    for name, state, _, _ in plan:
        a = ck.tensor(name, state=state, verify=verify, mmap=mmap)
        if touch:
            a.sum()
        total += a.nbytes
    return total


def bench(ckdir, repeats):
    ck = hsdp.checkpoint.open(ckdir)
    plan = runs(ck.dir)
    rows = {
        "numpy.fromfile": lambda: read_fromfile(plan),
        "hsdp (verify)": lambda: read_hsdp(ck, plan),
        "hsdp (no verify, touched)": lambda: read_hsdp(ck, plan, verify=False, touch=True),
        "hsdp (assembled, verify)": lambda: read_hsdp(ck, plan, mmap=False),
    }
    times = {k: [] for k in rows}
    nbytes = 0
    for r in range(repeats + 1):
        for k, f in rows.items():
            t0 = time.perf_counter()
            nbytes = f()
            dt = time.perf_counter() - t0
            if r > 0:
                times[k].append(dt)
    mapped = sum(ck.is_contiguous(n) for n in ck.names())
    return ck, nbytes, {k: statistics.median(v) for k, v in times.items()}, mapped


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", help="an existing checkpoint (default: make one)")
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--world", type=int, default=8, help="also read it resharded for W ranks")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hsdp-read-bench-") as work:
        work = Path(work)
        src = Path(args.ckpt) if args.ckpt else make_checkpoint(Path(args.build), work)
        layouts = [("as saved", src)]
        if args.world > 1:
            dst = work / f"ckpt{args.world}"
            rpn = min(4, args.world)
            hsdp.checkpoint.reshard(src, dst, world=args.world, ranks_per_node=rpn,
                                    intra_shard=rpn, inter_shard=1, mode="zero3")
            layouts.append((f"resharded for {args.world} ranks", dst))
        print(f"hsdp {hsdp.__version__}: reading every tensor (parameters + Adam moments) into "
              f"numpy, warm page cache, median of {args.repeats}")
        for label, d in layouts:
            ck, nbytes, t, mapped = bench(d, args.repeats)
            base = t["numpy.fromfile"]
            print(f"\n{label}: {ck.mesh['world_size']} rank(s), {len(ck)} parameters "
                  f"({mapped} mapped in place), {nbytes / 2**30:.3f} GiB")
            print(f"  {'reader':<28} {'seconds':>9} {'GiB/s':>8} {'vs fromfile':>12}")
            for k, v in t.items():
                print(f"  {k:<28} {v:9.3f} {nbytes / 2**30 / v:8.2f} {base / v:11.2f}x")


if __name__ == "__main__":
    sys.exit(main())
