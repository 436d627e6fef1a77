#!/usr/bin/env python3
"""Runs an hsdp-bench command (given whole after --, with --json among its flags) and fails
unless it exits 0 and every row of its JSON has #wrong == 0: the bench's own check of each
collective against MPI's collectives (or the quantized closed form), as a test.

  bench_check.py -- mpirun -np 4 ... build/bench/hsdp-bench ... --json
"""
import json
import subprocess
import sys


def main():
    if "--" not in sys.argv:
        sys.exit("usage: bench_check.py -- COMMAND...")
    cmd = sys.argv[sys.argv.index("--") + 1:]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"exit {out.returncode}: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    lines = out.stdout.strip().splitlines()
    rows = json.loads(lines[-1]) if lines else []
    if not rows:
        sys.exit(f"no rows: {' '.join(cmd)}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    bad = [r for r in rows if r["wrong"] != 0]
    for r in rows:
        print(f"{r['op']} {r['algo']} {r['size']} B: {r['time_us']:.1f} us, wrong {r['wrong']}")
    if bad:
        sys.exit(f"{len(bad)} row(s) with wrong elements")


if __name__ == "__main__":
    main()
