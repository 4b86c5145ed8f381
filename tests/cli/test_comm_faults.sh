#!/usr/bin/env bash
# test_comm_faults.sh - faults during a long allreduce loop (comm_check --loop) under fleetrun:
# (1) a rank killed with SIGKILL: every surviving rank exits with an error naming it (rank and
#     endpoint) within the timeout plus a few seconds, fleetrun reports it, and no process is
#     left behind;
# (2) strangers on every worker port (garbage, a handshake with a wrong token, an old protocol
#     version's hello, a frame header with a huge length, a port scan, a silent connection): the
#     job finishes with every result correct;
# (3) a frozen rank (SIGSTOP) of 2, over shared memory and over encrypted TCP: the job ends
#     within FLEET_COMM_TIMEOUT (+ 2 s), not twice it, naming the frozen rank (issue 35).
set -u
run="${FLEET_BIN:?}/fleetrun"
check_prog="${FLEET_BUILD:?}/tests/comm/comm_check"
py=$(command -v /usr/bin/python3 python3 | head -1)
tmp=$(mktemp -d)
marker="fleet_fault_test_$$"
. "${FLEET_SRC:?}/tests/cli/marker_lib.sh" # kill_marked
cleanup() {
  kill_marked "$check_prog"
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
check() { local what=$1; shift; if ! "$@"; then echo "FAIL: $what"; fail=1; fi; }
export FLEET_TEST_MARKER=$marker

# pid of the comm_check of rank $1 in this test's job
rank_pid() {
  for p in $(pgrep -f "$check_prog" || true); do
    env_of=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null) || continue
    if grep -qx "FLEET_TEST_MARKER=$marker" <<<"$env_of" && grep -qx "PADDLE_TRAINER_ID=$1" <<<"$env_of"; then
      echo "$p"; return 0
    fi
  done
  return 1
}
endpoints() { grep -E 'PADDLE_TRAINER_ENDPOINTS' "$1" | grep -oE '[0-9.]+:[0-9]+' | tr '\n' ' '; }
wait_for() { # wait_for SECONDS COMMAND...: poll until COMMAND succeeds
  local end=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.2; done
}
count_left() {
  local n=0
  for p in $(pgrep -f "$check_prog" || true); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "FLEET_TEST_MARKER=$marker" && n=$((n + 1))
  done
  echo $n
}

# --- 1. SIGKILL one rank in the middle of the loop
timeout_s=10
FLEET_COMM_TIMEOUT=$timeout_s "$run" --nproc_per_node 4 --grace 20 --log_dir "$tmp/kill" \
  "$check_prog" --loop 120 -v >"$tmp/kill.out" 2>&1 &
job=$!
check "all 4 ranks looping" wait_for 30 grep -qs 'iteration 3 ok' "$tmp/kill/workerlog.0"
victim=$(rank_pid 2)
victim_ep=$(endpoints "$tmp/kill.out" | awk '{ print $3 }')
kill -9 "$victim"
killed_at=$SECONDS
wait $job
rc=$?
elapsed=$((SECONDS - killed_at))
echo "fleetrun exited $rc, ${elapsed}s after rank 2 ($victim_ep) was killed"
check "fleetrun exit code 137 (worker killed by SIGKILL)" test $rc -eq 137
check "all exited within timeout + 5 s" test $elapsed -le $((timeout_s + 5))
for r in 0 1 3; do
  line=$(grep -E 'rank 2 \(' "$tmp/kill/workerlog.$r" | head -1)
  echo "  rank $r: ${line:-<nothing>}"
  check "rank $r names rank 2 and its endpoint" grep -qF "rank 2 ($victim_ep)" "$tmp/kill/workerlog.$r"
  check "rank $r exited with an error" grep -qE 'error|fail' "$tmp/kill/workerlog.$r"
done
check "no worker left behind" test "$(count_left)" -eq 0

# --- 2. strangers on the worker ports while the loop runs
# (a pause comm_check refuses, before it joins any job: exit 2 naming the option)
out=$("$check_prog" --loop 1 --loop-pause 60001 2>&1)
check "--loop-pause 60001 refused: exit 2 naming it" \
  test $? -eq 2 -a -n "$(grep -- '--loop-pause 60001: want milliseconds' <<<"$out")"
# 1 MiB allreduces with 20 ms pauses between them: the job stays in its loop, its connections
# busy every 20 ms, at a fraction of the CPU of back-to-back 16 MiB allreduces
"$run" --nproc_per_node 3 --log_dir "$tmp/strangers" "$check_prog" --loop 8 --loop-count 262144 \
  --loop-pause 20 -v >"$tmp/str.out" 2>&1 &
job=$!
check "3 ranks looping" wait_for 30 grep -qs 'iteration 2 ok' "$tmp/strangers/workerlog.0"
eps=$(endpoints "$tmp/str.out")
"$py" - $eps <<'PY'
import socket, struct, sys, time, os
eps = [e.rsplit(":", 1) for e in sys.argv[1:]]
def conn(h, p):
    s = socket.create_connection((h, int(p)), timeout=5)
    return s
silent = []
for rnd in range(3):
    for h, p in eps:
        # garbage
        s = conn(h, p); s.sendall(os.urandom(4096)); s.close()
        # a well-formed hello (protocol 2) claiming rank 2 of 3, then a proof that is not one
        s = conn(h, p); s.sendall(b"FLET" + struct.pack("<HHIIII", 2, 0, 2, 3, 0, 0) + os.urandom(32))
        try:
            s.recv(88); s.sendall(b"FLAU" + struct.pack("<I", 2) + os.urandom(32)); s.recv(16)
        except OSError: pass
        s.close()
        # an old peer's hello (protocol 1, the token in clear)
        s = conn(h, p); s.sendall(b"FLET" + struct.pack("<HHII", 1, 0, 1, 3) + b"not-the-token".ljust(64, b"\0"))
        try: s.recv(64)
        except OSError: pass
        s.close()
        # a frame header announcing 2^60 bytes, then data
        s = conn(h, p); s.sendall(b"FLFR" + struct.pack("<IQQ", 1, 0, 1 << 60) + b"x" * 65536); s.close()
        # port scan: connect and close
        conn(h, p).close()
        # a silent connection kept open
        silent.append(conn(h, p))
    time.sleep(0.5)
time.sleep(3)
for s in silent: s.close()
print("stranger: %d endpoints attacked" % len(eps))
PY
wait $job
rc=$?
check "job with strangers exits 0 (got $rc)" test $rc -eq 0
check "every allreduce checked out" grep -qE '^comm_check: loop: .*, ok$' "$tmp/str.out"
grep -E '^comm_check: loop' "$tmp/str.out" | tail -1
check "strangers were logged" grep -qiE 'refus|reject|drop|stranger' "$tmp/strangers/workerlog.0"
check "no worker left behind" test "$(count_left)" -eq 0

# --- 3. a frozen rank: SIGSTOP rank 1 of 2; the job ends within the timeout, not twice it
for mode in shm tcp-encrypted; do
  envs=(FLEET_COMM_TIMEOUT=3) # also the set-up's deadline: 2 s is tight on a loaded 2-CPU VM
  [ $mode = tcp-encrypted ] && envs+=(FLEET_COMM_LOCAL=0 FLEET_COMM_ENCRYPT=1)
  env "${envs[@]}" "$run" --nproc_per_node 2 --log_dir "$tmp/frozen-$mode" "$check_prog" \
    --loop 100000 -v >"$tmp/frozen-$mode.out" 2>&1 &
  job=$!
  if ! wait_for 30 grep -qs 'iteration 3 ok' "$tmp/frozen-$mode/workerlog.0"; then
    echo "FAIL: $mode: 2 ranks looping"; fail=1
    tail -5 "$tmp/frozen-$mode.out" "$tmp/frozen-$mode"/workerlog.*
    kill "$job" 2>/dev/null; wait "$job"
    continue
  fi
  frozen=$(rank_pid 1)
  t0=$(date +%s.%N)
  kill -STOP "$frozen"
  wait $job
  rc=$?
  took=$(echo "$(date +%s.%N) - $t0" | bc)
  echo "$mode: fleetrun exited $rc, $took s after rank 1 was stopped (FLEET_COMM_TIMEOUT=3)"
  check "$mode: job failed" test $rc -ne 0
  check "$mode: ended within the timeout + 2 s (twice it is 6)" test "$(echo "$took < 5" | bc)" -eq 1
  check "$mode: ended no sooner than the timeout" test "$(echo "$took >= 2.9" | bc)" -eq 1
  check "$mode: rank 0 names rank 1" grep -qE 'no data from rank 1 \(|rank 1 \(.*(silent|timed out)' \
    "$tmp/frozen-$mode/workerlog.0"
  check "$mode: no worker left behind" wait_for 5 test "$(count_left)" -eq 0
done
exit $fail
