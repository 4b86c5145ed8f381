#!/usr/bin/env bash
# restart.sh - what a failure costs a job under fleetrun --max_restarts with fleet-train's
# checkpoint.resume: auto: a 4-worker job (MODEL: the quick-start MLP, or the CIFAR ResNet-20 on
# the synthetic shapes task) loses a SIGKILLed worker at a random step, TRIALS times; per trial
#   redone = steps trained again (the kill's step minus the checkpoint resumed from: at most
#            the save interval),
#   restart = seconds from the kill to rank 0 of the restarted job saying which checkpoint it
#            resumed from: stopping the others, starting the processes, their set-up (data,
#            model, rendezvous) and loading the checkpoint; training goes on right after.
# Steps are slowed to SLOW_MS (FLEET_BENCH_SLOW on rank 0; numbers unchanged) so that kills
# land mid-training; the undisturbed step time is measured in the same run.
# NODES=2: the 4 workers are two nodes of two on loopback (fleetrun on 127.0.0.1 and on
# 127.0.0.2, node 0's coordinating the rounds: docs/elastic.md) and the killed worker is one of
# node 1's (rank 2 or 3): the restart then crosses nodes. NODES=2 LOSE=node kills node 1's
# fleetrun instead, with --nnodes 1:2 --node_timeout NODE_TIMEOUT: node 0's 2 workers go on
# alone (scale in), and the restart includes the wait for the lost node.
# Usage: bench/restart.sh [BUILD_DIR]   TRIALS=5 MODEL=mlp|resnet INTERVAL=8 SLOW_MS=25
#                                       NODES=1|2 LOSE=worker|node NODE_TIMEOUT=2
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
trials=${TRIALS:-5} model=${MODEL:-mlp} interval=${INTERVAL:-8} slow=${SLOW_MS:-25}
nodes=${NODES:-1} lose=${LOSE:-worker} node_timeout=${NODE_TIMEOUT:-2}
bin="$build/tools/fleet-train" run="$build/tools/fleetrun"
[[ -x $bin && -x $run ]] || { echo "restart.sh: build first (make build)" >&2; exit 1; }
work=$(mktemp -d)
trap 'pkill -9 -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
export FLEET_BENCH_SLOW=1:$slow:0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} # 4 workers share the cores: one thread each
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD FLEET_RESTART_COUNT
export FLEET_JOB_TOKEN=bench$$ FLEET_COMM_TIMEOUT=30
port=$((35000 + RANDOM % 20000))
# job DIR [FLEETRUN OPTIONS...]: the 4-worker job in the background, node 0's fleetrun's pid in
# $fr (and node 1's in $fr1 with NODES=2); rank r's log is $(rank_log DIR r)
job() {
  local d=$1; shift
  if [[ $nodes == 2 ]]; then
    local two=(--ips 127.0.0.1,127.0.0.2 --started_port "$port" --nproc_per_node 2)
    "$run" "${two[@]}" --node_ip 127.0.0.2 "$@" --log_dir "$d/log1" "$bin" "${args[@]}" \
      -o checkpoint.dir="$d/ck" >"$d.out1" 2>&1 &
    fr1=$!
    "$run" "${two[@]}" --node_ip 127.0.0.1 "$@" --log_dir "$d/log" "$bin" "${args[@]}" \
      -o checkpoint.dir="$d/ck" >"$d.out" 2>&1 &
  else
    "$run" --nproc_per_node 4 "$@" --log_dir "$d/log" "$bin" "${args[@]}" \
      -o checkpoint.dir="$d/ck" >"$d.out" 2>&1 &
  fi
  fr=$!
}
rank_log() { if [[ $nodes == 2 && $2 -ge 2 ]]; then echo "$1/log1/workerlog.$(($2 - 2))"; else echo "$1/log/workerlog.$2"; fi; }
if [[ $model == resnet ]]; then
  args=(-c "$here/../configs/shapes_resnet.yaml" -o train.max_steps=96 -o data.train_size=8192)
else
  args=(-c "$here/../configs/quickstart.yaml" -o train.epochs=6)
fi
args+=(-o train.log_interval=1 -o checkpoint.save_interval="$interval" -o checkpoint.resume=auto)
now() { date +%s.%N; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# undisturbed: the median step time of rank 0's progress lines
args0=("${args[@]}")
args+=(-o train.log_dir="$work/ref/m")
job "$work/ref" --max_restarts 1
wait "$fr"
[[ $nodes == 2 ]] && wait "$fr1"
args=("${args0[@]}")
step_s=$(sed -nE 's/.*"step_ms":([0-9.]+).*/\1/p' "$work/ref/m/metrics.jsonl" | median |
  awk '{ printf "%.4f", $1 / 1000 }')
printf '# %s, %s cores, model %s, 4 workers on %d node(s), losing a %s, checkpoint every %d steps, %s ms/step undisturbed\n' \
  "$(date -u +%FT%TZ)" "$(nproc --all)" "$model" "$nodes" "$lose" "$interval" "$(awk -v s="$step_s" 'BEGIN { printf "%.1f", 1000 * s }')"
printf '%5s %5s %9s %8s %10s\n' trial rank "kill step" redone "restart s"
RANDOM=${SEED:-7}
redo=() rst=()
for t in $(seq 1 "$trials"); do
  d="$work/t$t" rank=$((1 + RANDOM % 3)) kstep=$((interval + 1 + RANDOM % (4 * interval)))
  [[ $nodes == 2 ]] && rank=$((2 + RANDOM % 2))
  if [[ $lose == node ]]; then
    job "$d" --max_restarts 1 --nnodes 1:2 --node_timeout "$node_timeout"
  else
    job "$d" --max_restarts 1
  fi
  killed=""
  for _ in $(seq 1 6000); do
    if grep -q "^worker_index: $rank, epoch [0-9]*, step $kstep," "$(rank_log "$d" "$rank")" 2>/dev/null; then
      if [[ $lose == node ]]; then
        kill -9 "$fr1" && killed=$(now) # its workers die with it (PR_SET_PDEATHSIG)
      else
        for p in $(pgrep -f "$d/ck"); do
          { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "PADDLE_TRAINER_ID=$rank" &&
            kill -9 "$p" && killed=$(now)
        done
      fi
      break
    fi
    sleep 0.005
  done
  [[ -n $killed ]] || { wait "$fr" || true; echo "trial $t: missed"; continue; }
  # the restarted round's rank 0 says where it resumed from
  first=""
  for _ in $(seq 1 12000); do
    if grep -q "resumed from" "$d.out" 2>/dev/null; then
      first=$(now)
      break
    fi
    sleep 0.005
  done
  wait "$fr" || true
  [[ $nodes == 2 ]] && { { wait "$fr1"; } 2>/dev/null || true; }
  from=$(sed -nE 's/.*resumed from [^:]*: step ([0-9]+),.*/\1/p' "$d.out" | head -1)
  [[ -n $first && -n $from ]] || { echo "trial $t: no restart seen"; continue; }
  r=$(awk -v a="$killed" -v b="$first" 'BEGIN { printf "%.2f", b - a }')
  printf '%5d %5d %9d %8d %10s\n' "$t" "$rank" "$kstep" $((kstep - from)) "$r"
  redo+=($((kstep - from))) rst+=("$r")
done
printf 'median: redone %s steps (at most %d), restart %s s\n' \
  "$(printf '%s\n' "${redo[@]}" | median)" "$interval" "$(printf '%s\n' "${rst[@]}" | median)"
