"""What the repository's checks share (scripts/check-layers, tests/core/env_declared.py,
tests/readme/layout_docs.py): the tree they read, and how a test-style check reports.

The tree is what git tracks plus the untracked files it does not ignore (`git ls-files --cached
--others --exclude-standard`), so a build tree such as build/ or the one `pip install ./python`
used to leave in python/build/ is never part of it. Outside a git work tree, or when the root is
not the top of one (check-layers' self-test builds small trees in a temporary folder), it is
every file under the root.
"""
import os
import subprocess


def tree_files(root, tops=()):
    """The files of the tree at `root`, relative and sorted; only those under the folders `tops`
    when it is given."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard", "--", *tops],
                             capture_output=True, check=True).stdout
        inside = subprocess.run(["git", "-C", root, "rev-parse", "--show-prefix"],
                                capture_output=True, check=True).stdout.decode().strip()
        if inside == "":
            return sorted({p for p in out.decode().split("\0") if p
                           and os.path.isfile(os.path.join(root, p))})
    except (OSError, subprocess.CalledProcessError):
        pass
    rels = []
    for top in tops or ("",):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            rels += [os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/")
                     for n in names]
    return sorted(rels)


def report(check, problems, summary):
    """Prints each problem and the summary line, prefixed with the check's name; the exit code
    (1 when there are problems)."""
    for p in problems:
        print(f"{check}: {p}")
    print(f"{check}: {summary}")
    return 1 if problems else 0
