#!/usr/bin/env python3
"""train_mlp --check whose reference takes longer than HSDP_TIMEOUT_S (issue 33).

    long_reference.py TIMEOUT_S MPIRUN [MPIRUN FLAGS...] -- PROGRAM [ARGS...]

Rank 0 trains the single-process reference while the other ranks wait for its verdict: healthy
local work, which the watchdog ended as a timeout while the others sat in a blocking broadcast.
Passes when the job exits 0 with "parity ... PASS" and the reference really outlasted the
timeout: the silence before the burst of output that ends with the parity line (rank 0 trains the
reference in it; lines printed without a flush arrive with the parity line) must exceed
TIMEOUT_S, else the test proves nothing and says so.
"""
import os
import subprocess
import sys
import time

timeout_s = float(sys.argv[1])
split = sys.argv.index("--")
mpirun, prog = sys.argv[2:split], sys.argv[split + 1:]
env = dict(os.environ, HSDP_TIMEOUT_S=str(sys.argv[1]))
cmd = [*mpirun, "-x", "HSDP_TIMEOUT_S", *prog]
print(" ".join(cmd), flush=True)
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                     bufsize=1)
start = time.monotonic()
gap = None
lines, times = [], []
for line in p.stdout:
    now = time.monotonic()
    if "parity vs" in line and gap is None:
        gap = now - max([t for t in times if now - t > 0.2], default=start)
    lines.append(line)
    times.append(now)
    print(line, end="", flush=True)
rc = p.wait()
problems = []
if rc != 0:
    problems.append(f"exit {rc}, expected 0")
if not any("parity vs" in l and " PASS" in l for l in lines):
    problems.append("no 'parity ... PASS' line")
if gap is None or gap <= timeout_s:
    problems.append(f"the reference took {gap or 0:.1f} s, not more than HSDP_TIMEOUT_S={timeout_s}: "
                    "enlarge it, or this test does not exercise the wait")
if problems:
    print("long_reference: FAIL: " + "; ".join(problems))
    sys.exit(1)
print(f"long_reference: OK: exit 0, PASS, reference {gap:.1f} s > HSDP_TIMEOUT_S={timeout_s}")
