#!/usr/bin/env bash
# slowest-tests.sh - prints the N slowest tests (default 10) of a ctest run, and the sum of all
# test times, from ctest's log: a build folder's Testing/Temporary/LastTest.log (its last run)
# or a copy of one ("N/M Test: NAME" ... "Test time = S sec"). make test prints pass 1's.
#   scripts/slowest-tests.sh BUILD_DIR|LOG [N]
set -euo pipefail
dir=${1:?usage: slowest-tests.sh BUILD_DIR|LOG [N]}
n=${2:-10}
log=$dir
[ -d "$dir" ] && log="$dir/Testing/Temporary/LastTest.log"
[ -r "$log" ] || { echo "slowest-tests: no $log (run ctest first)" >&2; exit 1; }
awk -v n="$n" -v dir="$log" '
  /^[0-9]+\/[0-9]+ Test: / { name = $3 }
  /^Test time = / && name != "" { t[name] = $4; total += $4; count++; name = "" }
  END {
    if (!count) { print "slowest-tests: no test times in " dir; exit 0 }
    printf "the %d slowest of %d tests of %s (%.0f s of test time in all):\n", \
      (count < n ? count : n), count, dir, total
    fflush()
    for (k in t) printf "%10.2f %s\n", t[k], k | "sort -rn | head -" n
  }' "$log"
