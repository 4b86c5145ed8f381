#!/usr/bin/env bash
# test_fleetrun.sh - the launcher with plain shell programs as workers: the environment each
# worker gets (ids, endpoints, devices, ports, token, inherited listening socket), workerlog
# files and rank 0 on the terminal, and how a failed worker or a signal stops the whole node.
set -u
run="${FLEET_BIN:?}/fleetrun"
tmp=$(mktemp -d)
marker="1000.$$$RANDOM" # a unique `sleep` argument: finds leftover workers with pgrep
trap 'pkill -KILL -f "^sleep $marker" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}
none_left() { # no worker of this test still running
  ! pgrep -f "^sleep $marker" >/dev/null
}
envline() { # envline FILE NAME -> value
  sed -n "s/^$2=//p" "$1"
}
dump_env='env | grep -E "^(PADDLE|FLAGS|FLEET)" > "$D/env.$PADDLE_TRAINER_ID"'
cd "$tmp" || exit 1
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD

# 1. one worker, defaults: table, env, log, listening socket handed over
D=$tmp/e1 && mkdir -p "$D" && export D
timeout 60 "$run" --log_dir "$tmp/log1" sh -c "$dump_env; echo rank0-says-hi" >"$tmp/out1" 2>&1
check "nproc 1: exit 0" test $? -eq 0
check "table printed" grep -q 'Distributed Envs.*Value' "$tmp/out1"
check "table has PADDLE_TRAINER_ENDPOINTS row" grep -qE '\| +PADDLE_TRAINER_ENDPOINTS +127\.0\.0\.1:[0-9]+ +\|' "$tmp/out1"
check "table shows the token cut" grep -qE 'FLEET_JOB_TOKEN +[0-9a-f]{8}… ' "$tmp/out1"
check "rank 0 on the terminal" grep -q '^rank0-says-hi$' "$tmp/out1"
check "workerlog.0" grep -q '^rank0-says-hi$' "$tmp/log1/workerlog.0"
e=$D/env.0
check "nproc 1: id 0" test "$(envline "$e" PADDLE_TRAINER_ID)" = 0
check "nproc 1: 1 trainer" test "$(envline "$e" PADDLE_TRAINERS_NUM)" = 1
check "nproc 1: endpoint = current" test "$(envline "$e" PADDLE_TRAINER_ENDPOINTS)" = "$(envline "$e" PADDLE_CURRENT_ENDPOINT)"
check "nproc 1: gpu 0" test "$(envline "$e" FLAGS_selected_gpus)" = 0
check "token is 32 hex chars" grep -qE '^FLEET_JOB_TOKEN=[0-9a-f]{32}$' "$e"
check "FLEET_LISTEN_FD set" grep -qE '^FLEET_LISTEN_FD=[0-9]+$' "$e"
check "token not printed in full" bash -c "! grep -q '$(envline "$e" FLEET_JOB_TOKEN)' '$tmp/out1'"

# 2. three workers: ids, node-major endpoints with distinct ports, devices, logs
D=$tmp/e3 && mkdir -p "$D"
timeout 60 "$run" --nproc_per_node=3 --log_dir "$tmp/log3" \
  sh -c "$dump_env; echo out-of-\$PADDLE_TRAINER_ID; echo err-of-\$PADDLE_TRAINER_ID >&2" >"$tmp/out3" 2>&1
check "nproc 3: exit 0" test $? -eq 0
eps=$(envline "$D/env.0" PADDLE_TRAINER_ENDPOINTS)
check "nproc 3: 3 distinct endpoints ($eps)" test "$(echo "$eps" | tr , '\n' | grep -cE '^127\.0\.0\.1:[0-9]+$' )" = 3 -a \
  "$(echo "$eps" | tr , '\n' | sort -u | wc -l)" = 3
token=$(envline "$D/env.0" FLEET_JOB_TOKEN)
for i in 0 1 2; do
  e=$D/env.$i
  check "nproc 3: env.$i written" test -s "$e"
  check "nproc 3: worker $i id" test "$(envline "$e" PADDLE_TRAINER_ID)" = $i
  check "nproc 3: worker $i trainers" test "$(envline "$e" PADDLE_TRAINERS_NUM)" = 3
  check "nproc 3: worker $i same endpoint list" test "$(envline "$e" PADDLE_TRAINER_ENDPOINTS)" = "$eps"
  check "nproc 3: worker $i current = entry $i" test "$(envline "$e" PADDLE_CURRENT_ENDPOINT)" = "$(echo "$eps" | cut -d, -f$((i + 1)))"
  check "nproc 3: worker $i gpu" test "$(envline "$e" FLAGS_selected_gpus)" = $i
  check "nproc 3: worker $i same token" test "$(envline "$e" FLEET_JOB_TOKEN)" = "$token"
  check "nproc 3: workerlog.$i has stdout and stderr" grep -qx "out-of-$i" "$tmp/log3/workerlog.$i"
  check "nproc 3: workerlog.$i has stderr" grep -qx "err-of-$i" "$tmp/log3/workerlog.$i"
done
check "rank 0 on the terminal" grep -qx 'out-of-0' "$tmp/out3"
check "rank 0's stderr on the terminal" grep -qx 'err-of-0' "$tmp/out3"
check "ranks 1, 2 not on the terminal" bash -c "! grep -qE '(out|err)-of-[12]' '$tmp/out3'"
tokens_differ() { # a fresh token per job
  local t2
  t2=$(timeout 30 "$run" --log_dir "$tmp/logt" sh -c 'echo $FLEET_JOB_TOKEN' 2>/dev/null | tail -1)
  test -n "$t2" -a "$t2" != "$token"
}
check "a fresh token per job" tokens_differ

# 3. the inherited FLEET_LISTEN_FD is a listening socket on the worker's own endpoint
py=$(command -v /usr/bin/python3 python3 | head -1)
if [ -n "$py" ]; then
  cat >"$tmp/sock.py" <<'EOF'
import os, socket, sys
fd = int(os.environ["FLEET_LISTEN_FD"])
s = socket.socket(fileno=fd)
host, port = s.getsockname()[:2]
ok = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
ok = ok and os.environ["PADDLE_CURRENT_ENDPOINT"] == "%s:%d" % (host, port)
# the other workers' sockets are not inherited (fleetrun sets FD_CLOEXEC on them)
eps = os.environ["PADDLE_TRAINER_ENDPOINTS"].split(",")
others = []
for f in os.listdir("/proc/self/fd"):
    try:
        if int(f) == fd or not os.readlink("/proc/self/fd/" + f).startswith("socket:"):
            continue
        o = socket.socket(fileno=int(f))
        name = o.getsockname()
        o.detach()
        if isinstance(name, tuple) and "%s:%d" % name[:2] in eps:
            others.append(f)
    except OSError:
        pass
print("rank", os.environ["PADDLE_TRAINER_ID"], "listening" if ok else "NOT listening",
      "extra sockets", len(others))
sys.exit(0 if ok and not others else 1)
EOF
  timeout 60 "$run" --nproc_per_node 2 --log_dir "$tmp/logs" "$py" "$tmp/sock.py" >"$tmp/outs" 2>&1
  check "FLEET_LISTEN_FD is a listening socket on the endpoint (both workers)" test $? -eq 0
  check "worker 1 saw its socket" grep -q 'rank 1 listening extra sockets 0' "$tmp/logs/workerlog.1"
else
  echo "note: no python3, socket check skipped"
fi

# 4. --gpus, --started_port, FLAGS_START_PORT
D=$tmp/eg && mkdir -p "$D"
timeout 60 "$run" --gpus 4,6 --started_port 23456 --log_dir "$tmp/logg" sh -c "$dump_env" >/dev/null 2>&1
check "--gpus: exit 0" test $? -eq 0
check "--gpus: 2 workers" test -s "$D/env.1" -a ! -e "$D/env.2"
check "--gpus: worker 0 gets 4" test "$(envline "$D/env.0" FLAGS_selected_gpus)" = 4
check "--gpus: worker 1 gets 6" test "$(envline "$D/env.1" FLAGS_selected_gpus)" = 6
check "--started_port: endpoints" test "$(envline "$D/env.1" PADDLE_TRAINER_ENDPOINTS)" = "127.0.0.1:23456,127.0.0.1:23457"
check "--started_port: no FLEET_LISTEN_FD" bash -c "! grep -q FLEET_LISTEN_FD '$D/env.0'"
D=$tmp/ep && mkdir -p "$D"
FLAGS_START_PORT=31000 timeout 60 "$run" --selected_gpus=1 --log_dir "$tmp/logp" sh -c "$dump_env" >/dev/null 2>&1
check "FLAGS_START_PORT honoured" test "$(envline "$D/env.0" PADDLE_CURRENT_ENDPOINT)" = "127.0.0.1:31000"
check "--selected_gpus alias" test "$(envline "$D/env.0" FLAGS_selected_gpus)" = 1

# 5. fake second node: --ips of two loopback addresses, this node is 127.0.0.2
D=$tmp/en && mkdir -p "$D"
timeout 60 "$run" --ips 127.0.0.1,127.0.0.2 --node_ip 127.0.0.2 --nproc_per_node 3 true >"$tmp/outn0" 2>&1
check "multi-node without FLEET_JOB_TOKEN: exit 2" test $? -eq 2
check "multi-node without FLEET_JOB_TOKEN: hint" grep -q 'hint: export FLEET_JOB_TOKEN=' "$tmp/outn0"
FLEET_JOB_TOKEN=0123456789abcdef0123456789abcdef timeout 60 "$run" --cluster_node_ips=127.0.0.1,127.0.0.2 \
  --node_ip 127.0.0.2 --nproc_per_node 3 --started_port 24000 --log_dir "$tmp/logn" \
  sh -c "$dump_env; echo node1-out-\$PADDLE_TRAINER_ID" >"$tmp/outn" 2>&1
check "node 1: exit 0" test $? -eq 0
want=127.0.0.1:24000,127.0.0.1:24001,127.0.0.1:24002,127.0.0.2:24000,127.0.0.2:24001,127.0.0.2:24002
for i in 0 1 2; do
  e=$D/env.$((3 + i))
  check "node 1: worker $i has id $((3 + i))" test -s "$e"
  check "node 1: worker $i trainers 6" test "$(envline "$e" PADDLE_TRAINERS_NUM)" = 6
  check "node 1: endpoints node-major" test "$(envline "$e" PADDLE_TRAINER_ENDPOINTS)" = "$want"
  check "node 1: worker $i current" test "$(envline "$e" PADDLE_CURRENT_ENDPOINT)" = "127.0.0.2:$((24000 + i))"
  check "node 1: worker $i gpu $i" test "$(envline "$e" FLAGS_selected_gpus)" = $i
  check "node 1: token passed through" test "$(envline "$e" FLEET_JOB_TOKEN)" = 0123456789abcdef0123456789abcdef
  check "node 1: workerlog.$i" grep -qx "node1-out-$((3 + i))" "$tmp/logn/workerlog.$i"
done
check "node 1: nothing of its workers on the terminal (no rank 0 here)" bash -c "! grep -q node1-out '$tmp/outn'"

# 6. a worker exits with code 3: fleetrun exits 3, shows its log tail, stops the others
cat >"$tmp/fail3.sh" <<EOF
if [ "\$PADDLE_TRAINER_ID" = 1 ]; then
  sleep 0.3; i=0; while [ \$i -lt 30 ]; do echo "w1 line \$i"; i=\$((i + 1)); done; exit 3
fi
echo "worker \$PADDLE_TRAINER_ID waits"
sleep $marker
EOF
start=$(date +%s)
timeout 60 "$run" --nproc_per_node 3 --grace 1 --log_dir "$tmp/logf" sh "$tmp/fail3.sh" >"$tmp/outf" 2>&1
rc=$?
check "failed worker: exit 3 (got $rc)" test $rc -eq 3
check "failed worker: named" grep -q 'fleetrun: worker 1 (rank 1) exited with code 3' "$tmp/outf"
check "failed worker: log header" grep -q "last 20 lines of $tmp/logf/workerlog.1" "$tmp/outf"
check "failed worker: log tail" grep -qx 'w1 line 29' "$tmp/outf"
check "failed worker: only the tail" bash -c "! grep -qx 'w1 line 9' '$tmp/outf'"
check "failed worker: no worker left" none_left
check "failed worker: stopped within the grace ($(( $(date +%s) - start )) s)" test $(( $(date +%s) - start )) -le 10

# 7. a worker killed by SIGKILL: 137
cat >"$tmp/kill9.sh" <<EOF
if [ "\$PADDLE_TRAINER_ID" = 0 ]; then sleep 0.3; kill -KILL \$\$; fi
sleep $marker
EOF
timeout 60 "$run" --nproc_per_node 2 --grace 0.5 --log_dir "$tmp/logk" sh "$tmp/kill9.sh" >"$tmp/outk" 2>&1
rc=$?
check "SIGKILLed worker: exit 137 (got $rc)" test $rc -eq 137
check "SIGKILLed worker: named" grep -q 'worker 0 (rank 0) killed by signal 9' "$tmp/outk"
check "SIGKILLed worker: no worker left" none_left

# 7b. a rank's peers exit on its loss and are reaped before it: the killed rank is the cause
cat >"$tmp/order.sh" <<EOF
if [ "\$PADDLE_TRAINER_ID" = 1 ]; then sleep 0.3; echo "peer lost"; exit 1; fi
echo "rank 0 dies"; sleep 0.45; kill -KILL \$\$
EOF
timeout 60 "$run" --nproc_per_node 2 --grace 2 --log_dir "$tmp/logo" sh "$tmp/order.sh" >"$tmp/outo" 2>&1
rc=$?
check "killed after a peer's exit: exit 137 (got $rc)" test $rc -eq 137
check "killed after a peer's exit: it is the cause" grep -q 'worker 0 (rank 0) killed by signal 9' "$tmp/outo"
check "killed after a peer's exit: the peer on one line" grep -q 'worker 1 (rank 1) exited with code 1: peer lost' "$tmp/outo"
check "killed after a peer's exit: the cause's log tail" \
  grep -q "last 20 lines of $tmp/logo/workerlog.0" "$tmp/outo"
check "killed after a peer's exit: not the peer's" \
  bash -c "! grep -q 'lines of $tmp/logo/workerlog.1' '$tmp/outo'"

# 8. SIGINT to fleetrun: every worker stopped, exit 130 (job control on: a background job
#    of a script would otherwise start with SIGINT ignored)
set -m
timeout 60 "$run" --nproc_per_node 3 --grace 2 --log_dir "$tmp/logi" sh -c "echo started; sleep $marker" >"$tmp/outi" 2>&1 &
pid=$!
set +m
for _ in $(seq 100); do
  [ "$(pgrep -fc "^sleep $marker")" = 3 ] && break
  sleep 0.1
done
check "SIGINT: 3 workers running" test "$(pgrep -fc "^sleep $marker")" = 3
kill -INT "$(pgrep -x fleetrun -P "$pid")"
wait "$pid"
rc=$?
check "SIGINT: exit 130 (got $rc)" test $rc -eq 130
check "SIGINT: no worker left" none_left
check "SIGINT: said so" grep -q 'got SIGINT' "$tmp/outi"

# 9. a worker that ignores SIGTERM is SIGKILLed after the grace
set -m
timeout 60 "$run" --nproc_per_node 2 --grace 0.5 --log_dir "$tmp/logtk" \
  sh -c "trap '' TERM; sleep $marker & wait; wait" >"$tmp/outtk" 2>&1 &
pid=$!
set +m
for _ in $(seq 100); do
  [ "$(pgrep -fc "^sleep $marker")" = 2 ] && break
  sleep 0.1
done
kill -TERM "$(pgrep -x fleetrun -P "$pid")"
wait "$pid"
rc=$?
check "SIGTERM ignored by workers: fleetrun exits 143 (got $rc)" test $rc -eq 143
check "SIGTERM ignored by workers: SIGKILL after grace" grep -q 'SIGKILL' "$tmp/outtk"
check "SIGTERM ignored by workers: no worker left" none_left

# 10. bad arguments: exit 2 with a message
bad() { # bad PATTERN ARGS...
  local pattern=$1; shift
  timeout 30 "$run" "$@" >"$tmp/bad.out" 2>"$tmp/bad.err"
  local rc=$?
  check "bad args '$*': exit 2 (got $rc)" test $rc -eq 2
  check "bad args '$*': says '$pattern'" grep -qE -e "fleetrun: error: .*$pattern" "$tmp/bad.err"
  check "bad args '$*': usage hint" grep -q 'usage: fleetrun' "$tmp/bad.err"
}
bad "unknown option '--bogus'" --bogus 1 true
bad "no PROGRAM" --nproc_per_node 2
bad "--nproc_per_node: 'x'" --nproc_per_node x true
bad "needs a value" --log_dir
bad "--gpus lists 2" --nproc_per_node 3 --gpus 0,1 true
bad "--started_port" --started_port 70000 true
bad "--max_restarts: '-1' is not a number from 0 to 1000" --max_restarts -1 true
bad "--max_restarts: 'x'" --max-restarts x true
bad "not an IPv4" --ips 1.2.3,4.5.6.7 true
bad "not one of --ips" --ips 127.0.0.1,127.0.0.2 --node_ip 127.0.0.3 true
FLAGS_START_PORT=abc bad "FLAGS_START_PORT" true
bad "--nnodes: '3:2' is not MIN:MAX" --nnodes 3:2 true
bad "--nnodes: 'x' is not a number of nodes" --nnodes x true
bad "--nnodes 1:3, but --ips lists 2 node\\(s\\)" --ips 127.0.0.1,127.0.0.2 --node_ip 127.0.0.1 --nnodes 1:3 true
bad "--node_timeout: '0' is not a number of seconds" --node_timeout 0 true
bad "--coord_port: '70000'" --coord_port 70000 true
bad "--started_port 1 leaves no port below it" --ips 127.0.0.1,127.0.0.2 --node_ip 127.0.0.1 --max_restarts 1 --started_port 1 true
timeout 30 "$run" --log_dir "$tmp/lognp" no-such-program-xyz >/dev/null 2>"$tmp/np.err"
check "missing program: exit 127" test $? -eq 127
check "missing program: named" grep -q "no-such-program-xyz" "$tmp/np.err"
check "fleetrun --help: exit 0" timeout 10 "$run" --help >/dev/null

check "nothing left behind at the end" none_left
exit $fail
