#!/usr/bin/env bash
# run-tests.sh - the test passes of `make test`, each run even when an earlier one failed:
#   1. every test in BUILD (ctest -j JOBS);
#   2. the tests labelled "numeric" in BUILD again, with oneDNN and OpenBLAS held to an older
#      instruction set than this CPU's (scripts/test-isa.sh): a check that holds only with
#      this CPU's kernels fails here, not on the next machine;
#   3. the unit tests in SAN_BUILD (AddressSanitizer + UndefinedBehaviorSanitizer);
# then the ten slowest tests of pass 1 and the passes' results. Exits 1 if any pass failed.
#   scripts/run-tests.sh BUILD SAN_BUILD JOBS
set -uo pipefail
build=${1:?usage: run-tests.sh BUILD SAN_BUILD JOBS} san=${2:?} jobs=${3:?}
here=$(cd "$(dirname "$0")" && pwd)
declare -a names results
pass() { # pass NAME COMMAND...: runs COMMAND, records its status
  local name=$1 t0=$SECONDS rc
  shift
  echo "== make test: $name"
  "$@"
  rc=$?
  names+=("$name")
  results+=("$([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s")
}
pass "all tests, $build" bash -c "cd '$build' && ctest --output-on-failure -j '$jobs'"
# pass 1's LastTest.log, before pass 2 writes its own in the same folder
cp "$build/Testing/Temporary/LastTest.log" "$build/Testing/Temporary/LastTest-all.log" 2>/dev/null
pass "numeric tests, older instruction sets, $build" "$here/test-isa.sh" "$build" -j "$jobs"
pass "unit tests, $san" bash -c "cd '$san' && ctest --output-on-failure -j '$jobs' -L unit"
echo
"$here/slowest-tests.sh" "$build/Testing/Temporary/LastTest-all.log" 10
echo
status=0
for i in "${!names[@]}"; do
  echo "make test: ${names[$i]}: ${results[$i]}"
  case "${results[$i]}" in passed*) ;; *) status=1 ;; esac
done
exit $status
