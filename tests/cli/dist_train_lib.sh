# dist_train_lib.sh - sourced by the cli tests that train tests/dist/dist_train under fleetrun
# and compare the parameters it writes. Expects run (fleetrun), prog (dist_train), tmp (a
# scratch directory) and fail (0) set by the caller; sets fail=1 on a failure.
#   train NAME NPROC ARGS...   parameters to $tmp/NAME.bin, rank 0's output to $tmp/NAME.log,
#                              under env "${train_env[@]}" (default FLEET_COMM_TIMEOUT=60)
#   compare WHAT RTOL A B [dist_train --compare options]
#                              prints max |a - b| / max |b|; fails above RTOL
#   check WHAT COMMAND...      "ok: WHAT" if COMMAND succeeds, else "FAIL: WHAT" and fail=1

train() {
  local name=$1 n=$2
  shift 2
  local vars=("${train_env[@]:-FLEET_COMM_TIMEOUT=60}")
  env "${vars[@]}" timeout 120 "$run" --nproc_per_node "$n" --log_dir "$tmp/log_$name" \
    "$prog" "$@" --out "$tmp/$name.bin" >"$tmp/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$tmp/$name.bin" ]; then
    echo "FAIL: $name exited $rc"; tail -5 "$tmp/$name.log"; fail=1; return 1
  fi
}

compare() {
  local what=$1 rtol=$2 a=$3 b=$4 out rc
  shift 4
  out=$("$prog" --compare "$tmp/$a.bin" "$tmp/$b.bin" --rtol "$rtol" "$@")
  rc=$?
  echo "$what: $out"
  [ $rc -eq 0 ] || { echo "FAIL: $what"; fail=1; }
}

check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
