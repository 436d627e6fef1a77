#!/usr/bin/env python3
"""env.declared: every HSDP_* environment parameter is declared once, where it is read, and
hsdp-env (which links every object of the library) lists exactly the declared set.

  env_declared.py <source root> <hsdp-env binary>

Fails when a name is declared twice (two readers with two defaults), when hsdp-env lists a name
no source declares or misses one that is declared, or when a source reads an HSDP_* variable
around hsdp/env.h (std::getenv / getenv / secure_getenv of an "HSDP_..." literal). Tests may
declare parameters of their own (tests/ is not scanned).
"""
import collections
import os
import re
import subprocess
import sys

DECL = re.compile(r'\b(IntParam|BoolParam|StringParam|NumberParam)\s+\w+\s*\{\s*"(HSDP_[A-Z0-9_]+)"')
RAW_READ = re.compile(r'\b(?:std::)?(?:secure_)?getenv\s*\(\s*"HSDP_')
SCANNED = ("core", "topology", "collectives", "offload", "src", "tools", "bench", "examples",
           "include")


def tree_files(root):
    """The tracked tree (plus untracked files git does not ignore) under SCANNED: never a build
    tree; outside a git work tree, every file under SCANNED."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard", "--", *SCANNED],
                             capture_output=True, check=True).stdout.decode()
        return sorted(p for p in out.split("\0") if p and os.path.isfile(os.path.join(root, p)))
    except (OSError, subprocess.CalledProcessError):
        rels = []
        for top in SCANNED:
            for dirpath, _, names in os.walk(os.path.join(root, top)):
                rels += [os.path.relpath(os.path.join(dirpath, n), root) for n in names]
        return sorted(rels)


def main():
    root, hsdp_env = sys.argv[1], sys.argv[2]
    declared = collections.defaultdict(list)
    problems = []
    for rel in tree_files(root):
        if not rel.endswith((".h", ".cc", ".cu", ".cuh")):
            continue
        text = open(os.path.join(root, rel), encoding="utf-8", errors="replace").read()
        text = re.sub(r"//[^\n]*", "", text)  # comments (examples in docs) do not count
        for m in DECL.finditer(text):
            declared[m.group(2)].append(rel)
        for m in RAW_READ.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{rel}:{line}: reads an HSDP_* variable around hsdp/env.h")
    for name, where in sorted(declared.items()):
        if len(where) > 1:
            problems.append(f"{name} is declared {len(where)} times: {', '.join(where)}")
    out = subprocess.run([hsdp_env], capture_output=True, text=True, check=True).stdout
    listed = re.findall(r"^(HSDP_[A-Z0-9_]+)\s", out, re.M)
    for name, n in collections.Counter(listed).items():
        if n > 1:
            problems.append(f"hsdp-env lists {name} {n} times")
    for name in sorted(set(listed) - set(declared)):
        problems.append(f"hsdp-env lists {name}, which no source declares")
    for name in sorted(set(declared) - set(listed)):
        problems.append(f"{name} is declared ({declared[name][0]}) but hsdp-env does not list it")
    if not declared:
        problems.append("no declarations found: is the source root right?")
    for p in problems:
        print("env.declared:", p)
    print(f"env.declared: {len(declared)} parameters declared, {len(listed)} listed by hsdp-env, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
