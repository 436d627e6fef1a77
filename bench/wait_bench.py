#!/usr/bin/env python3
"""Waits that leave the cores to compute (docs/collectives.md, "Waiting without spinning"):
hsdp-bench's small-message latency (all-reduce, all-gather, 8 B .. 64 KiB) of two builds, a
baseline and this one, in interleaved rounds (A B B A ...), and --wait-cpu of both; per build,
algorithm and size the median over the rounds of hsdp-bench's median time.

  bench/wait_bench.py --before OLD/hsdp-bench [--after build/bench/hsdp-bench] [--rounds 5]

The baseline must have --wait-cpu (bench/hsdp_bench_wait.cc; build the old tree with it).
8 ranks as 2 virtual nodes x 4 (HSDP_RANKS_PER_NODE=4); hier and flat on MPI, and hier with
both mesh levels on UCX (hier-ucx); mpi is the MPI library's own collective (a control)."""
import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpirun(binary, args, env_extra=()):
    cmd = ["nice", "mpirun", "--oversubscribe", "--bind-to", "none", "-np", "8",
           "-x", "HSDP_RANKS_PER_NODE=4"]
    for e in env_extra:
        cmd += ["-x", e]
    out = subprocess.run(cmd + [binary] + args, capture_output=True, text=True,
                         env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
                                  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    if out.returncode != 0:
        sys.exit(f"wait_bench: {' '.join(cmd + [binary] + args)} failed:\n{out.stdout}{out.stderr}")
    return out.stdout


def latency(binary, op, ucx):
    env = ("HSDP_TRANSPORT_INTRA=ucx", "HSDP_TRANSPORT_INTER=ucx") if ucx else ()
    algos = "hier" if ucx else "hier,flat,mpi"
    out = mpirun(binary, ["-b", "8", "-e", "64K", "-f", "8", "-n", "40", "-w", "5", "--op", op,
                          "--algo", algos, "-c", "0"], env)
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if line.startswith("#") or len(f) < 7:
            continue
        algo = f[4] + ("-ucx" if ucx else "")
        rows[(algo, int(f[0]))] = float(f[5])
    return rows


def wait_cpu(binary, thread):
    env = ("HSDP_PROGRESS_THREAD=1",) if thread else ()
    out = mpirun(binary, ["--wait-cpu", "-b", "1M", "-n", "3", "--wait-ms", "2000"], env)
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if line.startswith("#") or len(f) != 7:
            continue
        rows[(f[0], f[1], "on" if thread else "off")] = tuple(float(x) for x in f[2:6])
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True)
    p.add_argument("--after", default=os.path.join(ROOT, "build/bench/hsdp-bench"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-cpu", action="store_true")
    a = p.parse_args()
    if a.rounds < 1:
        sys.exit(f"wait_bench: --rounds {a.rounds} must be >= 1")
    builds = {"before": a.before, "after": a.after}
    for b in builds.values():
        if not os.access(b, os.X_OK):
            sys.exit(f"wait_bench: {b} is not an executable")
    lat = {(b, op): [] for b in builds for op in ("allreduce", "allgather")}
    cpu = {b: [] for b in builds}
    for r in range(a.rounds):
        order = list(builds) if r % 2 == 0 else list(reversed(builds))
        for b in order:
            if not a.skip_latency:
                for op in ("allreduce", "allgather"):
                    rows = latency(builds[b], op, False)
                    rows.update(latency(builds[b], op, True))
                    lat[(b, op)].append(rows)
            if not a.skip_cpu:
                rows = wait_cpu(builds[b], False)
                rows.update(wait_cpu(builds[b], True))
                cpu[b].append(rows)
        print(f"# round {r + 1}/{a.rounds} done", file=sys.stderr)
    with open("/proc/loadavg") as f:
        print(f"# {a.rounds} rounds, interleaved; load average at the end: {f.read().split()[:3]}")
    if not a.skip_latency:
        for op in ("allreduce", "allgather"):
            print(f"\n## {op}: time (us), median over rounds of hsdp-bench's median of 40\n")
            keys = sorted(lat[("before", op)][0])
            print("| algo | size (B) | before | after | after/before |")
            print("|---|---:|---:|---:|---:|")
            for k in sorted(keys, key=lambda k: (k[0], k[1])):
                m = {b: statistics.median(x[k] for x in lat[(b, op)]) for b in builds}
                print(f"| {k[0]} | {k[1]} | {m['before']:.1f} | {m['after']:.1f} | "
                      f"{m['after'] / m['before']:.2f} |")
    if not a.skip_cpu:
        print("\n## --wait-cpu: waiters' CPU (% of a core; mean, worst), rank 0's share of its "
              "compute (%) and the waiters' fewest sleeps a second, medians over rounds\n")
        print("| transport | call | progress thread | before mean / worst / r0 / sleeps | "
              "after mean / worst / r0 / sleeps |")
        print("|---|---|---|---:|---:|")
        for k in sorted(cpu["before"][0]):
            cells = []
            for b in builds:
                v = [statistics.median(x[k][i] for x in cpu[b]) for i in range(4)]
                cells.append(f"{v[0]:.1f} / {v[1]:.1f} / {v[2]:.0f} / {v[3]:.0f}")
            print(f"| {k[0]} | {k[1]} | {k[2]} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
