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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts"))
from repo_tree import report, tree_files  # noqa: E402  (the tree every check reads)

DECL = re.compile(r'\b(IntParam|BoolParam|StringParam|NumberParam)\s+\w+\s*\{\s*"(HSDP_[A-Z0-9_]+)"')
RAW_READ = re.compile(r'\b(?:std::)?(?:secure_)?getenv\s*\(\s*"HSDP_')
SCANNED = ("core", "topology", "collectives", "offload", "src", "tools", "bench", "examples",
           "include")


def main():
    root, hsdp_env = sys.argv[1], sys.argv[2]
    declared = collections.defaultdict(list)
    problems = []
    for rel in tree_files(root, SCANNED):
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
    return report("env.declared", problems, f"{len(declared)} parameters declared, {len(listed)} "
                  f"listed by hsdp-env, {len(problems)} problems")


if __name__ == "__main__":
    sys.exit(main())
