#!/usr/bin/env python3
"""Every number and list a user can give, by class, over every program and environment variable
(issues 18 and 33).

    bad_input_classes.py BUILD_DIR MPIRUN [MPIRUN FLAGS...]

The table is not written by hand: the numeric flags are read from each program's --help (the
type hints hsdp/cli.h gives them: INT, UINT, REAL, BYTES) and the numeric variables from
hsdp-env, so a new flag or variable is covered the day it is added. Each gets the bad values of
its class:
    INT, UINT   '12x' (junk), '18446744073709551616' (2^64: wraps every integer type)
    REAL        'nan', '1e999' (not finite)
    BYTES       '12Q' (no such unit)
    LIST        ',1', '1,', '1,,1', '1, ,1' (a leading, trailing or double comma, an element of
                only whitespace: hsdp::parseList names the element "is empty")
    env int     '12x', '18446744073709551616';  env number (seconds): 'nan', '-1'
and must: exit 2, print on every rank (MPI programs run on 2 ranks) an error line in the project's
style ('<prog>[ [rank r]]: error: ...') that names the flag or variable and the value as
written, and end within 30 s.

BAD_INPUT_KINDS (environment): a comma list of the classes to run (INT, UINT, REAL, BYTES, LIST,
ENV: the environment variables); unset: all of them.
"""
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

BUILD = os.path.realpath(sys.argv[1])
KINDS = set(filter(None, os.environ.get("BAD_INPUT_KINDS", "").split(","))) or {
    "INT", "UINT", "REAL", "BYTES", "LIST", "ENV"}
MPIRUN = sys.argv[2:]
NP = 2

# program -> (path, runs under MPI, base arguments: flag -> value or positional list)
PROGRAMS = {
    "train_mlp": ("examples/train_mlp", True, [], {}),
    "train_gpt": ("examples/train_gpt", True, [], {}),
    "hsdp-bench": ("bench/hsdp-bench", True, [], {}),
    "hsdp-topo": ("tools/hsdp-topo", False, [], {}),
    "hsdp-plan": ("tools/hsdp-plan", False, [],
                  {"--params": "1e9", "--nodes": "2", "--gpus-per-node": "8"}),
    "cpu_adam_bench": ("bench/cpu_adam_bench", False, [], {}),
    "quant_bench": ("bench/quant_bench", False, [], {}),
    "watchdog_bench": ("bench/watchdog_bench", False, [], {}),
    "gpu_bench": ("bench/gpu_bench", False, [], {}),  # CUDA builds; flags parse before the device
    "ckpt_bench": ("bench/ckpt_bench", True, [], {}),
    "gpt_bench": ("bench/gpt_bench", True, [], {}),
    "hsdp-ckpt reshard": ("tools/hsdp-ckpt", False, ["reshard", "/nonexistent", "/tmp/x"],
                          {"--world": "1", "--ranks-per-node": "1", "--intra-shard": "1",
                           "--inter-shard": "1"}),
    "hsdp-ckpt export": ("tools/hsdp-ckpt", False, ["export", "/nonexistent", "/tmp/x.st"], {}),
    # No program after "--": a value the parser wrongly took ends at "no program to run", which
    # does not name the flag, so it fails here too; nothing is ever started.
    "hsdp-elastic": ("tools/hsdp-elastic", False, [], {"--groups": "1", "--np": "1"}),
}
BAD = {"INT": ["12x", "18446744073709551616"], "UINT": ["12x", "18446744073709551616"],
       "REAL": ["nan", "1e999"], "BYTES": ["12Q"], "LIST": [",1", "1,", "1,,1", "1, ,1"]}
# What the error line must hold besides the flag and the value as written.
WANT_EXTRA = {"LIST": ["is empty"]}
# Environment variables read only on a path a CPU run of train_mlp does not take, and what
# makes it take that path (or why it cannot here).
ENV_NEEDS = {
    "HSDP_UCX_SMALL_BYTES": (["-x", "HSDP_TRANSPORT_INTER=ucx"], []),
    "HSDP_CPU_ADAM_THREADS": ([], ["--offload", "cpu"]),
    # Read by the engine's elastic group before it contacts etcd (nothing listens at port 9).
    "HSDP_REPLICA_TIMEOUT_MS": (["-x", "HSDP_ELASTIC_ENDPOINT=http://127.0.0.1:9", "-x",
                                 "HSDP_ELASTIC_GROUP_INDEX=0", "-x", "HSDP_ELASTIC_GROUPS=1"],
                                ["--mode", "zero3", "--inter-shard", "2"]),
}
ENV_SKIP = {
    "HSDP_CUDA_DEVICE": "read by the CUDA device memory space only (no GPU here)",
    # Read by the elastic coordination layer only in elastic mode (it needs an etcd); their bad
    # values are checked by quorum_test (QuorumSettings.BadEnvironmentValuesAreNamed). The
    # engine's elastic settings (HSDP_ELASTIC_GROUPS, ...) are read by every run: checked here.
    "HSDP_ELASTIC_LEASE_S": "read by elastic/ only (quorum_test checks its bad values)",
    "HSDP_ELASTIC_VOTE_TIMEOUT_MS": "read by elastic/ only (quorum_test checks its bad values)",
    "HSDP_ETCD_TIMEOUT_MS": "read by elastic/ only (quorum_test checks its bad values)",
}
HELP_LINE = re.compile(r"^\s+(?:-\w,)?(--[\w-]+) (INT|UINT|REAL|BYTES|LIST)\b")


def numeric_flags(path, positional):
    out = subprocess.run([path] + positional[:1] + ["--help"], capture_output=True, text=True,
                         timeout=60).stdout
    return [(m.group(1), m.group(2)) for m in map(HELP_LINE.match, out.splitlines()) if m]


def run_case(label, cmd, mpi, env, want):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", str(e.stdout or "") + str(e.stderr or "")
    dt = time.time() - t0
    lines = [l for l in out.splitlines() if ": error: " in l and all(w in l for w in want)]
    ranks = {m.group(1) for l in lines for m in [re.search(r"\[rank (\d+)\]: error: ", l)] if m}
    problems = []
    if rc != 2:
        problems.append(f"exit {rc}, expected 2")
    if mpi and len(ranks) != NP:
        problems.append(f"{len(ranks)} of {NP} ranks named {want}")
    if not mpi and not lines:
        problems.append(f"no '<prog>: error:' line naming {want}")
    if dt > 30:
        problems.append(f"took {dt:.0f} s")
    return label, problems, out


def main():
    cases = []
    list_flags = []
    env = dict(os.environ)
    for name, (rel, mpi, positional, base) in PROGRAMS.items():
        path = os.path.join(BUILD, rel)
        if not os.path.exists(path):
            print(f"skip: {name} (not built)")
            continue
        flags = numeric_flags(path, positional)
        if not flags:
            print(f"FAIL: {name}: no numeric flags found in --help")
            return 1
        for flag, kind in flags:
            if kind not in KINDS:
                continue
            for bad in BAD[kind]:
                args = list(positional)
                for f, v in base.items():
                    if f != flag:
                        args += [f, v]
                args += [f"{flag}={bad}"]
                cmd = ([*MPIRUN, "-np", str(NP), "-x", "HSDP_RANKS_PER_NODE=1", path] if mpi
                       else [path]) + args
                cases.append((f"{name} {flag} {bad!r}", cmd, mpi, env,
                              [flag, bad, *WANT_EXTRA.get(kind, [])]))
            if kind == "LIST":
                list_flags.append(f"{name} {flag}")
    if "LIST" in KINDS:
        # train_mlp --dims at least: none found means --help stopped showing the LIST type.
        print(f"list flags: {', '.join(list_flags)}")
        if not any(f == "train_mlp --dims" for f in list_flags):
            print("FAIL: train_mlp --dims not found as a LIST flag in its --help")
            return 1
    hsdp_env = subprocess.run([os.path.join(BUILD, "tools/hsdp-env")], capture_output=True,
                              text=True, timeout=60).stdout
    mlp = os.path.join(BUILD, "examples/train_mlp")
    for m in re.finditer(r"^(HSDP_\w+)\s+(int|number)\s", hsdp_env if "ENV" in KINDS else "",
                         re.M):
        var, kind = m.group(1), m.group(2)
        if var in ENV_SKIP:
            print(f"skip: {var} ({ENV_SKIP[var]})")
            continue
        mpi_extra, prog_extra = ENV_NEEDS.get(var, ([], []))
        for bad in (["12x", "18446744073709551616"] if kind == "int" else ["nan", "-1"]):
            cmd = [*MPIRUN, "-np", str(NP), "-x", "HSDP_RANKS_PER_NODE=1", "-x", f"{var}={bad}",
                   *mpi_extra, mlp, "--steps", "1", *prog_extra]
            cases.append((f"env {var}={bad}", cmd, True, env, [var, bad]))
    fails = 0
    # Six at a time: a case is mostly mpirun starting and ending (about 1.5 s, of which 0.15 s
    # of CPU), so six keep the two cores busy without slowing any case near the 30 s bound.
    with ThreadPoolExecutor(max_workers=6) as pool:
        for label, problems, out in pool.map(lambda c: run_case(*c), cases):
            if problems:
                fails += 1
                tail = "\n".join(out.splitlines()[-6:])
                print(f"FAIL: {label}: {'; '.join(problems)}\n{tail}\n")
    print(f"{len(cases)} bad inputs over {len(PROGRAMS)} programs and the environment, "
          f"{fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
