#!/usr/bin/env bash
# test_comm_tcp.sh - the correctness matrix of the tcp backend as users run it: fleetrun starts
# 1..5 ranks on loopback (ports bound by fleetrun itself, so parallel tests cannot collide),
# comm_check runs every collective x dtype x op x count {0, 1, 7, 1000, 2^20+3} against a
# serial reference and compares every output across ranks by hash. Then: repeated runs give
# the same result hash, and so do the same-host unix-socket path and every frame encrypted
# (FLEET_COMM_ENCRYPT=1 over TCP and over unix sockets).
set -u
run="${FLEET_BIN:?}/fleetrun"
check_prog="${FLEET_BUILD:?}/tests/comm/comm_check"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
summary() { grep -E '^comm_check: backend' "$1" | tail -1; }
hash_of() { summary "$1" | sed -E 's/.*hash ([0-9a-f]+).*/\1/'; }

for n in 1 2 3 4 5; do
  FLEET_COMM_LOCAL=0 FLEET_COMM_TIMEOUT=60 timeout 300 "$run" --nproc_per_node "$n" \
    --log_dir "$tmp/log$n" "$check_prog" >"$tmp/out$n" 2>&1
  rc=$?
  echo "$n ranks (tcp): $(summary "$tmp/out$n")"
  if [ $rc -ne 0 ] || ! summary "$tmp/out$n" | grep -q ' 0 failures'; then
    echo "FAIL: $n ranks exited $rc"; tail -20 "$tmp/out$n"; fail=1
  fi
done

# repeated run (tcp) and the unix-socket path: bit-identical results
FLEET_COMM_LOCAL=0 timeout 300 "$run" --nproc_per_node 3 --log_dir "$tmp/again.log" "$check_prog" >"$tmp/again" 2>&1
FLEET_COMM_LOCAL=1 timeout 300 "$run" --nproc_per_node 3 --log_dir "$tmp/unix.log" "$check_prog" >"$tmp/unix" 2>&1
FLEET_COMM_ENCRYPT=1 FLEET_COMM_LOCAL=0 timeout 300 "$run" --nproc_per_node 3 --log_dir "$tmp/enc.log" "$check_prog" >"$tmp/enc" 2>&1
FLEET_COMM_ENCRYPT=1 FLEET_COMM_SHM=0 timeout 300 "$run" --nproc_per_node 3 --log_dir "$tmp/encu.log" "$check_prog" >"$tmp/encu" 2>&1
h1=$(hash_of "$tmp/out3") h2=$(hash_of "$tmp/again") h3=$(hash_of "$tmp/unix")
h4=$(hash_of "$tmp/enc") h5=$(hash_of "$tmp/encu")
echo "3 ranks: hashes $h1 (tcp), $h2 (tcp again), $h3 (unix sockets), $h4 (tcp encrypted), $h5 (unix encrypted)"
[ -n "$h1" ] && [ "$h1" = "$h2" ] || { echo "FAIL: repeated run differs"; fail=1; }
[ "$h1" = "$h3" ] || { echo "FAIL: unix-socket path differs from tcp"; fail=1; }
[ "$h1" = "$h4" ] || { echo "FAIL: encrypted tcp differs from tcp"; tail -5 "$tmp/enc"; fail=1; }
[ "$h1" = "$h5" ] || { echo "FAIL: encrypted unix sockets differ from tcp"; tail -5 "$tmp/encu"; fail=1; }
for f in enc encu; do
  summary "$tmp/$f" | grep -q ' 0 failures' || { echo "FAIL: $f: $(summary "$tmp/$f")"; fail=1; }
done
exit $fail
