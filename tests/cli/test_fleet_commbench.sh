#!/usr/bin/env bash
# test_fleet_commbench.sh - the collective benchmark under fleetrun on 3 local ranks: every op
# runs, checks its results (0 wrong) and prints nccl-tests' columns with busbw = algbw x the
# op's factor; bad options exit 2. Timings are not asserted (this machine is noisy).
set -u
run="${FLEET_BIN:?}/fleetrun"
bench="${FLEET_BIN:?}/fleet-commbench"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}
unset FLAGS_START_PORT FLEET_JOB_TOKEN

for spec in "allreduce f32 sum" "allreduce bf16 avg" "allreduce i64 max" "reduce_scatter f16 sum" \
            "allgather f64 sum" "broadcast i32 sum"; do
  set -- $spec
  out=$tmp/$1.$2.out
  timeout 120 "$run" --nproc_per_node 3 --log_dir "$tmp/log" "$bench" -b 0 -e 1M -f 8 -n 2 -w 1 \
    -o "$1" -d "$2" -r "$3" >"$out" 2>&1
  rc=$?
  check "$spec: exit 0 (got $rc)" test $rc -eq 0
  check "$spec: header" grep -q "^# fleet-commbench: $1, $2, .*3 ranks, backend tcp" "$out"
  check "$spec: 0 wrong" grep -q '^# Out of bounds values : 0 OK' "$out"
  check "$spec: avg busbw" grep -qE '^# Avg bus bandwidth +: [0-9.]+ GB/s' "$out"
  rows=$(grep -cE "^ +[0-9]+ +[0-9]+ +$2 " "$out")
  check "$spec: 7 or 8 size rows (got $rows)" test "$rows" -ge 7 -a "$rows" -le 8
  # busbw = algbw x the op's factor, up to the printed rounding (3 decimals)
  # (3 ranks: 2(n-1)/n = 4/3 for allreduce, (n-1)/n = 2/3 for the gathers and scatters; the
  # exact factor, since algbw reaches GB/s over shared memory, where 1.333's error shows)
  want=$(case $1 in allreduce) echo 4/3 ;; broadcast) echo 1 ;; *) echo 2/3 ;; esac)
  check "$spec: busbw factor $want" awk -v f="$want" -v t="$2" '
    BEGIN { split(f, q, "/"); w = q[1] / (q[2] ? q[2] : 1) }
    $3 == t && $7 > 0 { n++; d = $8 - $7 * w; if (d > 0.0015 || d < -0.0015) bad++ }
    END { exit !(n > 0 && bad == 0) }' "$out"
  if [ $fail -ne 0 ]; then cat "$out"; tail -5 "$tmp"/log/workerlog.*; break; fi
done

for args in "-o nothing" "-d u8" "-r min" "-b 1Q" "-f 1" "-n 0" "-c 2" "--backend gloo" "-b 2M -e 1M" "--bogus"; do
  "$bench" $args >"$tmp/bad.out" 2>"$tmp/bad.err"
  rc=$?
  check "bad '$args': exit 2 (got $rc)" test $rc -eq 2
  check "bad '$args': message" grep -q 'fleet-commbench: error:' "$tmp/bad.err"
done
check "--help: exit 0" "$bench" --help >/dev/null
exit $fail
