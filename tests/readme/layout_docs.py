#!/usr/bin/env python3
"""layout.docs: the pictures of the folders match the tree.

  layout_docs.py <source root>

- docs/design.md's folder picture (the first fenced block under "## The house") names exactly
  the repository's top-level folders (as git sees the tree: scripts/repo_tree.py; dot-folders aside), and under
  src/ exactly src/'s folders;
- every path in the first column of README.md's "## Layout" table exists in the tree, and every
  top-level folder appears in that table;
- no two source files share a path's last two components (python/src/plan_binding.cc, not a
  second plan.cc beside src/plan/plan.cc; CMakeLists.txt, which every folder has, aside).
Fails naming each folder that is missing from a picture or named there but absent.
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts"))
from repo_tree import report, tree_files  # noqa: E402  (the tree every check reads)


def tracked_dirs(root):
    dirs = set()
    for path in tree_files(root):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return dirs


def design_picture(root):
    text = open(os.path.join(root, "docs/design.md"), encoding="utf-8").read()
    house = text.index("## The house")
    start = text.index("```", house)
    block = text[text.index("\n", start) + 1:text.index("```", start + 3)]
    top, under_src = set(), set()
    for line in block.splitlines():
        indented = line.startswith(" ")
        names = []
        for tok in line.split():
            if not re.fullmatch(r"[\w.-]+(/[\w.-]+)*/", tok):
                break  # the folder names come first; the description follows
            names.append(tok.split("/")[0])
        (under_src if indented else top).update(n for n in names if not n.startswith("."))
    return top, under_src


def readme_layout(root):
    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    section = text[text.index("## Layout"):]
    section = section[:section.index("\n## ", 3)] if "\n## " in section[3:] else section
    paths = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        paths += re.findall(r"`([^`]+)`", first)
    return paths


def main():
    root = os.path.abspath(sys.argv[1])
    dirs = tracked_dirs(root)
    top_dirs = {d for d in dirs if "/" not in d and not d.startswith(".")}
    src_dirs = {d.split("/")[1] for d in dirs if d.startswith("src/") and d.count("/") == 1}
    problems = []
    top, under_src = design_picture(root)
    for d in sorted(top_dirs - top):
        problems.append(f"docs/design.md: the folder picture misses top-level folder {d}/")
    for d in sorted(top - top_dirs):
        problems.append(f"docs/design.md: the folder picture names {d}/, which is not in the tree")
    for d in sorted(src_dirs - under_src):
        problems.append(f"docs/design.md: the folder picture misses src/{d}/")
    for d in sorted(under_src - src_dirs):
        problems.append(f"docs/design.md: the folder picture names src/{d}/, not in the tree")
    paths = readme_layout(root)
    for p in paths:
        if not os.path.exists(os.path.join(root, p.rstrip("/"))):
            problems.append(f"README.md: the layout table names {p}, which is not in the tree")
    named_tops = {p.rstrip("/").split("/")[0] for p in paths}
    for d in sorted(top_dirs - named_tops):
        problems.append(f"README.md: the layout table misses top-level folder {d}/")
    tails = {}
    for path in tree_files(root):
        parts = path.split("/")
        if len(parts) < 2 or parts[-1] == "CMakeLists.txt":
            continue
        tails.setdefault("/".join(parts[-2:]), []).append(path)
    for tail, same in sorted(tails.items()):
        if len(same) > 1:
            problems.append(f"{' and '.join(same)} share the last two components {tail}")
    return report("layout.docs", problems, f"{len(top_dirs)} top-level folders, {len(src_dirs)} "
                  f"under src/, {len(paths)} paths in README's table, {len(problems)} problems")


if __name__ == "__main__":
    sys.exit(main())
