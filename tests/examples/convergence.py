#!/usr/bin/env python3
"""Convergence with encoded inter wires: trains the same model from the same initialisation once per
wire (the engine's HSDP_INTER_PARAM_WIRE and HSDP_INTER_GRAD_WIRE, both set to it) and checks that
the final training loss and the validation loss of every run are within a relative tolerance of the
fp32 run's. With a quantized wire the Eigen parity no longer measures sharding; the loss does.

  convergence.py [--wires fp32,bf16,int8] [--tolerance 0.01] [--np 8] [--ranks-per-node 4]
                 [--mpirun mpirun ARGS...] [--curve-every 10] -- PROGRAM [ARGS...]

The program is any training example that prints one table row per step, "step loss ..."
(train_mlp) or "step/steps lr loss ..." (train_gpt), and a line matching --val-regex (default
'validation loss: <v>', train_mlp's --val-samples; train_gpt: 'val loss (...) after'). The first wire is the reference. Prints the
loss curves side by side (every --curve-every steps), the final losses and the verdict; exit 0
when every run is within the tolerance, 1 otherwise, 2 on bad input or a run that failed.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys

# A step's row: train_mlp's "step loss ...", train_gpt's "step/steps lr loss ...".
STEP_ROW = re.compile(r"^\s*(\d+)\s+(-?\d+\.\d+(?:[eE][-+]?\d+)?)\s")
GPT_STEP_ROW = re.compile(r"^\s*(\d+)/\d+\s+\S+\s+(-?\d+\.\d+(?:[eE][-+]?\d+)?)\s")


def run(args, wire):
    env = dict(os.environ)
    env["HSDP_INTER_PARAM_WIRE"] = wire
    env["HSDP_INTER_GRAD_WIRE"] = wire
    env["HSDP_RANKS_PER_NODE"] = str(args.ranks_per_node)
    cmd = shlex.split(args.mpirun) + ["-np", str(args.np)]
    for var in sorted(v for v in env if v.startswith("HSDP_")):
        cmd += ["-x", var]
    cmd += args.program
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=args.timeout)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        print(f"convergence: FAIL: the {wire} run exited {proc.returncode}")
        sys.exit(2)
    curve, val = {}, None
    val_re = re.compile(args.val_regex)
    for line in proc.stdout.splitlines():
        m = STEP_ROW.match(line) or GPT_STEP_ROW.match(line)
        if m:
            curve[int(m.group(1))] = float(m.group(2))
        v = val_re.search(line)
        if v:
            val = float(v.group(1))
    if not curve:
        sys.stdout.write(proc.stdout)
        print(f"convergence: FAIL: no step rows in the {wire} run's output")
        sys.exit(2)
    if val is None and not args.no_validation:
        sys.stdout.write(proc.stdout)
        print(f"convergence: FAIL: no line matching '{args.val_regex}' in the {wire} run")
        sys.exit(2)
    return curve, val


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wires", default="fp32,bf16,int8")
    p.add_argument("--tolerance", type=float, default=0.01)
    p.add_argument("--np", type=int, default=8)
    p.add_argument("--ranks-per-node", type=int, default=4)
    p.add_argument("--mpirun", default=os.environ.get("MPIEXEC", "mpirun") +
                   " --oversubscribe --bind-to none")
    p.add_argument("--curve-every", type=int, default=10)
    p.add_argument("--val-regex", default=r"validation loss: (-?[0-9.eE+-]+)")
    p.add_argument("--no-validation", action="store_true")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("program", nargs=argparse.REMAINDER)
    args = p.parse_args()
    if args.program and args.program[0] == "--":
        args.program = args.program[1:]
    if not args.program:
        p.error("no PROGRAM after --")
    wires = [w for w in args.wires.split(",") if w]
    results = {w: run(args, w) for w in wires}
    ref = wires[0]
    steps = sorted(results[ref][0])
    print(f"loss curves ({args.np} ranks, {args.ranks_per_node} per node): "
          f"{' '.join(shlex.quote(a) for a in args.program)}")
    print("%6s" % "step" + "".join("%12s" % w for w in wires))
    for s in steps:
        if s % args.curve_every == 0 or s == steps[0] or s == steps[-1]:
            print("%6d" % s + "".join("%12.5f" % results[w][0].get(s, float("nan")) for w in wires))
    ok = True
    last = steps[-1]
    print("\n%-6s %12s %12s %12s %12s" % ("wire", "final loss", "vs " + ref, "val loss", "vs " + ref))
    for w in wires:
        curve, val = results[w]
        fin, rfin = curve[last], results[ref][0][last]
        d = (fin - rfin) / rfin
        line = "%-6s %12.5f %+11.3f%%" % (w, fin, 100 * d)
        ok = ok and abs(d) <= args.tolerance
        if val is not None:
            rval = results[ref][1]
            dv = (val - rval) / rval
            line += " %12.5f %+11.3f%%" % (val, 100 * dv)
            ok = ok and abs(dv) <= args.tolerance
        print(line)
    print(f"\nconvergence: {'PASS' if ok else 'FAIL'} (tolerance {100 * args.tolerance:g}% of {ref})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
