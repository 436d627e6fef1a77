#!/usr/bin/env bash
# The Slurm world-of-one trap (srun without --mpi=pmix): Slurm says the step has N > 1 tasks but
# MPI_COMM_WORLD has 1 rank. Every task must exit 2 naming both numbers and the fix; a step of
# one task, no Slurm, an MPI world > 1 (mpirun inside an allocation) or HSDP_ALLOW_WORLD_OF_ONE=1
# must run.
#   world_of_one.sh MPIRUN PROGRAM [ARGS...]
set -u
mpirun=$1; shift
fails=0
fail() { echo "world_of_one: FAIL: $*"; fails=$((fails + 1)); }
unset SLURM_NTASKS SLURM_STEP_NUM_TASKS HSDP_ALLOW_WORLD_OF_ONE
want_fix='launch with srun --mpi=pmix'

# Three tasks started as separate singletons, as srun without a PMI plugin does: each exits 2.
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
for t in 0 1 2; do
  (SLURM_NTASKS=3 SLURM_PROCID=$t timeout 60 "$@" >"$dir/out.$t" 2>&1; echo $? >"$dir/rc.$t") &
done
wait
for t in 0 1 2; do
  rc=$(cat "$dir/rc.$t")
  [ "$rc" = 2 ] || fail "task $t: exit $rc, expected 2"
  grep -q "SLURM_NTASKS=3 but MPI_COMM_WORLD has 1 rank" "$dir/out.$t" || fail "task $t: no message naming 3 and 1"
  grep -qF "$want_fix" "$dir/out.$t" || fail "task $t: the message does not name the fix"
done
echo "--- task 0 said:"; cat "$dir/out.0"

# mpirun -np 1 with the job's SLURM_NTASKS=6 (and no step count): the same error.
out=$(SLURM_NTASKS=6 timeout 60 "$mpirun" --oversubscribe -np 1 "$@" 2>&1); rc=$?
[ $rc = 2 ] || fail "mpirun -np 1, SLURM_NTASKS=6: exit $rc, expected 2"
echo "$out" | grep -q "SLURM_NTASKS=6 but MPI_COMM_WORLD has 1 rank" || fail "mpirun -np 1: no message naming 6 and 1"

# Must run: no Slurm; a step of one task in a job of 6 (srun -n1); the escape hatch; a world of 2
# under the job's SLURM_NTASKS=6 (sbatch script calling mpirun).
run_ok() {
  local what=$1; shift
  out=$(timeout 120 "$@" 2>&1); rc=$?
  [ $rc = 0 ] || { fail "$what: exit $rc, expected 0"; echo "$out" | tail -5; }
}
run_ok "no Slurm" env "$@"
run_ok "SLURM_NTASKS=1" env SLURM_NTASKS=1 "$@"
run_ok "srun -n1 in a job of 6" env SLURM_NTASKS=6 SLURM_STEP_NUM_TASKS=1 "$@"
run_ok "HSDP_ALLOW_WORLD_OF_ONE=1" env SLURM_NTASKS=6 HSDP_ALLOW_WORLD_OF_ONE=1 "$@"
echo "$out" | grep -q "running alone (HSDP_ALLOW_WORLD_OF_ONE=1)" || fail "HSDP_ALLOW_WORLD_OF_ONE=1: no warning"
run_ok "mpirun -np 2 with SLURM_NTASKS=6" env SLURM_NTASKS=6 "$mpirun" --oversubscribe -np 2 "$@"

[ $fails = 0 ] || exit 1
echo "world_of_one: OK"
