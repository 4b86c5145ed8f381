#!/usr/bin/env bash
# test_fleetrun_ps.sh - fleetrun in parameter-server mode with a shell program playing both roles:
# the environment of every server and worker (roles, ids, lists, distinct ports, token, listening
# sockets), serverlog.N/workerlog.N and worker 0 on the terminal, servers stopped once every
# worker exited 0, a failed server or worker named with its endpoint and log tail and its code
# passed on, --max_restarts restarting all of them, --servers/--workers on loopback (one fleetrun,
# and two splitting the entries by --node_ip), and the refusals of inconsistent options. The
# listed ports are never bound (the program only prints its environment), so they cannot collide.
set -u
run="${FLEET_BIN:?}/fleetrun"
[ -x "$run" ] || { echo "SKIPPED: fleetrun not built"; exit 77; }
tmp=$(mktemp -d)
marker="1000.$$$RANDOM" # a unique `sleep` argument: finds leftover processes with pgrep
trap 'pkill -KILL -f "^sleep $marker" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}
none_left() { ! pgrep -f "^sleep $marker" >/dev/null; }
envline() { sed -n "s/^$2=//p" "$1"; } # envline FILE NAME -> value
cd "$tmp" || exit 1
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD FLEET_RESTART_COUNT TRAINING_ROLE \
  PADDLE_PSERVERS_IP_PORT_LIST PADDLE_TRAINER_ID PADDLE_CURRENT_ENDPOINT POD_IP PADDLE_PORT

# The program: names itself server.I (its entry in the server list) or worker.I, writes its
# environment to $D/env.NAME.ROUND, says hi; fails with $CODE when NAME.ROUND is in $FAIL; a
# server then serves until stopped (unless $SERVER_EXIT), a worker exits 0 (after sleeping in
# round 0 when $WORKER_WAIT).
cat >prog.sh <<EOF
#!/bin/sh
if [ "\$TRAINING_ROLE" = PSERVER ]; then
  i=0; id=x
  for ep in \$(echo "\$PADDLE_PSERVERS_IP_PORT_LIST" | tr , ' '); do
    [ "\$ep" = "\$POD_IP:\$PADDLE_PORT" ] && id=\$i; i=\$((i + 1))
  done
  name=server.\$id
else
  name=worker.\$PADDLE_TRAINER_ID
fi
env | grep -E '^(PADDLE|FLAGS|FLEET|TRAINING|POD|LOCAL_|GROUP_)' | sort >"\$D/env.\$name.\$FLEET_RESTART_COUNT"
echo "\$name says hi"
case " \${FAIL:-} " in *" \$name.\$FLEET_RESTART_COUNT "*) echo "\$name fails on purpose"; exit "\${CODE:-7}";; esac
if [ "\$TRAINING_ROLE" = PSERVER ]; then
  [ -n "\${SERVER_EXIT:-}" ] && exit 0
  exec sleep $marker
fi
[ -n "\${WORKER_WAIT:-}" ] && [ "\$FLEET_RESTART_COUNT" = 0 ] && exec sleep $marker
exit 0
EOF
chmod +x prog.sh

# 1. --server_num 2 --worker_num 3: every process's environment; servers that would serve on
# are stopped once the workers are done, and the job ends 0
D=$tmp/e1 && mkdir -p "$D" && export D
timeout 60 "$run" --server_num 2 --worker_num 3 --grace 0.2 --log_dir log1 ./prog.sh >out1 2>&1
check "2+3: exit 0" test $? -eq 0
check "2+3: table says TRAINER" grep -qE '\| +TRAINING_ROLE +TRAINER +\|' out1
check "2+3: servers stopped, said" grep -q "every worker finished, but 2 server(s) still run" out1
check "2+3: nothing left running" none_left
servers=$(envline "$D/env.server.0.0" PADDLE_PSERVERS_IP_PORT_LIST)
workers=$(envline "$D/env.worker.0.0" PADDLE_TRAINER_ENDPOINTS)
token=$(envline "$D/env.server.0.0" FLEET_JOB_TOKEN)
check "2+3: 2 servers listed ($servers)" test "$(echo "$servers" | tr , '\n' | grep -cE '^127\.0\.0\.1:[0-9]+$')" = 2
check "2+3: 3 workers listed ($workers)" test "$(echo "$workers" | tr , '\n' | grep -cE '^127\.0\.0\.1:[0-9]+$')" = 3
check "2+3: 5 distinct ports" test "$(echo "$servers,$workers" | tr , '\n' | sort -u | wc -l)" = 5
check "2+3: a token" test -n "$token"
for name in server.0 server.1 worker.0 worker.1 worker.2; do
  e=$D/env.$name.0 role=${name%.*} i=${name#*.}
  check "2+3: $name ran" test -s "$e"
  check "2+3: $name same server list" test "$(envline "$e" PADDLE_PSERVERS_IP_PORT_LIST)" = "$servers"
  check "2+3: $name same worker list" test "$(envline "$e" PADDLE_TRAINER_ENDPOINTS)" = "$workers"
  check "2+3: $name 3 trainers" test "$(envline "$e" PADDLE_TRAINERS_NUM)" = 3
  check "2+3: $name same token" test "$(envline "$e" FLEET_JOB_TOKEN)" = "$token"
  check "2+3: $name round 0" test "$(envline "$e" FLEET_RESTART_COUNT)" = 0
  check "2+3: $name own listening socket" grep -qE '^FLEET_LISTEN_FD=[0-9]+$' "$e"
  check "2+3: no torchrun layout for $name" bash -c "! grep -qE '^(LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK)=' '$e'"
  own="$(envline "$e" POD_IP):$(envline "$e" PADDLE_PORT)"
  if [ "$role" = server ]; then
    check "2+3: $name is PSERVER" test "$(envline "$e" TRAINING_ROLE)" = PSERVER
    check "2+3: $name POD_IP:PADDLE_PORT = entry $i" test "$own" = "$(echo "$servers" | cut -d, -f$((i + 1)))"
    check "2+3: $name has no trainer id" bash -c "! grep -qE '^(PADDLE_TRAINER_ID|PADDLE_CURRENT_ENDPOINT)=' '$e'"
    log=log1/serverlog.$i
  else
    check "2+3: $name is TRAINER" test "$(envline "$e" TRAINING_ROLE)" = TRAINER
    check "2+3: $name id" test "$(envline "$e" PADDLE_TRAINER_ID)" = "$i"
    check "2+3: $name current = entry $i" test "$(envline "$e" PADDLE_CURRENT_ENDPOINT)" = "$(echo "$workers" | cut -d, -f$((i + 1)))"
    check "2+3: $name POD_IP:PADDLE_PORT = current" test "$own" = "$(envline "$e" PADDLE_CURRENT_ENDPOINT)"
    check "2+3: $name gpu $i" test "$(envline "$e" FLAGS_selected_gpus)" = "$i"
    log=log1/workerlog.$i
  fi
  check "2+3: $log has $name" grep -qx "$name says hi" "$log"
done
check "2+3: worker 0 on the terminal" grep -qx "worker.0 says hi" out1
check "2+3: nobody else on the terminal" bash -c "! grep -qE '^(server\.[01]|worker\.[12]) says hi' out1"
check "2+3: 5 logs" test "$(ls log1 | tr '\n' ' ')" = "serverlog.0 serverlog.1 workerlog.0 workerlog.1 workerlog.2 "

# 1b. the workers' environment is a collective job's, too: they form a communicator of their own
# (fleet-commbench's allreduce, checked) on the sockets fleetrun bound for them
if [ -x "$FLEET_BIN/fleet-commbench" ]; then
  cat >cb.sh <<EOF
#!/bin/sh
[ "\$TRAINING_ROLE" = PSERVER ] && exit 0
exec "$FLEET_BIN/fleet-commbench" -b 1K -e 1K -n 2 -w 1
EOF
  chmod +x cb.sh
  FLEET_COMM_TIMEOUT=30 timeout 60 "$run" --server_num 1 --worker_num 2 --log_dir logcb ./cb.sh >outcb 2>&1
  check "communicator of the workers: exit 0" test $? -eq 0
  check "communicator of the workers: 2 ranks, checked" grep -q "^# Out of bounds values : 0 OK" outcb
else
  echo "skipped: the workers' communicator (fleet-commbench not built)"
fi

# 2. a server fails while the workers run: named with its endpoint and log tail, its code out,
# the others stopped
D=$tmp/e2 && mkdir -p "$D"
FAIL=server.1.0 CODE=7 WORKER_WAIT=1 timeout 60 "$run" --server_num 2 --worker_num 2 --grace 0.2 \
  --log_dir log2 ./prog.sh >out2 2>&1
check "server fails: exit 7" test $? -eq 7
ep="$(envline "$D/env.server.1.0" POD_IP):$(envline "$D/env.server.1.0" PADDLE_PORT)"
check "server fails: named with its endpoint" grep -qF "fleetrun: server 1 ($ep) exited with code 7" out2
check "server fails: its log's tail" grep -qx "server.1 fails on purpose" out2
check "server fails: tail of serverlog.1" grep -q -- "----- last 20 lines of log2/serverlog.1 -----" out2
check "server fails: nothing left running" none_left

# 3. a worker fails: the same
D=$tmp/e3 && mkdir -p "$D"
FAIL=worker.1.0 CODE=9 WORKER_WAIT=1 timeout 60 "$run" --server_num 1 --worker_num 2 --grace 0.2 \
  --log_dir log3 ./prog.sh >out3 2>&1
check "worker fails: exit 9" test $? -eq 9
ep=$(envline "$D/env.worker.1.0" PADDLE_CURRENT_ENDPOINT)
check "worker fails: named with its endpoint" grep -qF "fleetrun: worker 1 ($ep) exited with code 9" out3
check "worker fails: its log's tail" grep -qx "worker.1 fails on purpose" out3
check "worker fails: nothing left running" none_left

# 3b. a server that fails on its own after the workers are done fails the job
D=$tmp/e3b && mkdir -p "$D"
FAIL=server.0.0 CODE=5 timeout 60 "$run" --server_num 1 --worker_num 1 --grace 2 --log_dir log3b \
  ./prog.sh >out3b 2>&1
check "server fails last: exit 5" test $? -eq 5
check "server fails last: named" grep -q "fleetrun: server 0 (127.0.0.1:[0-9]*) exited with code 5" out3b

# 3c. a server killed by a signal: named so, 128 + 9 out
D=$tmp/e3c && mkdir -p "$D"
WORKER_WAIT=1 timeout 60 "$run" --server_num 1 --worker_num 1 --grace 0.2 --log_dir log3c ./prog.sh >out3c 2>&1 &
bg=$!
killed=0
for _ in $(seq 1 500); do # until the server serves (its sleep), at most 10 s
  for p in $(pgrep -f "^sleep $marker"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx TRAINING_ROLE=PSERVER &&
      grep -q "^FLEET_JOB_TOKEN=" "$D/env.server.0.0" 2>/dev/null && kill -9 "$p" && killed=1
  done
  [ $killed = 1 ] && break
  sleep 0.02
done
wait $bg
check "server killed: exit 137" test $? -eq 137
check "server killed: named" grep -q "fleetrun: server 0 (127.0.0.1:[0-9]*) killed by signal 9 (SIGKILL)" out3c
check "server killed: nothing left running" none_left

# 4. --max_restarts 1: a server's failure restarts every server and worker, FLEET_RESTART_COUNT 1
D=$tmp/e4 && mkdir -p "$D"
FAIL=server.0.0 WORKER_WAIT=1 timeout 60 "$run" --server_num 2 --worker_num 2 --grace 0.2 \
  --max_restarts 1 --log_dir log4 ./prog.sh >out4 2>&1
check "restart: exit 0" test $? -eq 0
check "restart: said" grep -qF "restart 1 of 1: starting 2 server(s) and 2 worker(s) again (FLEET_RESTART_COUNT=1)" out4
for name in server.0 server.1 worker.0 worker.1; do
  check "restart: $name in round 1" test "$(envline "$D/env.$name.1" FLEET_RESTART_COUNT)" = 1
  check "restart: $name's token of round 1" test "$(envline "$D/env.$name.1" FLEET_JOB_TOKEN)" = "$(envline "$D/env.$name.0" FLEET_JOB_TOKEN).1"
done
check "restart: fresh server ports" test "$(envline "$D/env.server.0.1" PADDLE_PSERVERS_IP_PORT_LIST)" != "$(envline "$D/env.server.0.0" PADDLE_PSERVERS_IP_PORT_LIST)"
check "restart: nothing left running" none_left

# 5. --servers/--workers on loopback, every entry here: the given endpoints, no inherited sockets
D=$tmp/e5 && mkdir -p "$D"
S=127.0.0.1:7101,127.0.0.1:7102 W=127.0.0.1:7103,127.0.0.1:7104
timeout 60 "$run" --servers $S --workers $W --grace 0.2 --log_dir log5 ./prog.sh >out5 2>&1
check "lists: exit 0" test $? -eq 0
check "lists: server list as given" test "$(envline "$D/env.server.1.0" PADDLE_PSERVERS_IP_PORT_LIST)" = $S
check "lists: server 1's port" test "$(envline "$D/env.server.1.0" PADDLE_PORT)" = 7102
check "lists: worker 1's endpoint" test "$(envline "$D/env.worker.1.0" PADDLE_CURRENT_ENDPOINT)" = 127.0.0.1:7104
check "lists: no inherited socket" bash -c "! grep -q FLEET_LISTEN_FD '$D/env.worker.0.0'"
check "lists: nothing left running" none_left

# 5b. --servers with --worker_num: the workers here, on ports fleetrun binds
D=$tmp/e5b && mkdir -p "$D"
timeout 60 "$run" --servers $S --worker_num 2 --grace 0.2 --log_dir log5b ./prog.sh >out5b 2>&1
check "list + count: exit 0" test $? -eq 0
w5=$(envline "$D/env.worker.1.0" PADDLE_TRAINER_ENDPOINTS)
check "list + count: 2 workers on their own ports ($w5)" test "$(echo "$S,$w5" | tr , '\n' | sort -u | wc -l)" = 4
check "list + count: worker socket" grep -qE '^FLEET_LISTEN_FD=[0-9]+$' "$D/env.worker.1.0"

# 5c. two "machines" by --node_ip: each fleetrun starts its own entries; servers that exit by
# themselves end each side with 0 (a side without every worker never stops its servers)
D=$tmp/e5c && mkdir -p "$D"
export FLEET_JOB_TOKEN="ps$$$RANDOM"
S=127.0.0.1:7111,127.0.0.2:7112 W=127.0.0.2:7113,127.0.0.1:7114
SERVER_EXIT=1 timeout 60 "$run" --servers $S --workers $W --node_ip 127.0.0.2 --log_dir log5c2 ./prog.sh >out5c2 2>&1 &
bg=$!
SERVER_EXIT=1 timeout 60 "$run" --servers $S --workers $W --node_ip 127.0.0.1 --log_dir log5c1 ./prog.sh >out5c1 2>&1
check "two sides: .1 exit 0" test $? -eq 0
wait $bg
check "two sides: .2 exit 0" test $? -eq 0
check "two sides: .1 ran server 0 and worker 1" test "$(ls log5c1 | tr '\n' ' ')" = "serverlog.0 workerlog.1 "
check "two sides: .2 ran server 1 and worker 0" test "$(ls log5c2 | tr '\n' ' ')" = "serverlog.1 workerlog.0 "
check "two sides: server 1 at 127.0.0.2:7112" test "$(envline "$D/env.server.1.0" POD_IP):$(envline "$D/env.server.1.0" PADDLE_PORT)" = 127.0.0.2:7112
check "two sides: worker 1 current" test "$(envline "$D/env.worker.1.0" PADDLE_CURRENT_ENDPOINT)" = 127.0.0.1:7114
check "two sides: the shared token" test "$(envline "$D/env.worker.0.0" FLEET_JOB_TOKEN)" = "$FLEET_JOB_TOKEN"
check "two sides: worker 0 on .2's terminal" grep -qx "worker.0 says hi" out5c2
check "two sides: .1 says where worker 0 runs" grep -q "worker 0 runs on 127.0.0.2:7113" out5c1
unset FLEET_JOB_TOKEN

# 6. refusals: exit 2 before anything starts, naming what is wrong
refuse() { # refuse DESCRIPTION EXPECTED-TEXT FLEETRUN-ARGS...
  local what=$1 want=$2 out rc
  shift 2
  out=$(FLEET_JOB_TOKEN=t timeout 30 "$run" --log_dir "$tmp/logr" "$@" ./prog.sh 2>&1)
  rc=$?
  check "refuse $what: exit 2 (got $rc)" test $rc -eq 2
  check "refuse $what: says '$want' ($out)" grep -qF -- "$want" <<<"$out"
}
refuse "servers without workers" "--server_num without --worker_num or --workers" --server_num 2
refuse "workers without servers" "--worker_num without --server_num or --servers" --worker_num 2
refuse "count against list" "--server_num 3 but --servers lists 2 endpoint(s)" \
  --server_num 3 --servers 127.0.0.1:7001,127.0.0.1:7002 --worker_num 1
refuse "workers count against list" "--worker_num 1 but --workers lists 2 endpoint(s)" \
  --server_num 1 --worker_num 1 --workers 127.0.0.1:7001,127.0.0.1:7002
refuse "with --nproc_per_node" "--nproc_per_node is an option of collective jobs" \
  --server_num 1 --worker_num 1 --nproc_per_node 2
refuse "with --ips" "--ips is an option of collective jobs" --server_num 1 --worker_num 1 --ips 127.0.0.1
refuse "with --gpus" "--gpus is an option of collective jobs" --server_num 1 --worker_num 1 --gpus 0,1
refuse "duplicate server" "server 0 and server 1 are both on 127.0.0.1:7001" \
  --servers 127.0.0.1:7001,127.0.0.1:7001 --worker_num 1
refuse "server and worker on one endpoint" "server 0 and worker 1 are both on 127.0.0.1:7001" \
  --servers 127.0.0.1:7001 --workers 127.0.0.1:7002,127.0.0.1:7001
refuse "a host name" "--servers: 'localhost:7002' (entry 2) is not IP:PORT" \
  --servers 127.0.0.1:7001,localhost:7002 --worker_num 1
refuse "no port" "--workers: '127.0.0.1' (entry 1) is not IP:PORT" --server_num 1 --workers 127.0.0.1
refuse "a bad port" "--servers: '127.0.0.1:70000' (entry 1) is not IP:PORT" \
  --servers 127.0.0.1:70000 --worker_num 1
refuse "an empty entry" "--servers: entry 2 is empty" --servers 127.0.0.1:7001,,127.0.0.1:7002 --worker_num 1
refuse "nothing here" "no entry of --servers 127.0.0.2:7001 or --workers 127.0.0.2:7002 is on this machine (--node_ip 127.0.0.3)" \
  --servers 127.0.0.2:7001 --workers 127.0.0.2:7002 --node_ip 127.0.0.3
refuse "restarts across machines" "--max_restarts with servers or workers on other machines" \
  --servers 127.0.0.1:7001 --workers 127.0.0.2:7002 --node_ip 127.0.0.1 --max_restarts 1
refuse "--started_port with both lists" "--started_port with --servers and --workers" \
  --servers 127.0.0.1:7001 --workers 127.0.0.1:7002 --started_port 7000
multi=$(timeout 30 "$run" --servers 127.0.0.1:7001 --workers 127.0.0.2:7002 --node_ip 127.0.0.1 ./prog.sh 2>&1)
check "several machines without a token: exit 2" test $? -eq 2
check "several machines without a token: said" grep -q "needs the same FLEET_JOB_TOKEN on every machine" <<<"$multi"
check "refusals: no log directory made" test ! -e "$tmp/logr"

check "nothing left running at the end" none_left
[ $fail -eq 0 ] && echo "test_fleetrun_ps: all passed"
exit $fail
