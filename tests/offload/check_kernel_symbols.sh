#!/bin/sh
# check_kernel_symbols.sh NM OBJECT [PREFIX]: passes when OBJECT defines exactly one external
# symbol, a strong text symbol PREFIX* (default hsdp::cpu_adam_detail::adamKernel), and no
# weak/unique (inline, template) ones. Prints the offending symbols otherwise.
nm=$1
obj=$2
prefix=${3:-hsdp::cpu_adam_detail::adamKernel}
[ -f "$obj" ] || { echo "no object file $obj"; exit 1; }
external=$("$nm" -C --defined-only "$obj" | awk '$2 ~ /^[A-Z]$/ || $2 == "u" || $2 == "v" || $2 == "w"')
echo "$external"
count=$(printf '%s\n' "$external" | grep -c .)
if [ "$count" -ne 1 ]; then
  echo "FAIL: $obj defines $count external/weak symbols; expected only its kernel entry point"
  exit 1
fi
printf '%s\n' "$external" | grep -qF " T $prefix" || {
  echo "FAIL: the one symbol is not a strong $prefix* text symbol"
  exit 1
}
echo "OK"
