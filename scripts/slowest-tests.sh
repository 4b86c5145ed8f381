#!/usr/bin/env bash
# slowest-tests.sh - prints the N slowest tests (default 10) of one or more ctest runs, and the
# sum of all their test times, from ctest's logs: a build folder's
# Testing/Temporary/LastTest.log (its last run) or a copy of one ("N/M Test: NAME" ... "Test
# time = S sec"). With several logs a test is listed once per log, named NAME (LABEL), LABEL
# what LABEL=LOG gives or else the log's path. make test prints those of its three passes.
#   scripts/slowest-tests.sh BUILD_DIR|LOG|LABEL=LOG... [N]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: slowest-tests.sh BUILD_DIR|LOG|LABEL=LOG... [N]" >&2; exit 2; }
n=10
args=("$@")
if [ $# -ge 2 ] && [[ ${args[-1]} =~ ^[0-9]+$ ]]; then
  n=${args[-1]}
  unset 'args[-1]'
fi
labels=() logs=()
for a in "${args[@]}"; do
  label="" log=$a
  if [[ $a == *=* ]]; then label=${a%%=*} log=${a#*=}; fi
  [ -d "$log" ] && log="$log/Testing/Temporary/LastTest.log"
  [ -r "$log" ] || { echo "slowest-tests: no $log (run ctest first)" >&2; exit 1; }
  labels+=("${label:-$log}") logs+=("$log")
done
for i in "${!logs[@]}"; do
  [ ${#logs[@]} -gt 1 ] && suffix=" (${labels[$i]})" || suffix=""
  awk -v s="$suffix" '
    /^[0-9]+\/[0-9]+ Test: / { name = $3 }
    /^Test time = / && name != "" { print $4, name s; name = "" }' "${logs[$i]}"
done | awk -v n="$n" -v what="${labels[*]}" '
  { t[NR] = $0; total += $1; count++ }
  END {
    if (!count) { print "slowest-tests: no test times in " what; exit 0 }
    printf "the %d slowest of %d tests of %s (%.0f s of test time in all):\n", \
      (count < n ? count : n), count, what, total
    fflush()
    for (k in t) { split(t[k], f, " "); sub(/^[^ ]+ /, "", t[k]); printf "%10.2f %s\n", f[1], t[k] | "sort -rn | head -" n }
  }'
