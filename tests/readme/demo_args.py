#!/usr/bin/env python3
"""scripts/demo's arguments, for every `scripts/demo [ARGS...]` command README.md shows (but
--trace, which ctest trace.mlp.6x2x3 covers): the train_gpt command line the demo starts.

    demo_args.py REPO

readme.demo runs the plain `scripts/demo` at 3 steps (training, parity and all; the plain
command's line here must carry README's 30 steps and the rest of its defaults); the commands with
arguments differ from it only in what scripts/demo hands train_gpt, and train_gpt's own runs at
those settings are the gpt_parity tests (8x2x4.zero3.i2.j2.accum3, 8x2x4.none: the same meshes
and modes on the tiny preset). So here the real scripts/demo runs in a scratch tree whose
scripts/setup does nothing and whose scripts/mpirun-local prints its arguments: the launch is
8 ranks as 2 virtual nodes x 4, every flag the user gave reaches train_gpt once with the user's
value (train_gpt refuses a flag given twice), the defaults the user did not name stay (the
small preset, --check), and mode none passes no shard factors.
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_commands import commands  # noqa: E402  (README's commands, as readme.commands reads them)


def flags(args):
    """'--flag value' and '--flag=value' pairs of an argument list -> {flag: [values]}."""
    out, i = {}, 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            i += 1
            continue
        if "=" in a:
            f, v = a.split("=", 1)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            f, v = a, args[i + 1]
            i += 2
        else:
            f, v = a, None
            i += 1
        out.setdefault(f, []).append(v)
    return out


def main():
    repo = os.path.realpath(sys.argv[1])
    with open(os.path.join(repo, "README.md")) as f:
        cmds = [c for c in commands(f.read())
                if c == "scripts/demo" or
                (c.startswith("scripts/demo ") and not c.startswith("scripts/demo --trace"))]
    if not cmds:
        print("FAIL: README.md shows no `scripts/demo ARGS...` command")
        return 1
    fails = 0
    with tempfile.TemporaryDirectory(prefix="hsdp-demo-args-") as tree:
        os.mkdir(os.path.join(tree, "scripts"))
        os.symlink(os.path.join(repo, "scripts/demo"), os.path.join(tree, "scripts/demo"))
        for name, body in (("setup", "exit 0\n"), ("mpirun-local", 'printf "%s\\n" "$@"\n')):
            path = os.path.join(tree, "scripts", name)
            with open(path, "w") as f:
                f.write("#!/usr/bin/env bash\n" + body)
            os.chmod(path, 0o755)
        for c in cmds:
            p = subprocess.run(["bash", "-c", c], cwd=tree, capture_output=True, text=True,
                               timeout=60)
            argv = p.stdout.splitlines()
            problems = []
            if p.returncode != 0:
                problems.append(f"exit {p.returncode}: {p.stderr.strip()}")
            gpt = os.path.join(tree, "build/examples/train_gpt")
            if gpt not in argv:
                problems.append(f"no {gpt} in the launch: {argv}")
            else:
                launch, args = argv[:argv.index(gpt)], argv[argv.index(gpt) + 1:]
                if launch != ["-np", "8", "-x", "HSDP_RANKS_PER_NODE=4"]:
                    problems.append(f"launch {launch}, not 8 ranks as 2 x 4")
                got, user = flags(args), flags(shlex.split(c)[1:])
                for f, v in got.items():
                    if len(v) != 1:
                        problems.append(f"{f} given {len(v)} times")
                for f, v in user.items():
                    if got.get(f, [None])[0] != v[-1]:
                        problems.append(f"{f}: train_gpt gets {got.get(f)}, the user gave {v}")
                if got.get("--preset") != ["small"] or "--check" not in got:
                    problems.append("the small preset or --check is gone")
                # The plain demo: README's "What the demo shows" (readme.demo runs it at 3 steps).
                want = {"--mode": ["zero3"], "--intra-shard": ["4"], "--inter-shard": ["1"],
                        "--steps": ["30"], "--batch": ["8"], "--eval-every": ["10"],
                        "--sample": ["160"]}
                if c == "scripts/demo" and any(got.get(f) != v for f, v in want.items()):
                    problems.append(f"the demo's defaults are not README's {want}")
                mode = got.get("--mode", [None])[0]
                if mode == "none" and ("--intra-shard" in got or "--inter-shard" in got):
                    problems.append("mode none with shard factors")
                print(f"{'FAIL' if problems else 'ok'}: {c}\n      train_gpt {' '.join(args)}")
            for problem in problems:
                print(f"      {problem}")
            fails += bool(problems)
    print(f"{len(cmds)} demo commands, {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
