#!/usr/bin/env python3
"""What the watchdog and the always-on fingerprints cost (docs/reliability.md).

Collectives, side by side in one run: hsdp-bench's hier and flat over traced communicators
take turns, iteration by iteration, with hier-off and flat-off, the same collectives over
communicators the watchdog does not trace (watchdog::Untraced: no fingerprints, waits not
watched), 1 MiB and 64 MiB all-gather and reduce-scatter on 8 ranks (2 virtual nodes x 4). Each
run's number is the median (and the minimum) over its iterations (--iters, 30) of the slowest
rank; a run gives a ratio traced/untraced; the table shows the median over the repeats of the
times and of the ratios (of medians, and of minimums: the best case is the least disturbed by
other load).
The same again with HSDP_CHECK_COLLECTIVES=1 (checked vs untraced, in one run).

The demo's train_mlp job (zero3, intra 4 x inter 1, 8 ranks), one process per setting:
HSDP_WATCHDOG=0, the default, HSDP_CHECK_COLLECTIVES=1, interleaved run by run (the order
rotated each repeat); a run's number is its median step time after the first five steps.

  bench/watchdog_cost.py [--build build] [--repeats 7] [--mlp-steps 40] [--iters 30]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ALGOS = "hier,hier-off,flat,flat-off"


def mpirun(args, env_extra):
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "HSDP_RANKS_PER_NODE": "4"})
    env.update(env_extra)
    xs = []
    for k in env:
        if k.startswith("HSDP_"):
            xs += ["-x", k]
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "8"] + xs + args
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return out.stdout


def bench(build, op, env, iters):
    out = mpirun([f"{build}/bench/hsdp-bench", "-b", "1M", "-e", "64M", "-f", "64", "--op", op,
                  "--algo", ALGOS, "-n", str(iters), "-w", "3", "--json"], env)
    rows = json.loads(out.strip().splitlines()[-1])
    got = {(op, r["algo"], r["size"]): r["time_us"] for r in rows}
    got.update({(op, r["algo"] + ":min", r["size"]): r["min_us"] for r in rows})
    return got


def mlp_step_us(build, env, steps):
    out = mpirun([f"{build}/examples/train_mlp", "--mode", "zero3", "--intra-shard", "4",
                  "--inter-shard", "1", "--steps", str(steps)], env)
    times = [float(f[3]) for f in (l.split() for l in out.splitlines())
             if len(f) == 6 and f[0].isdigit()]
    return statistics.median(times[5:]) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--mlp-steps", type=int, default=40)
    ap.add_argument("--iters", type=int, default=30, help="timed iterations per hsdp-bench run")
    a = ap.parse_args()
    runs = {"on": [], "check": []}  # per repeat: {(op, algo, size): us}
    mlp = {"off": [], "on": [], "check": []}
    mlp_env = {"off": {"HSDP_WATCHDOG": "0"}, "on": {}, "check": {"HSDP_CHECK_COLLECTIVES": "1"}}
    order = list(mlp_env)
    for rep in range(a.repeats):
        for mode in order[rep % 3:] + order[:rep % 3]:
            mlp[mode].append(mlp_step_us(a.build, mlp_env[mode], a.mlp_steps))
            if mode in runs:
                got = {}
                for op in ("allgather", "reducescatter"):
                    got.update(bench(a.build, op, mlp_env[mode], a.iters))
                runs[mode].append(got)
        print(f"# repeat {rep + 1}/{a.repeats} done", file=sys.stderr)

    med = statistics.median
    print(f"# {a.repeats} repeats, {a.iters} iterations per hsdp-bench run; "
          "8 ranks = 2 virtual nodes x 4; the machine was shared")
    print("| what | untraced (us) | watchdog on (us) | on / untraced (min) | checks on (us) | "
          "checks / untraced (min) |")
    print("| --- | --- | --- | --- | --- | --- |")
    keys = sorted(k for k in runs["on"][0] if not k[1].endswith(("-off", ":min")))

    def ratio(mode, op, algo, size, suffix=""):
        return med([r[(op, algo + suffix, size)] / r[(op, algo + "-off" + suffix, size)]
                    for r in runs[mode]])

    for (op, algo, size) in keys:
        off_t = [r[(op, algo + "-off", size)] for r in runs["on"]]
        on_t = [r[(op, algo, size)] for r in runs["on"]]
        chk_t = [r[(op, algo, size)] for r in runs["check"]]
        print(f"| {op} {algo} {size >> 20} MiB | {med(off_t):.1f} | {med(on_t):.1f} | "
              f"{ratio('on', op, algo, size):.3f} ({ratio('on', op, algo, size, ':min'):.3f}) | "
              f"{med(chk_t):.1f} | {ratio('check', op, algo, size):.3f} "
              f"({ratio('check', op, algo, size, ':min'):.3f}) |")
    print(f"| train_mlp demo step (HSDP_WATCHDOG=0 as untraced) | {med(mlp['off']):.1f} | "
          f"{med(mlp['on']):.1f} | {med(mlp['on']) / med(mlp['off']):.3f} | "
          f"{med(mlp['check']):.1f} | {med(mlp['check']) / med(mlp['off']):.3f} |")


if __name__ == "__main__":
    main()
