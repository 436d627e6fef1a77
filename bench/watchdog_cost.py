#!/usr/bin/env python3
"""What the watchdog and the always-on fingerprints cost (docs/reliability.md).

Runs the same jobs with the watchdog off (HSDP_WATCHDOG=0), on (the default) and with
HSDP_CHECK_COLLECTIVES=1, interleaved run by run (off, on, check, then the next repeat in a
rotated order), so that a noisy spell on a shared machine hits all three alike:
  - hsdp-bench: 1 MiB and 64 MiB all-gather and reduce-scatter on 8 ranks (2 virtual nodes x 4),
    hsdp's hierarchical schedule and its flat collective (each run's time is already the median
    of its iterations of the slowest rank);
  - train_mlp, the demo's job (zero3, intra 4 x inter 1, 8 ranks): the median step time of a
    run, first steps skipped.
Prints medians over the repeats and the ratios to "off".

  bench/watchdog_cost.py [--build build] [--repeats 7] [--mlp-steps 40]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

MODES = {
    "off": {"HSDP_WATCHDOG": "0"},
    "on": {},
    "check": {"HSDP_CHECK_COLLECTIVES": "1"},
}


def mpirun(build, np, args, env_extra):
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "HSDP_RANKS_PER_NODE": "4"})
    env.update(env_extra)
    xs = []
    for k in env:
        if k.startswith("HSDP_"):
            xs += ["-x", k]
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np)] + xs + args
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return out.stdout


def bench(build, mode, op):
    out = mpirun(build, 8, [f"{build}/bench/hsdp-bench", "-b", "1M", "-e", "64M", "-f", "64",
                            "--op", op, "--algo", "hier,flat", "-n", "10", "-w", "3", "--json"],
                 MODES[mode])
    rows = json.loads(out.strip().splitlines()[-1])
    return {(op, r["algo"], r["size"]): r["time_us"] for r in rows}


def mlp(build, mode, steps):
    out = mpirun(build, 8, [f"{build}/examples/train_mlp", "--mode", "zero3", "--intra-shard",
                            "4", "--inter-shard", "1", "--steps", str(steps)], MODES[mode])
    times = []
    for line in out.splitlines():
        f = line.split()
        if len(f) == 6 and f[0].isdigit():
            times.append(float(f[3]))
    return {("train_mlp", "step", 0): statistics.median(times[5:]) * 1e3}  # us


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--mlp-steps", type=int, default=40)
    a = ap.parse_args()
    samples = {}  # (mode, key) -> [us]
    order = list(MODES)
    for rep in range(a.repeats):
        for mode in order[rep % 3:] + order[:rep % 3]:
            got = {}
            for op in ("allgather", "reducescatter"):
                got.update(bench(a.build, mode, op))
            got.update(mlp(a.build, mode, a.mlp_steps))
            for k, v in got.items():
                samples.setdefault((mode, k), []).append(v)
        print(f"# repeat {rep + 1}/{a.repeats} done", file=sys.stderr)
    keys = sorted({k for (_, k) in samples})
    print(f"# medians of {a.repeats} interleaved runs per mode; 8 ranks = 2 virtual nodes x 4")
    print(f"| {'what':34} | {'off (us)':>11} | {'on (us)':>11} | {'on/off':>7} | "
          f"{'check (us)':>11} | {'check/off':>9} |")
    print(f"| {'-' * 34} | {'-' * 11} | {'-' * 11} | {'-' * 7} | {'-' * 11} | {'-' * 9} |")
    for k in keys:
        med = {m: statistics.median(samples[(m, k)]) for m in MODES}
        what = (f"{k[0]} {k[1]} {k[2] >> 20} MiB" if k[0] != "train_mlp"
                else "train_mlp demo step")
        print(f"| {what:34} | {med['off']:11.1f} | {med['on']:11.1f} | "
              f"{med['on'] / med['off']:7.3f} | {med['check']:11.1f} | "
              f"{med['check'] / med['off']:9.3f} |")


if __name__ == "__main__":
    main()
