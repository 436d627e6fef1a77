#!/bin/bash
# Start-up cost of the launch styles on the emulated 2-node cluster: seconds from the launcher's
# start to train_gpt's first step line (MPI start, mesh, topology, model, first step), medians of
# REPEATS, side by side in one run:
#   srun         srun --mpi=pmix (direct launch, Slurm's PMIx server)
#   salloc+mpi   mpirun inside a Slurm allocation (Open MPI starts its daemons with srun)
#   mpirun+rsh   mpirun with a hostfile and tests/cluster's rsh agent (cluster.sh, no Slurm)
#
#   bench/launch_bench.sh [BUILD_DIR] [REPEATS]      (root; brings the cluster up itself)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "${1:-$here/../build}" 2>/dev/null && pwd)
reps=${2:-5}
args=(--preset tiny --batch 6 --eval-batches 0 --steps 2)

# first_step OUT T0 PID: seconds from T0 until OUT shows step 1 (-1: PID ended first)
first_step() {
    local out=$1 t0=$2 pid=$3
    while ! grep -qE '^ *1/2 ' "$out" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || { echo -1; return; }
        sleep 0.01
    done
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f\n", b - a }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

if [ "${1:-}" = --inside ]; then
    build=$2 reps=$3 style=$4
    out=$(mktemp)
    for ((i = 0; i < reps; i++)); do
        : >"$out"
        t0=$(date +%s.%N)
        case $style in
        srun) srun --mpi=pmix -N 2 --ntasks-per-node 3 "$build/examples/train_gpt" "${args[@]}" >"$out" 2>&1 & ;;
        salloc) OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 salloc -Q -N 2 --ntasks-per-node 3 \
                    mpirun --bind-to none "$build/examples/train_gpt" "${args[@]}" >"$out" 2>&1 & ;;
        esac
        pid=$!
        first_step "$out" "$t0" "$pid"
        wait "$pid"
    done
    rm -f "$out"
    exit 0
fi

# (after --inside, whose arguments are the script's own)
[[ $reps =~ ^[1-9][0-9]?$ ]] || { echo "launch_bench: REPEATS must be 1..99 (got '$reps')" >&2; exit 2; }
[ -x "$build/examples/train_gpt" ] || { echo "launch_bench: no train_gpt in '${1:-build}'" >&2; exit 2; }

run_style() {  # run_style NAME: REPEATS timings, one per line
    case $1 in
    mpirun)
        for ((i = 0; i < reps; i++)); do
            out=$(mktemp)
            t0=$(date +%s.%N)
            "$here/../tests/cluster/cluster.sh" --nodes 2 --ranks-per-node 3 -- \
                "$build/examples/train_gpt" "${args[@]}" >"$out" 2>&1 &
            pid=$!
            t=$(first_step "$out" "$t0" "$pid")
            wait "$pid"
            # less the namespaces' bring-up, which the Slurm styles' clusters did before
            up=$(sed -nE 's/^cluster.sh: bring-up ([0-9.]+) s;.*/\1/p' "$out")
            awk -v t="$t" -v u="${up:-0}" 'BEGIN { printf "%.3f\n", (t < 0) ? t : t - u }'
            rm -f "$out"
        done ;;
    *) "$here/../tests/cluster/slurm.sh" --nodes 2 --cpus-per-node 3 -- \
           "$here/launch_bench.sh" --inside "$build" "$reps" "$1" 2>/dev/null | grep -E '^-?[0-9.]+$' ;;
    esac
}
printf '# train_gpt tiny, 2 nodes x 3 ranks, %d repeats: seconds from launch to step 1\n' "$reps"
printf '%-12s %10s %10s %10s\n' launch median min max
for s in srun salloc mpirun; do
    t=$(run_style $s)
    name=$s; [ $s = salloc ] && name=salloc+mpi; [ $s = mpirun ] && name=mpirun+rsh
    printf '%-12s %10s %10s %10s\n' "$name" "$(echo "$t" | median)" "$(echo "$t" | sort -n | head -1)" "$(echo "$t" | sort -n | tail -1)"
done
