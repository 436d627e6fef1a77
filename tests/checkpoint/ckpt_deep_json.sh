#!/usr/bin/env bash
# Deep JSON (issue 41): a manifest field, a safetensors header and an index nested 10^6 and 10^7
# levels deep (arrays and objects), through hsdp-ckpt inspect/verify/export and train_mlp
# --resume/--init-from: each refused within 2 s naming the depth limit, with peak RSS (the
# process and its children) under 256 MiB (hostile_json.py measure). The files are made here.
#   ckpt_deep_json.sh BUILD_DIR WORK_DIR SCRIPT_DIR
set -euo pipefail
build=$1; work=$2; here=$3
# shellcheck source=hostile_common.sh
source "$here/hostile_common.sh"
want="nested deeper than the limit of 64 levels"
fails=0
measure() { python3 "$hj" measure 256 2 "$want" -- "$@" || fails=$((fails + 1)); }
for kind in arrays objects; do
  for levels in 1000000 10000000; do
    name="$kind-$levels"
    python3 "$hj" deep-manifest "$good" "$work/m-$name" "$kind" "$levels"
    echo "manifest, $kind nested $levels deep ($(stat -c %s "$work/m-$name/manifest.json") bytes):"
    measure "$ckpt" inspect "$work/m-$name"
    measure "$ckpt" inspect --json "$work/m-$name"
    measure "$ckpt" verify "$work/m-$name"
    measure "$ckpt" export "$work/m-$name" "$work/out.safetensors"
    measure "$mlp" --mode none "${dims[@]}" --steps 2 --resume "$work/m-$name"
    rm -rf "$work/m-$name"
    # A safetensors header holds at most 100 MB: 10^7 objects (70 MB) still fit.
    python3 "$hj" deep-safetensors "$work/s-$name.safetensors" "$kind" "$levels"
    echo "safetensors header, $kind nested $levels deep:"
    measure "$mlp" --mode none "${dims[@]}" --steps 0 --init-from "$work/s-$name.safetensors"
    rm -f "$work/s-$name.safetensors"
    # An index holds at most 64 MiB: 10^7 nested objects are refused for their size instead.
    if [ "$kind-$levels" != objects-10000000 ]; then
      python3 "$hj" deep-index "$work/i-$name" "$kind" "$levels"
      echo "safetensors index, $kind nested $levels deep:"
      measure "$mlp" --mode none "${dims[@]}" --steps 0 \
        --init-from "$work/i-$name/model.safetensors.index.json"
      rm -rf "$work/i-$name"
    fi
  done
done
# On 3 ranks under mpirun: the bound is 2 s over the same job resuming the good checkpoint (what
# mpirun and MPI_Init take here), the peak RSS that of the largest process.
mpirun=${MPIEXEC:-mpirun}
job=("$mpirun" --oversubscribe --bind-to none -np 3 "$mlp" --mode none --dims 8,16,4 --batch 6 --steps 1)
t0=$(date +%s.%N); "${job[@]}" --resume "$good" >/dev/null; t1=$(date +%s.%N)
bound=$(python3 -c "print(2 + $t1 - $t0)")
python3 "$hj" deep-manifest "$good" "$work/m-mpi" objects 10000000
echo "manifest, objects nested 10^7 deep, 3 ranks (bound ${bound} s):"
python3 "$hj" measure 256 "$bound" "$want" -- "${job[@]}" --resume "$work/m-mpi" || fails=$((fails + 1))
test -e "$work/out.safetensors" && { echo "FAIL: an export of a refused checkpoint was written"; fails=$((fails + 1)); }
[ "$fails" -eq 0 ] && echo "ok: every deep input refused in time and memory" || { echo "$fails FAILED"; exit 1; }
