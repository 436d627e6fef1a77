#!/usr/bin/env python3
"""What the watchdog and the always-on fingerprints cost (docs/reliability.md).

Collectives, side by side in one run: hsdp-bench's hier and flat over traced communicators
take turns, iteration by iteration (the order shuffled), with hier-off and flat-off, the same
collectives over communicators the watchdog does not trace (watchdog::Untraced: no fingerprints,
waits not watched), 1 MiB and 64 MiB all-gather and reduce-scatter on 8 ranks (2 virtual nodes x
4). An iteration's time is that of the slowest rank. The estimate is paired: each iteration's
traced time over the untraced time of the same iteration (a noisy spell of this 2-core machine
hits both), the median of those ratios pooled over every repeat. The traced and the untraced
collectives are two sets of communicators and buffers, and those alone differ by a few percent
(hier reduce-scatter 64 MiB: 1.03x with HSDP_WATCHDOG=0, where neither is traced), so every
run is made a third time with HSDP_WATCHDOG=0 (the null: the same pairs, nothing traced), and
the cost is the paired ratio divided by the null's; its 95% interval is a bootstrap of both.
The same again with HSDP_CHECK_COLLECTIVES=1 (checked vs untraced, in one run, over the same
null).

The demo's train_mlp job (zero3, intra 4 x inter 1, 8 ranks), one process per setting:
HSDP_WATCHDOG=0, the default, HSDP_CHECK_COLLECTIVES=1, interleaved run by run (the order
rotated each repeat); a run's number is its median step time after the first five steps, the
ratio is taken within a repeat (adjacent runs), and the table shows the median ratio over the
repeats with its bootstrap interval: whole processes vary more than iterations, so this
interval is the wider one.

  bench/watchdog_cost.py [--build build] [--repeats 7] [--mlp-steps 40] [--iters 30]
"""
import argparse
import json
import os
import random
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
    # Per iteration, in iteration order (the same index is the same round of every algorithm).
    return {(op, r["algo"], r["size"]): r["iter_us"] for r in rows}


def median_ci(xs, resamples=2000, seed=1):
    """The median of xs and a 95% percentile-bootstrap interval of it."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    return statistics.median(xs), meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


def ratio_ci(xs, null, resamples=2000, seed=2):
    """median(xs) / median(null) and a 95% bootstrap interval (both resampled)."""
    rng = random.Random(seed)
    med = statistics.median
    rs = sorted(med(rng.choices(xs, k=len(xs))) / med(rng.choices(null, k=len(null)))
                for _ in range(resamples))
    return med(xs) / med(null), rs[int(0.025 * resamples)], rs[int(0.975 * resamples) - 1]


def fmt(m, lo, hi):
    return f"{m:.4f} [{lo:.4f}, {hi:.4f}]"


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
    runs = {"off": [], "on": [], "check": []}  # per repeat: {(op, algo, size): [us per iter]}
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
          "8 ranks = 2 virtual nodes x 4; ratios: median of paired ratios [95% bootstrap "
          "interval]")
    print("| what | untraced (us) | watchdog on (us) | on / untraced | null (both untraced) | "
          "**watchdog cost** (on / null) | checks on (us) | **checks cost** (checks / null) |")
    print("| --- | ---: | ---: | --- | --- | --- | ---: | --- |")
    keys = sorted(k for k in runs["on"][0] if not k[1].endswith("-off"))

    def pooled(mode, key, suffix=""):
        op, algo, size = key
        return [t for r in runs[mode] for t in r[(op, algo + suffix, size)]]

    def paired(mode, key):
        op, algo, size = key
        return [on / off for r in runs[mode]
                for on, off in zip(r[(op, algo, size)], r[(op, algo + "-off", size)])]

    for key in keys:
        op, algo, size = key
        null = paired("off", key)
        print(f"| {op} {algo} {size >> 20} MiB | {med(pooled('on', key, '-off')):.1f} | "
              f"{med(pooled('on', key)):.1f} | {fmt(*median_ci(paired('on', key)))} | "
              f"{fmt(*median_ci(null))} | {fmt(*ratio_ci(paired('on', key), null))} | "
              f"{med(pooled('check', key)):.1f} | {fmt(*ratio_ci(paired('check', key), null))} |")
    on_r = [on / off for on, off in zip(mlp["on"], mlp["off"])]
    chk_r = [c / off for c, off in zip(mlp["check"], mlp["off"])]
    print(f"| train_mlp demo step (HSDP_WATCHDOG=0 as untraced; ratios per repeat) | "
          f"{med(mlp['off']):.1f} | {med(mlp['on']):.1f} | {fmt(*median_ci(on_r))} | | "
          f"{fmt(*median_ci(on_r))} | {med(mlp['check']):.1f} | {fmt(*median_ci(chk_r))} |")

if __name__ == "__main__":
    main()
