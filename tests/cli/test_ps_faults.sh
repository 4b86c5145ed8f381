#!/usr/bin/env bash
# test_ps_faults.sh - processes of a parameter-server job that stop answering (SIGSTOP: alive,
# connections open, silent), FLEET_COMM_TIMEOUT=5, 2 servers and 2 workers, sync mode:
#   a worker: it is named (index and endpoint) by a server, as the one whose push the others
#     wait for, or by worker 0, as the rank a progress line's allreduce waits for (whichever
#     timeout runs out first); worker 0 fails naming it, and the job ends;
#   a server: every worker names it (role, index, endpoint), and the job ends.
# The time from the stop to the job's end is printed; the only bound asserted on it is a loose
# one (3 x the timeout + 10 s): the checks that matter are who is named and that the job ends.
set -u
bin="${FLEET_BIN:?}"
cfg="${FLEET_SRC:?}/configs/mlp_ps.yaml"
tmp=$(mktemp -d)
marker="ps_faults_$$"
. "${FLEET_SRC:?}/tests/cli/marker_lib.sh" # kill_marked
cleanup() {
  kill_marked "$bin/fleet-train"
  rm -rf "$tmp"
}
trap '[ -n "${KEEP_TMP:-}" ] || cleanup' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...: returns the command's success
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; return 1; fi
}
for b in fleet-train fleetrun; do
  [ -x "$bin/$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD TRAINING_ROLE FLEET_RESTART_COUNT
export FLEET_COMM_TIMEOUT=5 FLEET_TEST_MARKER=$marker
timeout_s=5

pid_of() { # pid_of ROLE INDEX: the job's fleet-train process of that role and index
  local var=PADDLE_TRAINER_ID
  [ "$1" = PSERVER ] && var=PADDLE_PORT
  for q in $(pgrep -f "$bin/fleet-train" || true); do
    e=$(tr '\0' '\n' <"/proc/$q/environ" 2>/dev/null) || continue
    grep -qx "FLEET_TEST_MARKER=$marker" <<<"$e" && grep -qx "TRAINING_ROLE=$1" <<<"$e" || continue
    if [ "$1" = PSERVER ]; then # server i: the i-th entry of the server list is its endpoint
      ep="$(sed -n 's/^POD_IP=//p' <<<"$e"):$(sed -n 's/^PADDLE_PORT=//p' <<<"$e")"
      list=$(sed -n 's/^PADDLE_PSERVERS_IP_PORT_LIST=//p' <<<"$e")
      [ "$(cut -d, -f$(($2 + 1)) <<<"$list")" = "$ep" ] && echo "$q $ep"
    else
      grep -qx "PADDLE_TRAINER_ID=$2" <<<"$e" &&
        echo "$q $(sed -n 's/^PADDLE_CURRENT_ENDPOINT=//p' <<<"$e")"
    fi
  done | head -1
}

# stop_one NAME ROLE INDEX [INTERVAL LINE]: SIGSTOP it once worker 0 printed LINE (default: the
# progress line of step 40, not at an evaluation), progress lines every INTERVAL steps (default
# 4); sets ep, secs, rc
stop_one() {
  local name=$1 role=$2 index=$3 iv=${4:-4} line=${5:-"^worker_index: 0, epoch 1, step 40,"}
  local found="" t0 t1
  timeout 120 "$bin/fleetrun" --server_num 2 --worker_num 2 --log_dir "$tmp/log_$name" \
    "$bin/fleet-train" -c "$cfg" -o train.epochs=200 -o train.log_interval="$iv" >"$tmp/$name.out" 2>&1 &
  local fr=$!
  ep="" secs=999
  for _ in $(seq 1 1500); do # up to 30 s
    [ -n "$found" ] || found=$(pid_of "$role" "$index")
    if [ -n "$found" ] && grep -q "$line" "$tmp/$name.out" 2>/dev/null; then
      kill -STOP "${found%% *}"
      ep=${found#* }
      break
    fi
    kill -0 "$fr" 2>/dev/null || break
    sleep 0.02
  done
  t0=$(date +%s.%N)
  wait "$fr"
  rc=$?
  t1=$(date +%s.%N)
  [ -n "$found" ] && kill -9 "${found%% *}" 2>/dev/null
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  echo "$name: stopped $role $index ($ep); the job ended ${secs} s later with status $rc"
}
bounded() { awk -v s="$1" -v t="$timeout_s" 'BEGIN { exit !(s < 3 * t + 10) }'; }

# a) a silent worker (sync): the servers name worker 1 with its endpoint
stop_one worker TRAINER 1
check "worker stopped: found and stopped" test -n "$ep"
check "worker stopped: the job fails (status $rc)" test "$rc" -ne 0
# whoever gives up first names it: a server, as the worker whose push is missing (it sent
# nothing while a merge waits, or a pull waited for the step it lacks; worker 0 then fails with
# that verdict), or worker 0 itself, as the rank its progress line's allreduce waits for
named=$(grep -hE "^fleet-train: error: .*(worker|rank) 1 \($ep\)" "$tmp/log_worker/serverlog.0" \
  "$tmp/log_worker/serverlog.1" "$tmp/log_worker/workerlog.0" | head -1)
echo "worker stopped: ${named:-nobody named it}"
check "worker stopped: worker 0 fails naming it" \
  grep -qE "^fleet-train: error: .*(worker|rank) 1 \($ep\)" "$tmp/log_worker/workerlog.0"
check "worker stopped: ended within 3 x timeout + 10 s (${secs} s)" bounded "$secs"

# b) a silent server: every worker names server 1 with its endpoint. Stopped right after the
# evaluation of step 64, with no progress line before the next evaluation at 96: both workers
# then wait on the servers alone (a worker waiting in the progress line's allreduce for its
# peer, stuck on the server, would name that peer instead, correctly but not the server)
stop_one server PSERVER 1 1000 "^worker_index: 0, epoch 1, step 64, eval"

check "server stopped: found and stopped" test -n "$ep"
check "server stopped: the job fails (status $rc)" test "$rc" -ne 0
for w in 0 1; do
  check "server stopped: worker $w names server 1 ($ep)" \
    grep -q "fleet-train: error: .*server 1 ($ep)" "$tmp/log_server/workerlog.$w" ||
    { echo "worker $w said:"; grep -v '^ *[|+]' "$tmp/log_server/workerlog.$w" | tail -3; }
done
check "server stopped: ended within 3 x timeout + 10 s (${secs} s)" bounded "$secs"

exit $fail
