#!/usr/bin/env bash
# test_comm_mpi.sh - the mpi backend under mpirun: comm_check --quick (every collective x dtype
# x op over counts 0, 1, 7, 1000, 100003, results checked on every rank and compared across
# ranks by hash) for 1 to 4 ranks. Skipped (77) when mpirun or the mpi backend is missing.
set -u
check_bin="${FLEET_BUILD:-${FLEET_BIN:?}/..}/tests/comm/comm_check"
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIPPED: mpirun not found"; exit 77
fi
if [ ! -x "$check_bin" ]; then
  echo "SKIPPED: $check_bin not built"; exit 77
fi
# OpenMPI leaks in MPI_Init / MPI_Finalize (memory of its components); under a sanitizer build
# LeakSanitizer would fail every run for that. fleet's own frees are checked by the tcp tests.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
args=(--oversubscribe)
if [ "$(id -u)" = 0 ]; then
  args+=(--allow-run-as-root)
fi
# a single rank tells us whether this build has the mpi backend
out=$(timeout 120 mpirun "${args[@]}" -np 1 "$check_bin" --backend mpi --counts 0 2>&1)
if echo "$out" | grep -q "built without MPI"; then
  echo "SKIPPED: fleet was built without the mpi backend"; exit 77
fi
fail=0
for k in 1 2 3 4; do
  out=$(timeout 300 mpirun "${args[@]}" -np $k "$check_bin" --quick --backend mpi 2>&1)
  rc=$?
  echo "$out" | grep '^comm_check:' || echo "$out" | tail -20
  if [ $rc -ne 0 ]; then
    echo "FAIL: mpirun -np $k comm_check --quick exited $rc"; fail=1
  elif ! echo "$out" | grep -q "backend mpi, $k ranks, .* 0 failures"; then
    echo "FAIL: mpirun -np $k: no clean summary line"; fail=1
  fi
done
exit $fail
