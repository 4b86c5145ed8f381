#!/usr/bin/env bash
# test_netlab_multinode.sh - a real two-node job: netlab makes two emulated hosts on 1 Gbit/s
# links, one fleetrun per host (2 workers each) runs the collective self-test as one job of 4
# ranks over the emulated network. Skipped (77) where netlab cannot run (not root, no netns).
set -u
src="${FLEET_SRC:?}"
run="${FLEET_BIN:?}/fleetrun"
netlab="$src/bench/netlab"
check_prog="${FLEET_BUILD:-${FLEET_BIN}/..}/tests/comm/comm_check"
"$netlab" check || exit 77
tmp=$(mktemp -d)
trap '"$netlab" down; rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}

[ -x "$check_prog" ] || { echo "FAIL: $check_prog is not built"; exit 1; }
prog=("$check_prog" --quick)

"$netlab" up 2 1gbit || { echo "FAIL: netlab up"; exit 1; }
export FLEET_JOB_TOKEN
FLEET_JOB_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
pids=()
for h in 0 1; do
  "$netlab" exec $h timeout 180 "$run" --ips 10.77.0.1,10.77.0.2 --nproc_per_node 2 \
    --started_port 6170 --grace 2 --log_dir "$tmp/log$h" "${prog[@]}" >"$tmp/out$h" 2>&1 &
  pids+=($!)
done
for h in 0 1; do
  wait "${pids[$h]}"
  rc=$?
  check "node $h: fleetrun exits 0 (got $rc)" test $rc -eq 0
done
check "node 0 found itself (rank 0 on 10.77.0.1)" grep -q 'node 0 of 2 (10.77.0.1)' "$tmp/out0"
check "node 1 found itself (ranks 2..3 on 10.77.0.2)" grep -q 'node 1 of 2 (10.77.0.2), 2 worker(s), ranks 2..3 of 4' "$tmp/out1"
for h in 0 1; do
  for i in 0 1; do
    check "node $h: workerlog.$i made" test -f "$tmp/log$h/workerlog.$i"
  done
done
check "one job of 4 ranks whose collectives check out" \
  grep -qE 'comm_check: backend tcp, 4 ranks, .* 0 failures' "$tmp/log0/workerlog.0"
if [ $fail -ne 0 ]; then
  for h in 0 1; do
    echo "=== fleetrun on node $h"; cat "$tmp/out$h"
    for i in 0 1; do echo "=== node $h workerlog.$i"; tail -20 "$tmp/log$h/workerlog.$i"; done
  done
else
  grep -h . "$tmp/log0/workerlog.0" | tail -3
fi
exit $fail
