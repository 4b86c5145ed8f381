#!/usr/bin/env bash
# hier_netlab.sh - hierarchical allreduce and hierarchical DGC on netlab (issue 15): 2 emulated
# hosts of 2 workers each (one fleetrun per host, --nproc_per_node 2: the two workers of a host
# talk through unix sockets, the hosts through a shaped link), a model of 16.8M parameters
# (bench/dgc_netlab.yaml's MLP narrowed to mlp(1024, [1024 x 16], relu, 10), 67 MB of f32
# gradients a step), and five configurations:
#   dense       flat ring / recursive doubling over the 4 workers
#   dense-hier  strategy.use_hierarchical_allreduce: node, then cross, then node
#   dgc         DGC at 0.999 from step 0, flat allgather of every worker's pairs
#   dgc-hier    the same with use_hierarchical_allreduce: DGC per node (docs/dgc.md)
#   no-comm     the same 4 processes, 2 per host, each a job of one: no communication
# Per cell: the step time (global batch / ips of rank 0's progress windows after the first
# SKIP, median), the communication time (step - no-comm step), and the bytes that crossed the
# slow link per step: host 0's eth0 tx + rx bytes (both directions of the inter-host traffic:
# every byte between the hosts passes there) of a run of STEPS steps minus those of a run of
# one step, over STEPS - 1 (so that the start's parameter broadcast and the end's evaluation
# are not counted). Each cell is the median
# over ROUNDS rounds; the configurations rotate order from round to round.
#
# Usage: bench/hier_netlab.sh [BUILD_DIR]
#   RATE=1gbit  BATCH=32 (per worker)  STEPS=24  INTERVAL=4  SKIP=1  ROUNDS=3
#   CONFIGS="dense dense-hier dgc dgc-hier no-comm"
#   LOOPBACK=1   jobs on 127.0.0.1, no lab (bytes and timings mean nothing; a dry run)
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
# shellcheck source=dense_lib.sh
source "$here/dense_lib.sh"
rate=${RATE:-1gbit}
batch=${BATCH:-32}
steps=${STEPS:-24}
interval=${INTERVAL:-4}
skip=${SKIP:-1}
rounds=${ROUNDS:-3}
read -r -a cfgs <<<"${CONFIGS:-dense dense-hier dgc dgc-hier no-comm}"
hosts=2 per=2
world=$((hosts * per))
lab_mine=0

args_of() { # CFG [STEPS] -> fleet-train arguments
  local steps=${2:-$steps}
  local a=(-c "$here/dgc_netlab.yaml" -o "model.hidden=[$(printf '1024,%.0s' {1..15})1024]"
           -o data.features=1024 -o train.batch_size="$batch"
           -o data.train_size=$((steps * world * batch)) -o train.log_interval="$interval"
           -o checkpoint.save_interval=0)
  case $1 in
    dense) ;;
    dense-hier) a+=(-o strategy.use_hierarchical_allreduce=true) ;;
    dgc) a+=(-o strategy.dgc=true -o "strategy.dgc_configs.sparsity=[0.999]") ;;
    dgc-hier) a+=(-o strategy.dgc=true -o "strategy.dgc_configs.sparsity=[0.999]"
                  -o strategy.use_hierarchical_allreduce=true) ;;
    no-comm) a+=(-o data.train_size=$((steps * batch))) ;;
  esac
  printf '%s\n' "${a[@]}"
}

link_bytes() { # host 0's eth0 bytes, both directions
  if ((loopback)); then echo 0; return; fi
  on_host 0 cat /sys/class/net/eth0/statistics/tx_bytes /sys/class/net/eth0/statistics/rx_bytes |
    awk '{ s += $1 } END { printf "%.0f\n", s }'
}

# run_cfg ROUND CFG: one run, its step time (ms) and link bytes per step into $raw
run_cfg() {
  local round=$1 cfg=$2 out=$work/$1.$2 a b0 b1 ms one
  if [[ $cfg == no-comm ]]; then one=0; else
    run_job "$cfg" 1 "$out.one"
    one=$job_bytes
  fi
  run_job "$cfg" "$steps" "$out"
  ms=$job_ms
  local per=$(((job_bytes - one) / (steps - 1)))
  echo "$round $cfg $ms $per" >>"$raw"
  echo "round $round $cfg: step $ms ms, slow link $per bytes/step" >&2
}

# run_job CFG STEPS OUT: one job; sets job_ms (its step time) and job_bytes (link bytes)
job_bytes=0 job_ms=nan
run_job() {
  local cfg=$1 steps=$2 out=$3 port=$((20000 + RANDOM % 20000)) a b0 b1 ms
  mapfile -t a < <(args_of "$cfg" "$steps")
  b0=$(link_bytes)
  if [[ $cfg == no-comm ]]; then
    local i j pids=()
    for ((i = 0; i < hosts; i++)); do
      for ((j = 0; j < per; j++)); do
        on_host "$i" timeout 900 "$fleet_train" "${a[@]}" >"$out.$i.$j" 2>&1 &
        pids+=($!)
      done
    done
    for i in "${pids[@]}"; do wait "$i"; done
    ms=$(window_ms "$skip" "$batch" "$out".*.* | median)
  else
    local token ips i pids=()
    token=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    if ((loopback)); then
      FLEET_JOB_TOKEN=$token timeout 900 "$fleetrun" --nproc_per_node "$world" \
        --log_dir "$out.log" "$fleet_train" "${a[@]}" >"$out" 2>&1
    else
      ips=$(lab_ips "$hosts")
      for ((i = 0; i < hosts; i++)); do
        FLEET_JOB_TOKEN=$token timeout 900 "$netlab" exec "$i" "$fleetrun" --ips "$ips" \
          --nproc_per_node "$per" --started_port "$port" --log_dir "$out.log/h$i" \
          "$fleet_train" "${a[@]}" >"$([[ $i == 0 ]] && echo "$out" || echo "$out.h$i")" 2>&1 &
        pids+=($!)
      done
      for i in "${pids[@]}"; do wait "$i"; done
    fi
    ms=$(window_ms "$skip" $((world * batch)) "$out" | median)
  fi
  b1=$(link_bytes)
  job_bytes=$((b1 - b0))
  job_ms=$ms
}

cell() { awk -v c="$1" -v f="$2" '$2 == c { print $f }' "$raw" | median; }

bench_start
lab_wait_free
lab_up "$hosts" "$rate"
for ((r = 0; r < rounds; r++)); do
  n=${#cfgs[@]}
  for ((k = 0; k < n; k++)); do run_cfg "$r" "${cfgs[$(((k + r) % n))]}"; done
done
lab_down

nocomm=$(cell no-comm 3)
echo
echo "hier_netlab: $hosts hosts x $per workers, links $rate, mlp 16.8M params, batch $batch per worker, $steps steps, medians of $rounds rounds"
printf '%-11s %10s %10s %14s\n' config "step ms" "comm ms" "slow-link MB/step"
for c in "${cfgs[@]}"; do
  ms=$(cell "$c" 3)
  by=$(cell "$c" 4)
  comm=$(awk -v s="$ms" -v z="$nocomm" 'BEGIN { printf "%.1f", s - z }')
  [[ $c == no-comm ]] && comm=-
  printf '%-11s %10s %10s %14.2f\n' "$c" "$ms" "$comm" "$(awk -v b="$by" 'BEGIN { print b / 1e6 }')"
done
for p in "dense dense-hier" "dgc dgc-hier"; do
  read -r f h <<<"$p"
  awk -v fb="$(cell "$f" 4)" -v hb="$(cell "$h" 4)" -v fs="$(cell "$f" 3)" -v hs="$(cell "$h" 3)" \
      -v z="$nocomm" -v f="$f" -v h="$h" 'BEGIN {
    printf "%s / %s: slow-link bytes x %.2f, communication time x %.2f\n", h, f,
      (fb > 0 ? hb / fb : 0), ((fs - z) > 0 ? (hs - z) / (fs - z) : 0) }'
done
