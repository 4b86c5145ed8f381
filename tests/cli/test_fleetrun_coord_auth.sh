#!/usr/bin/env bash
# test_fleetrun_coord_auth.sh - fleetrun's coordinator between nodes authenticates (auth.c): two
# nodes emulated on this machine (127.0.0.1 and 127.0.0.2, each its own fleetrun, workers a
# short shell command), node 1 talking to node 0's coordinator through a relay
# (tests/cli/line_relay.py) that records every byte and may change one:
#  1. the recorded exchange holds neither the job token nor anything from which the relay could
#     join: a stranger, an older fleetrun's HELLO (token in the clear), a replay of node 1's
#     recorded AUTH and PROOF and a fleetrun with a wrong token are refused, each named by its
#     address, while the job runs on and ends 0;
#     a worker that fails on node 1 is restarted and given up on through the sealed lines;
#  2. one byte changed in a sealed line, either way (node 1's HELLO; the coordinator's GO):
#     the job ends with status 1 on both nodes, naming node 1;
#  3. one byte changed in the coordinator's proof: node 1 refuses the coordinator.
# Ports: a free range picked at random below the kernel's ephemeral range, checked with ss (as
# test_fleetrun_nodes.sh does).
set -u
run="${FLEET_BIN:?}/fleetrun"
src="${FLEET_SRC:?}"
[ -x "$run" ] || { echo "SKIPPED: fleetrun not built"; exit 77; }
py=$(command -v /usr/bin/python3 python3 | head -1)
[ -n "$py" ] || { echo "SKIPPED: no python3 for the relay"; exit 77; }
tmp=$(mktemp -d)
marker="fleetrun_coord_auth_$$"
export FLEET_TEST_MARKER=$marker
token="coordauth-$$-$RANDOM$RANDOM-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
export FLEET_JOB_TOKEN=$token
unset FLAGS_START_PORT FLEET_LISTEN_FD FLEET_RESTART_COUNT
relay_pid=""
. "${FLEET_SRC:?}/tests/cli/marker_lib.sh" # kill_marked
cleanup() {
  [ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null
  kill_marked "$run"
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
. "$src/tests/cli/dist_train_lib.sh" # check
cd "$tmp" || exit 1

port_free() { ! ss -Htan 2>/dev/null | awk '{print $4}' | grep -qE ":($1)\$"; }
read -r eph_lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || eph_lo=32768
[ "$eph_lo" -ge 14000 ] || eph_lo=32768
for _ in $(seq 1 50); do
  base=$((eph_lo - 12000 + RANDOM % 10000))
  port_free "$((base - 2))|$((base - 1))|$base" && break
done
cport=$((base - 1)) rport=$((base - 2)) # the coordinator's port, the relay's
ips=(--ips 127.0.0.1,127.0.0.2 --started_port "$base" --max_restarts 1 --node_timeout 3)

# node NAME NODE_IP COORD_PORT SECONDS [SHELL-COMMAND]: one node of one worker that sleeps
# (or runs the command), in background
node() {
  FLEET_NODE_NAME=$1 timeout 60 "$run" "${ips[@]}" --node_ip "$2" --coord_port "$3" \
    --nproc_per_node 1 --log_dir "$1.log" sh -c "${5:-sleep $4}" >"$1.out" 2>&1 &
}
# relay NAME [--flip DIR:N]: node 1's way to the coordinator, recorded in NAME.cap.up/.down
relay() {
  local name=$1; shift
  "$py" "$src/tests/cli/line_relay.py" "127.0.0.1:$rport" "127.0.0.1:$cport" "$name.cap" "$@" \
    >"$name.relay" 2>&1 &
  relay_pid=$!
  for _ in $(seq 1 250); do grep -q ready "$name.relay" 2>/dev/null && return 0; sleep 0.02; done
  echo "FAIL: the relay did not start"; cat "$name.relay"; fail=1
}
relay_stop() { kill "$relay_pid" 2>/dev/null; wait "$relay_pid" 2>/dev/null; relay_pid=""; }
wait_line() { # wait_line FILE REGEX SECONDS: until a line matches
  for _ in $(seq 1 $(($3 * 50))); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.02; done
  return 1
}
refused() { grep -qE "refused a connection to the coordinator from 127\.0\.0\.[0-9]+:[0-9]+: $1" ok0.out; }

# 1. an undisturbed job through the relay, and strangers while it runs (its workers sleep 6 s:
# the four probes below must reach the coordinator before the job ends, also on a loaded
# machine)
relay ok
node ok0 127.0.0.1 "$cport" 6
n0=$!
node ok1 127.0.0.2 "$rport" 6
n1=$!
if wait_line ok1.out "ranks 1\.\.1 of 2" 20; then
  (exec 3<>"/dev/tcp/127.0.0.1/$cport" && printf 'GET / HTTP/1.0\r\n\r\n' >&3; sleep 0.2) 2>/dev/null
  (exec 3<>"/dev/tcp/127.0.0.1/$cport" && printf 'HELLO %s 1 1\n' "$token" >&3; sleep 0.2) 2>/dev/null
  (exec 3<>"/dev/tcp/127.0.0.1/$cport" && head -n 2 ok.cap.up >&3; sleep 0.2) 2>/dev/null
  FLEET_JOB_TOKEN="not-$token" node wrong1 127.0.0.2 "$cport" 1
  wait $!; rcw=$?
else
  rcw=-1
fi
wait $n0; rc0=$?; wait $n1; rc1=$?
relay_stop
check "undisturbed through the relay: both nodes exit 0 ($rc0, $rc1)" test $rc0 -eq 0 -a $rc1 -eq 0
check "the relay saw the handshake" grep -q "^AUTH fleetrun/2 1 1 [0-9a-f]\{64\}$" ok.cap.up
check "the relay saw sealed lines both ways" grep -qE "^[0-9a-f]{64} GO 0 2 0:1 1:1" ok.cap.down
check "the token is not on the wire" bash -c "test -s ok.cap.up -a -s ok.cap.down && ! grep -qF '$token' ok.cap.up ok.cap.down"
check "a stranger: refused, named" refused "not a fleetrun of this job"
check "a token in the clear (older fleetrun): refused, named" refused "it sent a job token in the clear"
check "a replay of node 1's recorded AUTH and PROOF: refused, named" refused "its proof of the job token is wrong \(node 1 "
check "a wrong token: refused ($rcw)" test $rcw -eq 1
check "a wrong token: told so" grep -q "the coordinator at 127.0.0.1:$cport refused this node: its proof of the job token is wrong" wrong1.out
check "a wrong token: no worker started" test ! -s wrong1.log/workerlog.0
check "the job did not restart" bash -c "! grep -q 'restart 1' ok0.out ok1.out"

# ... and a failure on node 1, through the relay: FAIL, STOP, EXIT, a restart's GO and the END
relay fail
node fail0 127.0.0.1 "$cport" 30
n0=$!
node fail1 127.0.0.2 "$rport" 30 "exit 3"
n1=$!
wait $n0; rc0=$?; wait $n1; rc1=$?
relay_stop
check "a failing worker: both nodes exit 3 ($rc0, $rc1)" test $rc0 -eq 3 -a $rc1 -eq 3
check "a failing worker: restarted once, then given up" grep -q "giving up: the job failed again after 1 restart(s) (--max_restarts 1): node 1 (127.0.0.2): worker 0 (rank 1) exited with code 3" fail0.out
check "a failing worker: node 0's worker stopped in both rounds" test "$(grep -c "stopping this node's 1 worker(s)" fail0.out)" -eq 2
check "a failing worker: sealed FAIL lines crossed" test "$(grep -cE '^[0-9a-f]{64} FAIL [01] 3 0' fail.cap.up)" -eq 2

# 2. one byte changed in a sealed line: node 1's HELLO, then the coordinator's GO
relay up --flip up:3
node up0 127.0.0.1 "$cport" 30
n0=$!
node up1 127.0.0.2 "$rport" 30
n1=$!
wait $n0; rc0=$?; wait $n1; rc1=$?
relay_stop
check "changed HELLO: both nodes exit 1 ($rc0, $rc1)" test $rc0 -eq 1 -a $rc1 -eq 1
check "changed HELLO: node 1 named on node 0" grep -q "error: a line from node 1 (127.0.0.2) failed its integrity check at the coordinator" up0.out
check "changed HELLO: node 1 told" grep -q "error: a line from node 1 (127.0.0.2) failed its integrity check at the coordinator" up1.out

relay down --flip down:3
node down0 127.0.0.1 "$cport" 30
n0=$!
node down1 127.0.0.2 "$rport" 30
n1=$!
wait $n0; rc0=$?; wait $n1; rc1=$?
relay_stop
check "changed GO: both nodes exit 1 ($rc0, $rc1)" test $rc0 -eq 1 -a $rc1 -eq 1
check "changed GO: node 1 says so" grep -q "error: a line from the job's coordinator at 127.0.0.1:$rport (node 0's fleetrun) failed its integrity check at node 1 (127.0.0.2)" down1.out
check "changed GO: node 0 names node 1" grep -q "error: a line from the coordinator to node 1 (127.0.0.2) failed its integrity check there" down0.out
check "changed GO: node 0's worker stopped, not finished" grep -q "stopping this node's 1 worker(s)" down0.out

# 3. one byte changed in the coordinator's proof: node 1 does not trust it
relay proof --flip down:2
node proof0 127.0.0.1 "$cport" 30
n0=$!
node proof1 127.0.0.2 "$rport" 30
n1=$!
wait $n1; rc1=$?; wait $n0; rc0=$?
relay_stop
check "a coordinator without the token: node 1 exits 1 ($rc1)" test $rc1 -eq 1
check "a coordinator without the token: node 1 says so" grep -q "error: the job's coordinator at 127.0.0.1:$rport did not prove that it knows the job token" proof1.out
check "a coordinator without the token: node 1 never joined ($rc0)" grep -q "error: round 0: node 1 (127.0.0.2) did not join within 3 s" proof0.out

[ $fail -eq 0 ] || tail -n 5 ./*.out
[ $fail -eq 0 ] && echo "test_fleetrun_coord_auth: all checks passed"
exit $fail
