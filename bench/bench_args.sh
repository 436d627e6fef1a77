# Shared by the bench scripts (sourced after setting bench_name): a usage error, named by the
# script, exits 2; posint FLAG VALUE MIN checks an integer flag value.
die() { echo "$bench_name: $*" >&2; exit 2; }
posint() { [[ $2 =~ ^[0-9]+$ ]] && (($2 >= $3)) || die "$1 '$2' must be an integer >= $3"; }
