#!/usr/bin/env bash
# The checkpoint benchmark (docs/checkpoint.md): ckpt_bench on 8 ranks (2 virtual nodes x 4),
# then hsdp-ckpt reshard of its checkpoint 8 -> 6 against cp of the same bytes (each followed
# by an fsync of its files, the source's page cache dropped first), with reshard's peak RSS
# from /usr/bin/time -v. Medians of REPEATS. Needs ~4x the model state free under DIR.
#   bench/ckpt_bench.sh [DIR [GIB [REPEATS]]]
set -euo pipefail
root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD:-$root/build}
dir=${1:-/tmp/hsdp-ckpt-bench}; gib=${2:-1}; reps=${3:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
df -h "$(dirname "$dir")" | tail -1
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
mpirun --oversubscribe --bind-to none -np 8 -x HSDP_RANKS_PER_NODE=4 "$build/bench/ckpt_bench" \
  --dir "$dir" --gib "$gib" --repeats "$reps" --keep
src="$dir/ckpt/bench"
drop() { python3 -c "import os,sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)" "$src"/*; }
rs=(); cps=(); rss=()
for _ in $(seq "$reps"); do
  drop
  /usr/bin/time -v -o "$dir/time.txt" "$build/tools/hsdp-ckpt" reshard "$src" "$dir/r6" --world 6 \
    --ranks-per-node 3 --intra-shard 3 --inter-shard 2 --mode zero2 >/dev/null
  rs+=("$(awk -F': ' '/Elapsed/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' "$dir/time.txt")")
  rss+=("$(awk -F': ' '/Maximum resident/ {print $2}' "$dir/time.txt")")
  rm -rf "$dir/r6"
  drop
  t0=$(date +%s.%N); cp -r "$src" "$dir/cp"; sync "$dir"/cp/*; t1=$(date +%s.%N)
  cps+=("$(echo "$t1 - $t0" | bc -l)")
  rm -rf "$dir/cp"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
largest=$("$build/tools/hsdp-ckpt" inspect "$src" --json | python3 -c "import json,sys
m=json.load(sys.stdin); import math
print(max(sum(math.prod(p['shape']) for p in u['params']) for u in m['units'])*12)")
r=$(med "${rs[@]}"); c=$(med "${cps[@]}"); k=$(med "${rss[@]}")
printf '\nhsdp-ckpt reshard 8 -> 6 (zero3 I4 J2 -> zero2 I3 J2): %.3f s vs cp + fsync %.3f s = %.2fx; peak RSS %.1f MiB (bound: 2 x largest unit state %.1f MiB + 64 MiB = %.1f MiB)\n' \
  "$r" "$c" "$(echo "$r / $c" | bc -l)" "$(echo "$k / 1024" | bc -l)" "$(echo "$largest / 1048576" | bc -l)" \
  "$(echo "2 * $largest / 1048576 + 64" | bc -l)"
