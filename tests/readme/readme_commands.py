#!/usr/bin/env python3
"""Runs every command README.md shows, as written (issue 18: "every README command tested").

    readme_commands.py REPO [--list] [--only SUBSTRING]

The commands: every line of README.md's fenced code blocks (a trailing backslash continues a
line, `#` starts a comment), and every backticked span outside them that is a whole command line
(it starts with scripts/, build/, tests/ or bench/ and has arguments). Each runs with bash in one
scratch directory, in README order (later commands use what earlier ones wrote: the checkpoint
walk-through), where every top-level entry of the repository is a symbolic link: the relative
paths resolve as they do in a clone, and what the commands write (ckpt/, plan.svg, ...) lands in
the scratch directory, not in the tree. A command passes when it exits 0.

Not run, each for the reason given in SKIP (matched against the start of the command): commands
that need real nodes or a GPU, the test suite itself, and prose fragments that are not commands.
Every skip is printed, so a README command nobody runs cannot hide.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# Start of a command -> why it is not run here.
SKIP = {
    "scripts/test": "the test suite itself (this test runs inside it)",
    "mpirun -H nodeA:8,nodeB:8": "needs two real nodes named nodeA and nodeB",
    "srun --mpi=pmix -N 2": "needs a Slurm cluster; the slurm tests (tests/cluster/slurm_jobs.sh) "
    "run srun --mpi=pmix on the emulated one",
    "sbatch -N 2 --ntasks-per-node 4 examples/slurm/": "needs a Slurm cluster; the slurm tests "
    "submit both scripts to the emulated one",
    "... train_mlp": "an elision of two train_mlp command lines (--export / --init-from)",
    "scripts/device-check": "needs a GPU",
    "scripts/device-bundle": "packs the CUDA build for a GPU host (needs the CUDA build)",
    "build/examples/train_mlp_gpu": "needs a GPU",
    "build/examples/train_gpt --preset small": "prose: the program scripts/demo runs (run above)",
    # The demo with arguments: what differs from `scripts/demo` (run above) is only the
    # train_gpt command line the demo builds, which ctest readme.demo_args checks for each of
    # them; train_gpt at those meshes and modes: gpt_parity.8x2x4.zero3.i2.j2.accum3 and
    # gpt_parity.8x2x4.none. (Running both took 130 s of CPU: docs/design.md, Test time.)
    "scripts/demo --intra-shard 2 --inter-shard 2 --steps 10": "the demo's arguments only: "
    "ctest readme.demo_args; train_gpt at 2 x 2: gpt_parity.8x2x4.zero3.i2.j2.accum3",
    "scripts/demo --mode none --steps 10": "the demo's arguments only: ctest readme.demo_args; "
    "train_gpt in mode none on 2 x 4: gpt_parity.8x2x4.none",
    "scripts/demo --trace": "the demo again with --trace (70 s); ctest trace.mlp.6x2x3 runs "
    "--trace and both hsdp-trace subcommands on the files it writes",
    "build/tools/hsdp-trace merge /tmp/hsdp-trace": "reads the trace of the demo --trace run "
    "above (not run here); ctest trace.mlp.6x2x3 runs merge on the files it writes",
    "build/tools/hsdp-trace svg /tmp/hsdp-trace": "reads the trace of the demo --trace run "
    "above (not run here); ctest trace.mlp.6x2x3 runs svg on the files it writes",
    # Last: the prefix of every demo command above. The demo's 30 steps of the small preset with
    # --check took 171 s of CPU here; readme.demo runs the real script at 3 steps (42 s) and checks
    # its output, readme.demo_args the train_gpt command line it builds from its defaults.
    "scripts/demo": "the 30-step demo: ctest readme.demo runs this script at 3 steps (its output "
    "checked), readme.demo_args the command line it builds",
}
ROOT_ONLY = ("tests/cluster/cluster.sh",)  # network namespaces: root only
# The Python package's environment: made by scripts/python-env, which scripts/test runs first.
PYENV = "build/pyenv/"
repo_dir = "."
RUNNABLE = re.compile(r"^(scripts|build|tests|bench)/\S+ \S")


def strip_comment(line):
    # A '#' after whitespace (or at the start) begins a comment; a '#' inside a word does not.
    m = re.search(r"(^|\s)#", line)
    return line[: m.start()].rstrip() if m else line.rstrip()


def commands(readme):
    out, in_block, pending = [], False, ""
    for raw in readme.splitlines():
        if raw.lstrip().startswith("```"):
            in_block = not in_block
            pending = ""
            continue
        if in_block:
            line = strip_comment(raw)
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                continue
            line = (pending + line.strip()).strip()
            pending = ""
            if line:
                out.append(re.sub(r"\s+", " ", line))
        else:
            for span in re.findall(r"`([^`]+)`", raw):
                if RUNNABLE.match(span):
                    out.append(span)
    seen, unique = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            unique.append(c)
    return unique


def skip_reason(cmd):
    for prefix, why in SKIP.items():
        if cmd.startswith(prefix):
            return why
    if cmd.startswith(ROOT_ONLY) and os.geteuid() != 0:
        return "needs root (network namespaces)"
    if cmd.startswith(PYENV) and not os.path.exists(os.path.join(repo_dir, PYENV, "bin/python")):
        return "no build/pyenv: scripts/python-env makes it (scripts/test runs it first)"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--list", action="store_true", help="print the commands and exit")
    ap.add_argument("--only", default="", help="run only commands containing this text")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per command")
    a = ap.parse_args()
    global repo_dir
    repo = repo_dir = os.path.realpath(a.repo)
    with open(os.path.join(repo, "README.md")) as f:
        cmds = commands(f.read())
    if a.list:
        for c in cmds:
            why = skip_reason(c)
            print(("skip: " if why else "run:  ") + c + (f"   ({why})" if why else ""))
        return 0
    scratch = tempfile.mkdtemp(prefix="hsdp-readme-")
    for name in os.listdir(repo):
        if name != ".git":
            os.symlink(os.path.join(repo, name), os.path.join(scratch, name))
    fails = ran = 0
    try:
        for c in cmds:
            if a.only and a.only not in c:
                continue
            why = skip_reason(c)
            if why:
                print(f"skip: {c}\n      ({why})", flush=True)
                continue
            t0 = time.time()
            try:
                p = subprocess.run(["bash", "-o", "pipefail", "-c", c], cwd=scratch,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   timeout=a.timeout)
                rc, out = p.returncode, p.stdout.decode(errors="replace")
            except subprocess.TimeoutExpired as e:
                rc, out = "timeout", (e.stdout or b"").decode(errors="replace")
            ran += 1
            dt = time.time() - t0
            if rc == 0:
                print(f"ok ({dt:.1f} s): {c}", flush=True)
            else:
                fails += 1
                tail = "\n".join(out.splitlines()[-25:])
                print(f"FAIL (exit {rc}, {dt:.1f} s): {c}\n{tail}\n", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{ran} README commands run, {fails} failed")
    return 1 if fails or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
