#!/usr/bin/env bash
# hsdp.torch in elastic mode end to end (docs/torch.md "Elastic mode"): python/tests/torch/
# elastic.py (the MLP) as 3 replica groups x 2 ranks under hsdp-elastic, one rank of group 1
# killed (kill -9) after its step 8. Groups 0 and 2 go on without it ("groups 0,2 present"), the
# launcher restarts group 1, which heals from a peer and rejoins; every group (0, 2 and the
# restarted 1) PASSes parity against plain PyTorch replaying the committed membership.
#   torch_elastic_test.sh BUILD HSDP_ELASTIC MPIRUN [elastic.py args...]
# Exit 77 (skipped) only when the etcd binary or build/pyenv (torch) is absent.
set -u
build=$1 elastic=$2 mpirun=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
run=$here/run.sh
if ! command -v etcd >/dev/null; then
  echo "*** SKIPPED: the etcd binary is not in PATH (scripts/setup installs etcd-server)"
  exit 77
fi
if ! "$build/pyenv/bin/python" -c "import importlib.util as u, sys
sys.exit(not (u.find_spec('hsdp') and u.find_spec('torch')))" 2>/dev/null; then
  echo "*** SKIPPED: no hsdp or torch in $build/pyenv (run scripts/python-env)"
  exit 77
fi
. "$here/../elastic/elastic_lib.sh"

# Each rank's output in its own file: g<group>r<restart>.rank<rank>.log.
cat >"$tmp/group.sh" <<'EOF'
#!/usr/bin/env bash
out=$1; shift
exec "$@" >"$out/g${HSDP_ELASTIC_GROUP_INDEX}r${HSDP_ELASTIC_RESTARTS}.rank${OMPI_COMM_WORLD_RANK:-0}.log" 2>&1
EOF
chmod +x "$tmp/group.sh"

elastic_job="torch-$$"  # ranks_of: this job's ranks only
"$elastic" --groups 3 --np 2 --job "$elastic_job" --launcher "$mpirun" --launcher-args "$margs" \
  --grace 3 -- "$tmp/group.sh" "$tmp" "$run" "$build" --torch elastic.py "$@" \
  >"$tmp/launcher.out" 2>"$tmp/launcher.log" &
launcher=$!

wait_for "$tmp/g1r0.rank0.log" "^step 8/" 60 || fail "group 1 never reached step 8"
victim=$(ranks_of elastic.py 1 0 python | tail -1)
[ -n "$victim" ] || fail "no rank of group 1 found"
[ -n "$victim" ] && kill -9 $victim
finish 120
[ "$rc" = 0 ] || fail "hsdp-elastic exit $rc (want 0)"
grep -q "group 1 exited" "$tmp/launcher.log" || fail "the launcher did not see group 1 exit"
grep -qa "groups 0,2 present" "$tmp/g0r0.rank0.log" || fail "group 0 never ran without group 1"
grep -qaE "elastic: group 1 healed to step [0-9]+ from group [02]" "$tmp/g1r1.rank0.log" ||
  fail "the restarted group 1 did not heal"
for f in g0r0.rank0.log g1r1.rank0.log g2r0.rank0.log; do
  grep -qaE "parity vs plain PyTorch .* PASS" "$tmp/$f" ||
    fail "$f: no parity PASS: $(grep -aE 'parity|rror' "$tmp/$f" | tail -3)"
done
echo "--- launcher"
cat "$tmp/launcher.log"
for f in "$tmp"/g*.rank0.log; do
  echo "--- $(basename "$f")"
  grep -aE "healed|not committed|parity|rror|Traceback" "$f" | cut -c1-300 | head -12
  # the membership as it changes
  grep -aE "present" "$f" | awk '$7 != prev { print; prev = $7 }' | head -6
done
[ "$fails" = 0 ] && echo "PASS" || echo "FAILED: $fails"
[ "$fails" = 0 ]
