#!/usr/bin/env bash
# test_fleetrun_nodes.sh - a job of two nodes emulated on this machine (127.0.0.1 and 127.0.0.2,
# each with its own fleetrun) that node 0's fleetrun coordinates (--max_restarts, --nnodes):
#  1. a worker of node 1 SIGKILLed mid-training: both nodes stop and restart together, resume
#     from the newest checkpoint, and end with parameters bit-identical to an undisturbed run's;
#     a stranger and an older fleetrun's HELLO (its token in the clear) at the coordinator's
#     port are refused, the job goes on (test_fleetrun_coord_auth.sh tests the handshake);
#  2. scale in: node 1 (one worker) gone for good, its fleetrun SIGKILLed: after --node_timeout
#     node 0's 3 workers go on alone, resharded, and reach the accuracy docs/elastic.md states
#     (Fashion-MNIST MLP, 3 epochs: val_acc1 >= 0.86);
#  3. without --nnodes a node that does not come back ends the job, naming it;
#  4. a bad config (status 2) is not restarted on any node; a node that never starts is named;
#  5. node 0's fleetrun killed: node 1 says it lost the coordinator and stops its workers.
# Ports: a free range picked at random below the kernel's ephemeral range (so that no outgoing
# connection of a test running beside this one takes one between the check and the bind),
# checked with ss against every socket, listening or not.
set -u
bin="${FLEET_BIN:?}/fleet-train"
run="${FLEET_BIN:?}/fleetrun"
ckpt="${FLEET_BIN:?}/fleet-ckpt"
src="${FLEET_SRC:?}"
[ -x "$bin" ] && [ -x "$run" ] && [ -x "$ckpt" ] || { echo "SKIPPED: tools not built"; exit 77; }
[ -d /usr/share/datasets/fashion-mnist ] || [ -n "${FLEET_FASHION_ROOT:-}" ] ||
  { echo "SKIPPED: Fashion-MNIST not installed (scripts/install-deps.sh)"; exit 77; }
tmp=$(mktemp -d)
marker="fleetrun_nodes_$$"
export FLEET_TEST_MARKER=$marker OMP_NUM_THREADS=1 FLEET_COMM_TIMEOUT=30
export FLEET_JOB_TOKEN="nodes$$$RANDOM"
unset FLAGS_START_PORT FLEET_LISTEN_FD FLEET_RESTART_COUNT FLEET_BENCH_SLOW
. "${FLEET_SRC:?}/tests/cli/marker_lib.sh" # kill_marked
cleanup() {
  kill_marked "$run|$bin"
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
  port_free "$((base - 1))|$base|$((base + 1))|$((base + 2))" && break
done
ips=(--ips 127.0.0.1,127.0.0.2 --started_port "$base")

pid_of() { # pid_of PROGRAM-PATH VAR=VALUE: this test's process with that environment entry
  for p in $(pgrep -f "$1" || true); do
    env_of=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null) || continue
    grep -qx "FLEET_TEST_MARKER=$marker" <<<"$env_of" && grep -qx "$2" <<<"$env_of" && echo "$p"
  done
}
# node NAME NODE_IP NPROC FLEETRUN-OPTIONS... -- FLEET-TRAIN-ARGS...: one node, in background
node() {
  local name=$1 ip=$2 n=$3; shift 3
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  FLEET_NODE_NAME=$name timeout 300 "$run" "${ips[@]}" --node_ip "$ip" --nproc_per_node "$n" \
    "${opts[@]}" --log_dir "$name.log" "$bin" "$@" >"$name.out" 2>&1 &
}
wait_line() { # wait_line FILE REGEX SECONDS: until a line matches
  for _ in $(seq 1 $(($3 * 50))); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.02; done
  return 1
}
quick=(-c "$src/configs/quickstart.yaml" -o train.epochs=4 -o train.log_interval=2
       -o checkpoint.save_interval=4 -o checkpoint.keep=2 -o checkpoint.resume=auto)

# 1. restart across nodes: the undisturbed reference, with a stranger and a wrong token; steps
# slowed by a 25 ms sleep (FLEET_BENCH_SLOW, numbers unchanged) so that both land mid-run
export FLEET_BENCH_SLOW=1:25:0
node ref0 127.0.0.1 2 --max_restarts 2 -- "${quick[@]}" -o checkpoint.dir=ref/ck
r0=$!
node ref1 127.0.0.2 2 --max_restarts 2 -- "${quick[@]}" -o checkpoint.dir=ref/ck
r1=$!
wait_line ref0.out "^worker_index: 0, epoch 0, step 2," 60
(exec 3<>"/dev/tcp/127.0.0.1/$((base - 1))" && printf 'GET / HTTP/1.0\r\n\r\n' >&3; sleep 0.2) 2>/dev/null
(exec 3<>"/dev/tcp/127.0.0.1/$((base - 1))" && printf 'HELLO wrongtoken 1 2\n' >&3; sleep 0.2) 2>/dev/null
wait $r0; rc0=$?; wait $r1; rc1=$?
check "undisturbed: both nodes exit 0 ($rc0, $rc1)" test $rc0 -eq 0 -a $rc1 -eq 0
check "a stranger at the coordinator's port: refused, named" grep -q "refused a connection to the coordinator from 127.0.0.1:[0-9]*: not a fleetrun of this job" ref0.out
check "an older fleetrun's HELLO: refused, named" grep -q "refused a connection to the coordinator from 127.0.0.1:[0-9]*: it sent a job token in the clear" ref0.out
grep "^worker_index: 0, epoch 3, step 64, eval" ref0.out >ref.eval
check "undisturbed: 64 steps" test -s ref.eval

node kill0 127.0.0.1 2 --max_restarts 2 -- "${quick[@]}" -o checkpoint.dir=kill/ck
k0=$!
node kill1 127.0.0.2 2 --max_restarts 2 -- "${quick[@]}" -o checkpoint.dir=kill/ck
k1=$!
# rank 3's pid found while the job starts, so that the kill follows step 22's line at once (a
# lookup after it, on a loaded machine, let the job run past the checkpoints looked for)
p3=""
for _ in $(seq 1 3000); do p3=$(pid_of "$bin" PADDLE_TRAINER_ID=3); [ -n "$p3" ] && break; sleep 0.02; done
if wait_line kill1.log/workerlog.1 "^worker_index: 3, epoch 1, step 22," 60; then
  kill -9 ${p3:-$(pid_of "$bin" PADDLE_TRAINER_ID=3)}
fi
wait $k0; rc0=$?; wait $k1; rc1=$?
unset FLEET_BENCH_SLOW
check "worker killed on node 1: both nodes finish, exit 0 ($rc0, $rc1)" test $rc0 -eq 0 -a $rc1 -eq 0
check "node 0 names node 1's failure" grep -q "node 1 (127.0.0.2): worker 1 (rank 3) killed by signal 9" kill0.out
check "every node restarts once" test "$(grep -c 'restart 1 of 2 after node 1 (127.0.0.2): worker 1 (rank 3) killed by signal 9' kill0.out kill1.out | awk -F: '{s+=$2} END{print s}')" -eq 2
check "resumed from a checkpoint" grep -q "resumed from kill/ck/step_000000[12][0-9]" kill0.out
grep "^worker_index: 0, epoch 3, step 64, eval" kill0.out >kill.eval
check "final evaluation = the undisturbed run's" cmp -s ref.eval kill.eval
check "final parameters and optimizer state bit-identical" bash -c "'$ckpt' diff ref/ck kill/ck >/dev/null"

# 2. scale in 4 -> 3: node 1 (1 worker) lost for good
fashion=(-c "$src/configs/fashion_mlp.yaml" -o train.epochs=3 -o train.log_interval=50
         -o checkpoint.dir=si/ck -o checkpoint.save_interval=100 -o checkpoint.resume=auto)
node si0 127.0.0.1 3 --max_restarts 1 --nnodes 1:2 --node_timeout 3 -- "${fashion[@]}"
s0=$!
node si1 127.0.0.2 1 --max_restarts 1 --nnodes 1:2 --node_timeout 3 -- "${fashion[@]}"
s1=$!
if wait_line si0.out "^worker_index: 0, epoch 1, step 650," 120; then
  kill -9 $(pid_of "$run" FLEET_NODE_NAME=si1) $(pid_of "$bin" PADDLE_TRAINER_ID=3) 2>/dev/null
fi
wait $s0; rc0=$?
{ wait $s1; } 2>/dev/null
check "scale in: node 0 finishes, exit 0 ($rc0)" test $rc0 -eq 0
check "scale in: node 1's loss named" grep -q "node 1 (127.0.0.2) lost: its fleetrun is gone" si0.out
check "scale in: goes on with 3 workers" grep -q "continuing with 1 of 2 nodes (3 workers): node 1 (127.0.0.2) did not rejoin within 3 s (--nnodes 1:2)" si0.out
check "scale in: ranks 0..2 of 3" grep -q "round 1: this node's 3 worker(s) are ranks 0..2 of 3 on 1 node(s)" si0.out
check "scale in: resharded, the learning rate scaled" grep -q "written by 4 worker(s), this job has 3: batch size per worker kept, learning rate x 0.75" si0.out
acc=$(sed -nE 's/^worker_index: 0, epoch 2, step [0-9]+, eval .*val_acc1 ([0-9.]+).*/\1/p' si0.out | tail -1)
echo "scale in: final val_acc1 ${acc:-none}"
check "scale in: val_acc1 >= 0.86 (docs/elastic.md)" awk -v a="${acc:-0}" 'BEGIN{exit !(a >= 0.86)}'

# 3. without --nnodes, a node that does not come back ends the job
node fix0 127.0.0.1 1 --max_restarts 1 --node_timeout 2 -- "${quick[@]}" -o checkpoint.dir=fix/ck
f0=$!
FLEET_BENCH_SLOW=1:25:0 node fix1 127.0.0.2 1 --max_restarts 1 --node_timeout 2 -- "${quick[@]}" -o checkpoint.dir=fix/ck
f1=$!
wait_line fix0.out "^worker_index: 0, epoch 0, step 4," 60 &&
  kill -9 $(pid_of "$run" FLEET_NODE_NAME=fix1) 2>/dev/null
wait $f0; rc0=$?
{ wait $f1; } 2>/dev/null
check "a node lost without --nnodes: exit 1 ($rc0)" test $rc0 -eq 1
check "a node lost without --nnodes: named" grep -q "error: round 1: node 1 (127.0.0.2) did not rejoin within 2 s; the job needs 2 node(s)" fix0.out

# ... and one whose fleetrun is started again joins the next round
node back0 127.0.0.1 1 --max_restarts 1 --node_timeout 20 -- "${quick[@]}" -o checkpoint.dir=back/ck
k0=$!
FLEET_BENCH_SLOW=1:25:0 node back1 127.0.0.2 1 --max_restarts 1 --node_timeout 20 -- "${quick[@]}" -o checkpoint.dir=back/ck
if wait_line back0.out "^worker_index: 0, epoch 0, step 6," 60; then
  kill -9 $(pid_of "$run" FLEET_NODE_NAME=back1) 2>/dev/null
  mv back1.out back1.first.out
  FLEET_BENCH_SLOW=1:25:0 node back1 127.0.0.2 1 --max_restarts 1 --node_timeout 20 -- "${quick[@]}" -o checkpoint.dir=back/ck
  k1=$!
  wait $k1; rc1=$?
else
  rc1=-1
fi
wait $k0; rc0=$?
check "a node started again: both exit 0 ($rc0, $rc1)" test $rc0 -eq 0 -a "$rc1" -eq 0
check "a node started again: round 1 on 2 nodes" grep -q "round 1: this node's 1 worker(s) are ranks 0..0 of 2 on 2 node(s)" back0.out
check "a node started again: it trains in round 1" grep -q "round 1: this node's 1 worker(s) are ranks 1..1 of 2" back1.out

# 4. a bad config: status 2 on every node, not restarted; a node that never starts
node bad0 127.0.0.1 1 --max_restarts 2 -- "${quick[@]}" -o model.hiden=[4]
b0=$!
node bad1 127.0.0.2 1 --max_restarts 2 -- "${quick[@]}" -o model.hiden=[4]
b1=$!
wait $b0; rc0=$?; wait $b1; rc1=$?
check "bad config: exit 2 on both nodes ($rc0, $rc1)" test $rc0 -eq 2 -a $rc1 -eq 2
check "bad config: not restarted, said" grep -q "not restarting: node [01] (127.0.0.[12]): worker 0 (rank [01]) exited with code 2" bad0.out
check "bad config: no round 1" bash -c "! grep -q 'round 1' bad0.out bad1.out"
node alone0 127.0.0.1 1 --nnodes 2 --node_timeout 1 -- "${quick[@]}" -o checkpoint.dir=alone/ck
a0=$!
wait $a0; rc0=$?
check "a node that never starts: exit 1 ($rc0)" test $rc0 -eq 1
check "a node that never starts: named" grep -q "error: round 0: node 1 (127.0.0.2) did not join within 1 s; the job needs 2 node(s)" alone0.out

# 5. node 0's fleetrun killed: node 1 loses the coordinator
FLEET_BENCH_SLOW=1:25:0 node lc0 127.0.0.1 1 --max_restarts 1 -- "${quick[@]}" -o checkpoint.dir=lc/ck
l0=$!
FLEET_BENCH_SLOW=1:25:0 node lc1 127.0.0.2 1 --max_restarts 1 -- "${quick[@]}" -o checkpoint.dir=lc/ck
l1=$!
wait_line lc0.out "^worker_index: 0, epoch 0, step 4," 60 &&
  kill -9 $(pid_of "$run" FLEET_NODE_NAME=lc0) 2>/dev/null
wait $l1; rc1=$?
{ wait $l0; } 2>/dev/null
check "coordinator lost: node 1 exits 1 ($rc1)" test $rc1 -eq 1
check "coordinator lost: said" grep -q "error: lost the job's coordinator at 127.0.0.1:$((base - 1)) (node 0's fleetrun)" lc1.out
check "coordinator lost: no worker of this test left" test -z "$(pid_of "$bin" FLEET_TEST_MARKER=$marker)"

[ $fail -eq 0 ] || tail -n 5 ref0.out ref1.out alone0.out fix0.out lc1.out
[ $fail -eq 0 ] && echo "test_fleetrun_nodes: all checks passed"
exit $fail
