#!/usr/bin/env bash
# run-tests.sh - the test passes of `make test`, each run even when an earlier one failed:
#   1. every test in BUILD (ctest -j JOBS; the longest start first: COST in tests/CMakeLists.txt);
#   2. the tests labelled "numeric" that are not unit tests, in BUILD again, with oneDNN and
#      OpenBLAS held to an older instruction set than this CPU's (scripts/test-isa.sh): a check
#      that holds only with this CPU's kernels fails here, not on the next machine. Under
#      FLEET_TEST_NUMERIC_ONLY=1, which test-isa.sh sets, each runs only its sections whose checks
#      can depend on the kernels; pass 1 ran the others (tests/cli/numeric_only_lib.sh);
#   3. the unit tests in SAN_BUILD (AddressSanitizer + UndefinedBehaviorSanitizer), with the
#      same older instruction set (test-isa.sh --env): this is pass 2 for the numeric unit
#      tests. Every numeric test is a unit test (pass 3) or not (pass 2), so both passes
#      together run all of them on the older kernels, as make test-isa does; the sanitizers
#      watch fleet's own code, which does not change with the libraries' instruction set;
# then the ten slowest tests of the three passes and the passes' results. Exits 1 if any pass
# failed. Passes 1 and 3 give ctest JOBS "cpus" slots and one job more: the tests that mostly
# wait run beside JOBS that compute (FL_WAITING_TESTS in tests/CMakeLists.txt).
# With SAN_BUILD_COMMAND (make test: make build-san), SAN_BUILD is built while passes 1 and 2
# run, at the lowest priority (nice 19): many tests wait on sleeps, timeouts and each other
# more than they compute, and the compiler takes the CPU they leave; the tests get it back at
# once when they want it. Its output goes to SAN_BUILD/build.log, shown if it fails (pass 3
# then fails too).
#   scripts/run-tests.sh BUILD SAN_BUILD JOBS [SAN_BUILD_COMMAND]
set -uo pipefail
build=${1:?usage: run-tests.sh BUILD SAN_BUILD JOBS [SAN_BUILD_COMMAND]} san=${2:?} jobs=${3:?}
san_cmd=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
san_pid=""
if [ -n "$san_cmd" ]; then
  mkdir -p "$san"
  echo "== make test: building $san at nice 19 beside passes 1 and 2 ($san/build.log)"
  nice -n 19 bash -c "$san_cmd" >"$san/build.log" 2>&1 &
  san_pid=$!
fi
san_wait() { # the background build of SAN_BUILD, if any: waits, shows its log if it failed
  [ -n "$san_pid" ] || return 0
  local t0=$SECONDS rc
  wait "$san_pid"
  rc=$?
  echo "== make test: $san: its build ended $((SECONDS - t0)) s after pass 2"
  [ $rc -eq 0 ] || { tail -40 "$san/build.log"; echo "make test: building $san failed (exit $rc)"; }
  return $rc
}
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
logs=() # each pass's copy of its LastTest.log, before the next pass writes its own
keep_log() { # keep_log DIR LABEL
  local from="$1/Testing/Temporary/LastTest.log" to="$1/Testing/Temporary/LastTest-$2.log"
  cp "$from" "$to" 2>/dev/null && logs+=("$2=$to")
}
slots() { # slots DIR: writes a resource spec of JOBS "cpus" slots, prints the ctest options
  printf '{"version": {"major": 1, "minor": 0}, "local": [{"cpus": [{"id": "0", "slots": %d}]}]}\n' \
    "$jobs" >"$1/cpu-slots.json"
  echo "-j $((jobs + 1)) --resource-spec-file $(cd "$1" && pwd)/cpu-slots.json"
}
pass "all tests, $build" bash -c "cd '$build' && ctest --output-on-failure $(slots "$build")"
keep_log "$build" all
rm -f "$build/Testing/Temporary/LastTest.log" # test-isa.sh may skip: no stale log for pass 2
pass "numeric tests but unit tests, older instruction sets, $build" \
  "$here/test-isa.sh" "$build" -j "$jobs" -LE unit
keep_log "$build" isa
isa_env=$("$here/test-isa.sh" --env)
if san_wait; then
  pass "unit tests, $san, ${isa_env:-native instruction set}" \
    bash -c "cd '$san' && env $isa_env ctest --output-on-failure $(slots "$san") -L unit"
else
  names+=("unit tests, $san")
  results+=("FAILED (not built)")
fi
keep_log "$san" san
echo
[ ${#logs[@]} -gt 0 ] && "$here/slowest-tests.sh" "${logs[@]}" 10
echo
status=0
for i in "${!names[@]}"; do
  echo "make test: ${names[$i]}: ${results[$i]}"
  case "${results[$i]}" in passed*) ;; *) status=1 ;; esac
done
exit $status
