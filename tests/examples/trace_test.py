#!/usr/bin/env python3
"""The step timeline end to end (docs/trace.md): train_mlp on 6 ranks as 2 virtual nodes x 3
(zero3, shard group 3 inside a node, 2 replicas across nodes) with --trace, then hsdp-trace.

Checked against closed forms of the configuration, not against the program's own counts:
  - every rank's file parses (python's json) and names its process and lanes;
  - per rank and step: 2 gathers per unit (forward, backward), 1 reduce-scatter and 1 replica
    all-reduce per unit, 1 step event;
  - the bytes of a gather / reduce-scatter = ceil(n/3) * 3 * 4 (the unit's shard x the group), of
    a replica all-reduce = ceil(n/3) * 4, n = out * (in + 1) per layer of --dims;
  - per rank and step, the "bytes sent" events: intra = 3 gathers' and reduce-scatter's (I-1)
    shards per unit, replica = each shard once (a ring of 2), inter 0;
  - events on one lane of one rank do not overlap;
  - the merge puts every rank on rank 0's clock (ts - clock_offset_us, and each step's events of
    all ranks overlap in time: the ranks meet in its collectives);
  - the split under each step row adds up to the step time;
  - the SVG parses as XML (libxml2, trace_svg_rows) with one row per rank x lane;
  - bad input to hsdp-trace: a clear error naming the file, exit 2, no hang; a --trace directory
    that cannot be made: an error naming it on every rank.
usage: trace_test.py --mpirun "mpirun ..." --train-mlp BIN --tool hsdp-trace --svg-rows BIN
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

DIMS = [24, 40, 33, 10]
STEPS = 4
RANKS, RPN, SHARDS = 6, 3, 3
LANES = 6  # compute gather reduce-scatter replica copies step

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(cmd, timeout=300, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mpirun", required=True)
    p.add_argument("--train-mlp", required=True)
    p.add_argument("--tool", required=True)
    p.add_argument("--svg-rows", required=True)
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="hsdp-trace-test.")
    tdir = os.path.join(tmp, "trace")
    cmd = shlex.split(a.mpirun) + ["-np", str(RANKS), "-x", f"HSDP_RANKS_PER_NODE={RPN}",
                                   a.train_mlp, "--mode", "zero3", "--intra-shard", str(SHARDS),
                                   "--inter-shard", "1", "--dims", ",".join(map(str, DIMS)),
                                   "--batch", "48", "--steps", str(STEPS), "--trace", tdir]
    out = run(cmd)
    print(out.stdout[-3000:], out.stderr[-2000:])
    if out.returncode != 0:
        print("trace_test: FAIL: train_mlp exited", out.returncode)
        return 1

    # The split adds up to the step time (each part printed to 0.1 ms).
    splits = [l for l in out.stdout.splitlines() if l.strip().startswith("split:")]
    check(len(splits) == STEPS, f"{len(splits)} split lines, expected {STEPS}")
    for l in splits:
        nums = [float(x) for x in re.findall(r"(-?[0-9]+\.[0-9])", l.split("=")[0])]
        total = float(re.search(r"= ([0-9.]+) ms", l).group(1))
        check(len(nums) == 6 and abs(sum(nums) - total) < 0.35, f"split does not add up: {l}")

    units = len(DIMS) - 1
    numel = [DIMS[l + 1] * (DIMS[l] + 1) for l in range(units)]
    shard = [-(-n // SHARDS) for n in numel]
    docs = {}
    for r in range(RANKS):
        path = os.path.join(tdir, f"trace.rank{r}.json")
        with open(path) as f:
            docs[r] = json.load(f)
        d = docs[r]
        check(d["otherData"]["rank"] == r and d["otherData"]["dropped"] == 0, f"rank {r} metadata")
        meta = [e for e in d["traceEvents"] if e["ph"] == "M"]
        names = {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
        check(len(names) == LANES, f"rank {r}: lanes {sorted(names)}")
        pname = [e["args"]["name"] for e in meta if e["name"] == "process_name"]
        check(pname == [f"rank {r} (node {r // RPN})"], f"rank {r}: process name {pname}")
        ev = [e for e in d["traceEvents"] if e["ph"] == "X"]
        check(all(e["pid"] == r for e in ev), f"rank {r}: pid")
        for s in range(STEPS):
            at = [e for e in ev if e["args"]["step"] == s]
            count = lambda n: sum(1 for e in at if e["name"] == n)
            check(count("gather") == 2 * units, f"rank {r} step {s}: {count('gather')} gathers")
            check(count("reduce-scatter") == units, f"rank {r} step {s}: reduce-scatters")
            check(count("replica all-reduce") == units, f"rank {r} step {s}: replica all-reduces")
            check(count("step") == 1, f"rank {r} step {s}: step events")
            check(count("wait gather") == 2 * units, f"rank {r} step {s}: gather waits")
            # The step's bytes per level (zero length, at the step's end): intra, 3 passes of
            # (I-1) = 2 shards per unit; the replica ring over 2 ranks sends each shard once.
            sent = {e["args"]["level"]: e["args"]["bytes"] for e in at if e["name"] == "bytes sent"}
            want = {"intra": 3 * (SHARDS - 1) * sum(shard) * 4, "inter": 0,
                    "replica": sum(shard) * 4, "intra+inter": sent.get("intra+inter", -1)}
            check(count("bytes sent") == 4 and sent == want,
                  f"rank {r} step {s}: bytes sent {sent}, expected {want}")
            for e in at:
                u = e["args"]["unit"]
                if e["name"] in ("gather", "reduce-scatter"):
                    check(e["args"]["bytes"] == shard[u] * SHARDS * 4 and
                          e["args"]["level"] == "intra", f"rank {r}: {e}")
                if e["name"] == "replica all-reduce":
                    check(e["args"]["bytes"] == shard[u] * 4 and e["args"]["level"] == "replica",
                          f"rank {r}: {e}")
        lanes = {}
        for e in ev:
            check(e["dur"] >= 0, f"rank {r}: negative duration {e}")
            lanes.setdefault(e["tid"], []).append(e)
        for tid, es in lanes.items():
            es.sort(key=lambda e: e["ts"])
            for x, y in zip(es, es[1:]):
                check(y["ts"] >= x["ts"] + x["dur"], f"rank {r} lane {tid}: {x} overlaps {y}")

    # The merge: one file, rank 0's clock.
    merged = os.path.join(tmp, "all.json")
    m = run([a.tool, "merge", tdir, "-o", merged], timeout=60)
    check(m.returncode == 0, f"merge exited {m.returncode}: {m.stderr}")
    with open(merged) as f:
        md = json.load(f)
    mev = [e for e in md["traceEvents"] if e["ph"] == "X"]
    check(len(mev) == sum(sum(1 for e in docs[r]["traceEvents"] if e["ph"] == "X")
                          for r in docs), "merge lost events")
    for r in docs:
        off = docs[r]["otherData"]["clock_offset_us"]
        orig = sorted(e["ts"] - off for e in docs[r]["traceEvents"] if e["ph"] == "X")
        check(orig == sorted(e["ts"] for e in mev if e["pid"] == r), f"rank {r}: merged ts")
    for s in range(STEPS):
        st = [e for e in mev if e["name"] == "step" and e["args"]["step"] == s]
        check(len(st) == RANKS, f"merged step {s}: {len(st)} step events")
        lo = max(e["ts"] for e in st)
        hi = min(e["ts"] + e["dur"] for e in st)
        check(lo <= hi, f"merged step {s}: the ranks' steps do not overlap ({lo} > {hi})")

    # The picture: steps 1..2, one row per rank x lane.
    svg = os.path.join(tmp, "step.svg")
    v = run([a.tool, "svg", tdir, "-o", svg, "--steps", "1:2"], timeout=60)
    check(v.returncode == 0, f"svg exited {v.returncode}: {v.stderr}")
    rows = run([a.svg_rows, svg], timeout=60)
    check(rows.returncode == 0, f"the SVG is not XML: {rows.stderr}")
    keys = {tuple(l.split()[1:3]) for l in rows.stdout.splitlines()}
    check(len(rows.stdout.splitlines()) == RANKS * LANES and len(keys) == RANKS * LANES,
          f"{len(rows.stdout.splitlines())} rows, expected {RANKS * LANES}")
    boxes = sum(int(l.split()[3]) for l in rows.stdout.splitlines())
    check(boxes == sum(1 for e in mev if e["args"]["step"] in (1, 2)), f"{boxes} boxes")

    # Bad input: exit 2, the file named, quickly.
    def bad(name, files, want, args=()):
        d = os.path.join(tmp, "bad-" + name)
        os.makedirs(d)
        for fname, text in files.items():
            with open(os.path.join(d, fname), "w") as f:
                f.write(text)
        b = run([a.tool, "svg", d, "-o", os.path.join(tmp, name + ".svg"), *args], timeout=30)
        ok = b.returncode == 2 and "hsdp-trace: error: " in b.stderr and want in b.stderr
        check(ok, f"bad input {name}: rc {b.returncode}, stderr {b.stderr!r}, want {want!r}")

    good = open(os.path.join(tdir, "trace.rank0.json")).read()
    f0 = "trace.rank0.json"
    bad("empty", {}, "no trace.rank<N>.json files")
    bad("corrupt", {f0: good[: len(good) // 2]}, f0)
    bad("deep", {f0: "[" * 100000 + "]" * 100000}, "nested deeper")
    bad("not_trace", {f0: '{"a": 1}'}, f0 + ": no 'otherData'")
    bad("rank_mismatch", {"trace.rank3.json": good}, "the file is rank 3's")
    bad("huge_ts", {f0: good.replace('"ts":', '"ts":1e300, "x":', 1)}, "'ts'")
    bad("negative_dur", {f0: re.sub(r'"dur":[0-9]+', '"dur":-5', good, count=1)},
        "'dur' = -5 is outside")
    bad("huge_tid", {f0: good.replace('"tid":1,', '"tid":99999999,', 1)}, "'tid' = 99999999")
    bad("steps", {}, "--steps '5:1'", ("--steps", "5:1"))
    # A FIFO and a link in the trace's name: refused by name, never opened (no hang).
    for kind in ("fifo", "link"):
        d = os.path.join(tmp, "bad-" + kind)
        os.makedirs(d)
        if kind == "fifo":
            os.mkfifo(os.path.join(d, f0))
        else:
            os.symlink(os.path.join(tdir, f0), os.path.join(d, f0))
        b = run([a.tool, "merge", d, "-o", os.path.join(tmp, kind + ".json")], timeout=30)
        check(b.returncode == 2 and f0 + ": not a regular file" in b.stderr,
              f"bad input {kind}: rc {b.returncode}, stderr {b.stderr!r}")
    b = run([a.tool, "merge", os.path.join(tmp, "missing"), "-o", merged], timeout=30)
    check(b.returncode == 2 and "missing: not a directory" in b.stderr, f"missing dir: {b.stderr}")

    # A trace directory that cannot be made: an error on every rank naming it, no hang.
    nd = os.path.join(tmp, "file-not-dir")
    open(nd, "w").close()
    b = run(shlex.split(a.mpirun) + ["-np", "2", a.train_mlp, "--steps", "1", "--trace",
                                     os.path.join(nd, "x")], timeout=120)
    check(b.returncode != 0 and "trace directory (HSDP_TRACE, --trace)" in b.stdout + b.stderr,
          f"bad --trace: rc {b.returncode}, {(b.stdout + b.stderr)[-500:]!r}")

    if failures:
        print(f"trace_test: FAIL ({len(failures)} checks)")
        return 1
    print("trace_test: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
