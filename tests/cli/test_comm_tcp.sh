#!/usr/bin/env bash
# test_comm_tcp.sh - the correctness matrix of the tcp backend as users run it: fleetrun starts
# 1..5 ranks on loopback (ports bound by fleetrun itself, so parallel tests cannot collide),
# comm_check runs every collective x dtype x op x count against a serial reference and compares
# every output across ranks by hash. Then: repeated runs give the same result hash, and so do
# the same-host shared-memory path and every frame encrypted (FLEET_COMM_ENCRYPT=1 over TCP and
# over unix sockets).
# Counts: 1 and 2 ranks run comm_check's default {0, 1, 7, 1000, 2^20+3}; 3..5 ranks and the
# 3-rank comparisons run {0, 1, 7, 1000, 2^18+3}. 2^18+3 elements cross every default switch
# point that 2^20+3 crosses below 8 ranks (src/comm/tcp.c, shm_impl.h, transport.c): 1 MiB + 12
# bytes of f32 (2 MiB + 24 of f64) is over the recursive-doubling limit (ring allreduce), over
# one 1 MiB ring segment (2 or 3 passes, the last one 12 or 24 bytes), over the chain
# broadcast's and Bruck's limits, over the 1 MiB shared-memory ring in one message and over 4
# TCP frames; what only 2^20+3 adds (f16 rings of several segments, more than 16 frames in one
# message) the runs of 1 and 2 ranks keep, at a sixteenth of the cost of 5 ranks at 2^20+3
# (each rank computes every rank's inputs: the cost grows with ranks^2 x count).
set -u
run="${FLEET_BIN:?}/fleetrun"
check_prog="${FLEET_BUILD:?}/tests/comm/comm_check"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
large=0,1,7,1000,262147 # 2^18+3: see the header
summary() { grep -E '^comm_check: backend' "$1" | tail -1; }
hash_of() { summary "$1" | sed -E 's/.*hash ([0-9a-f]+).*/\1/'; }

for n in 1 2 3 4 5; do
  counts=()
  [ "$n" -ge 3 ] && counts=(--counts "$large")
  FLEET_COMM_LOCAL=0 FLEET_COMM_TIMEOUT=60 timeout 300 "$run" --nproc_per_node "$n" \
    --log_dir "$tmp/log$n" "$check_prog" "${counts[@]}" >"$tmp/out$n" 2>&1
  rc=$?
  echo "$n ranks (tcp): $(summary "$tmp/out$n")"
  if [ $rc -ne 0 ] || ! summary "$tmp/out$n" | grep -q ' 0 failures'; then
    echo "FAIL: $n ranks exited $rc"; tail -20 "$tmp/out$n"; fail=1
  fi
done
summary "$tmp/out2" | grep -q 'counts 0,1,7,1000,1048579:' || { echo "FAIL: 2 ranks did not run 2^20+3"; fail=1; }
summary "$tmp/out5" | grep -q "counts $large:" || { echo "FAIL: 5 ranks did not run $large"; fail=1; }

# repeated run (tcp), shared memory and the encrypted paths: bit-identical results; the four
# jobs are independent (fleetrun binds its own ports), so they run two at a time
run3() { timeout 300 "$run" --nproc_per_node 3 --log_dir "$tmp/$1.log" "$check_prog" --counts "$large" >"$tmp/$1" 2>&1; }
FLEET_COMM_LOCAL=0 run3 again &
FLEET_COMM_LOCAL=1 run3 shm &
wait
FLEET_COMM_ENCRYPT=1 FLEET_COMM_LOCAL=0 run3 enc &
FLEET_COMM_ENCRYPT=1 FLEET_COMM_SHM=0 run3 encu &
wait
h1=$(hash_of "$tmp/out3") h2=$(hash_of "$tmp/again") h3=$(hash_of "$tmp/shm")
h4=$(hash_of "$tmp/enc") h5=$(hash_of "$tmp/encu")
echo "3 ranks: hashes $h1 (tcp), $h2 (tcp again), $h3 (shared memory), $h4 (tcp encrypted), $h5 (unix encrypted)"
[ -n "$h1" ] && [ "$h1" = "$h2" ] || { echo "FAIL: repeated run differs"; fail=1; }
[ "$h1" = "$h3" ] || { echo "FAIL: same-host (shared memory) path differs from tcp"; fail=1; }
[ "$h1" = "$h4" ] || { echo "FAIL: encrypted tcp differs from tcp"; tail -5 "$tmp/enc"; fail=1; }
[ "$h1" = "$h5" ] || { echo "FAIL: encrypted unix sockets differ from tcp"; tail -5 "$tmp/encu"; fail=1; }
for f in again shm enc encu; do
  summary "$tmp/$f" | grep -q ' 0 failures' || { echo "FAIL: $f: $(summary "$tmp/$f")"; tail -5 "$tmp/$f"; fail=1; }
done
exit $fail
