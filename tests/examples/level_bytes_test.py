#!/usr/bin/env python3
"""The bytes each level moves per step, counted by the transports, against hsdp-plan's
prediction, to the byte (fp32; docs/collectives.md, "Bytes sent").

train_mlp runs on virtual nodes (HSDP_RANKS_PER_NODE) and prints under every step row
  bytes: intra I inter E replica P shard S (sent by all ranks this step)
(Comm::bytesSent of each level's communicators, summed over the ranks). hsdp-plan, given the
same units (one per layer of --dims: out * (in + 1) parameters), mesh and mode, predicts
level_bytes_per_step in its JSON from its own formulas (include/hsdp/plan.h). Every step of every
case must match on the three levels the planner models. The cases: 2 x 2 and 3 x 2, zero1,
zero2 and zero3 with and without replicas, hpZ, and units that do not divide by the shard group
(padding); the MPI reduce-scatter's ring and exchange (HSDP_MPI_RS_ALGO) besides its default on
one host (cross-memory reads), and UCX on both levels, so real sends and reads are counted on
every path.
With --train-gpt, train_gpt --preset tiny too: its units by closed form (wte V*d used twice,
as the embedding and the tied LM head; wpe T*d; each block 12 d^2 + 13 d; ln_f 2 d), handed to
hsdp-plan as 'NAME COUNT USES' lines, so zero3's per-use gathers of wte are checked as well.
usage: level_bytes_test.py --mpirun "mpirun ..." --train-mlp BIN --plan hsdp-plan [--ucx]
                           [--train-gpt BIN]
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

STEPS = 3
DIMS = [24, 40, 33, 10]  # units of 1000, 1353, 340 parameters: none divides by 3, 4 or 6
# Units of 2 MiB and more: every UCX collective over its 32 KiB small-message limit, where its
# schedules are the bandwidth-optimal ones the planner models (below it, its latency-optimal
# reduce-scatter sends the whole buffer each round: more bytes, counted as sent).
LARGE = [512, 1024, 1024, 10]
UCX = {"HSDP_TRANSPORT_INTRA": "ucx", "HSDP_TRANSPORT_INTER": "ucx"}
LINE = re.compile(r"^\s*bytes: intra (\d+) inter (\d+) replica (\d+) shard (\d+) ")

# (nodes, ranks per node, mode, intra, inter, hpz, extra environment, dims)
CASES = [
    (2, 2, "zero3", 2, 2, False, {}, DIMS),  # no replicas
    (2, 2, "zero3", 2, 1, False, {}, DIMS),  # 2 replicas across nodes
    (2, 2, "zero1", 1, 2, False, {"HSDP_MPI_RS_ALGO": "ring"}, DIMS),  # 2 replicas in a node
    (3, 2, "zero2", 2, 3, False, {"HSDP_MPI_RS_ALGO": "exchange"}, DIMS),  # no replicas
    (3, 2, "zero2", 1, 3, False, {}, DIMS),  # 2 replicas
    (3, 2, "zero1", 2, 3, False, {}, DIMS),  # no replicas
    (3, 2, "zero3", 2, 1, False, {"HSDP_MPI_RS_ALGO": "ring"}, DIMS),  # 3 replicas: uneven ring
    (3, 2, "zero3", 2, 3, True, {}, DIMS),  # hpZ
    (3, 2, "zero3", 2, 1, False, UCX, LARGE),  # UCX's real sends, 3 replicas
]

# train_gpt --preset tiny: 4 layers, d 128, context 64, vocab 256. (name, count, uses)
D_GPT, T_GPT, V_GPT, L_GPT = 128, 64, 256, 4
GPT_UNITS = ([("wte", V_GPT * D_GPT, 2), ("wpe", T_GPT * D_GPT, 1)] +
             [(f"h{l}", 12 * D_GPT * D_GPT + 13 * D_GPT, 1) for l in range(L_GPT)] +
             [("ln_f", 2 * D_GPT, 1)])
# (intra, inter, hpz) on 2 nodes x 2 ranks, zero3: replicas, two levels, hpZ, inter only
GPT_CASES = [(2, 1, False), (2, 2, False), (2, 2, True), (1, 2, False)]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(cmd, env=None, timeout=300):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def compare(name, out, want):
    got = [tuple(int(g) for g in m.groups()) for m in map(LINE.match, out.stdout.splitlines())
           if m]
    check(len(got) == STEPS, f"{name}: {len(got)} bytes lines, want {STEPS}")
    for step, (gi, ge, gr, _) in enumerate(got):
        check((gi, ge, gr) == (want["intra"], want["inter"], want["replica"]),
              f"{name}: step {step}: counted intra {gi} inter {ge} replica {gr}, "
              f"hsdp-plan says intra {want['intra']} inter {want['inter']} "
              f"replica {want['replica']}")
    print(f"{name}: plan intra {want['intra']} inter {want['inter']} replica "
          f"{want['replica']}; counted {got}")


def check_gpt(a, tmp):
    layers = os.path.join(tmp, "gpt_units.txt")
    with open(layers, "w") as f:
        for name, count, uses in GPT_UNITS:
            f.write(f"{name} {count} {uses}\n")
    for intra, inter, hpz in GPT_CASES:
        name = f"train_gpt tiny 2x2 zero3 I{intra} J{inter}{' hpz' if hpz else ''}"
        pr = run([a.plan, "--layers", layers, "--nodes", "2", "--gpus-per-node", "2",
                  "--intra-shard", str(intra), "--inter-shard", str(inter), "--mode", "zero3",
                  "--param-dtype", "fp32", "--json"] + (["--hpz"] if hpz else []))
        check(pr.returncode == 0, f"{name}: hsdp-plan exit {pr.returncode}: {pr.stderr}")
        if pr.returncode != 0:
            continue
        cmd = shlex.split(a.mpirun) + ["-np", "4", "-x", "HSDP_RANKS_PER_NODE=2", a.train_gpt,
                                       "--preset", "tiny", "--batch", "4", "--steps", str(STEPS),
                                       "--intra-shard", str(intra), "--inter-shard", str(inter),
                                       "--eval-every", "0", "--sample", "0"] + (
                                           ["--hpz"] if hpz else [])
        out = run(cmd, dict(os.environ))
        check(out.returncode == 0,
              f"{name}: train_gpt exit {out.returncode}: {out.stderr[-2000:]}")
        compare(name, out, json.loads(pr.stdout)["level_bytes_per_step"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mpirun", required=True)
    p.add_argument("--train-mlp", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--ucx", action="store_true", help="the build has the UCX transport")
    p.add_argument("--train-gpt", help="also train_gpt --preset tiny (a tied unit)")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="hsdp-level-bytes.")
    for nodes, rpn, mode, intra, inter, hpz, extra, dims in CASES:
        if extra is UCX and not a.ucx:
            continue  # built without UCX: the MPI cases only
        name = f"{nodes}x{rpn} {mode} I{intra} J{inter}{' hpz' if hpz else ''} {extra or ''}"
        layers = os.path.join(tmp, "units.txt")
        with open(layers, "w") as f:
            for l in range(len(dims) - 1):
                f.write(f"layer{l} {dims[l + 1] * (dims[l] + 1)}\n")
        plan_cmd = [a.plan, "--layers", layers, "--nodes", str(nodes), "--gpus-per-node",
                    str(rpn), "--intra-shard", str(intra), "--inter-shard", str(inter),
                    "--mode", mode, "--param-dtype", "fp32", "--json"] + (["--hpz"] if hpz else [])
        pr = run(plan_cmd)
        check(pr.returncode == 0, f"{name}: hsdp-plan exit {pr.returncode}: {pr.stderr}")
        if pr.returncode != 0:
            continue
        want = json.loads(pr.stdout)["level_bytes_per_step"]
        env = dict(os.environ)
        xs = ["-x", f"HSDP_RANKS_PER_NODE={rpn}"]
        for k, v in extra.items():
            xs += ["-x", f"{k}={v}"]
        cmd = shlex.split(a.mpirun) + ["-np", str(nodes * rpn)] + xs + [
            a.train_mlp, "--mode", mode, "--intra-shard", str(intra), "--inter-shard",
            str(inter), "--dims", ",".join(map(str, dims)), "--batch", "24", "--steps",
            str(STEPS)] + (["--hpz"] if hpz else [])
        out = run(cmd, env)
        check(out.returncode == 0, f"{name}: train_mlp exit {out.returncode}: {out.stderr[-2000:]}")
        compare(name, out, want)
    if a.train_gpt:
        check_gpt(a, tmp)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("all cases match hsdp-plan to the byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
