#!/usr/bin/env bash
# ddp_throughput.sh - training throughput (samples/s, all workers together) of fleet's dense
# strategy (fleet-train, overlap on) beside PyTorch 1.13's DistributedDataParallel (gloo) with 1,
# 2 and 4 workers, one per emulated host of netlab (one compute thread each), the same MLP
# (bench/dense_mlp.yaml; bench/ddp_mlp.py builds it in torch), local batch, SGD with momentum
# and bucket size (fuse_grad_size_in_MB = bucket_cap_mb). One worker runs as a plain local
# process (nothing to communicate); torch's one worker runs both under DDP (world 1) and bare.
# Throughput = the median over the progress windows after the first SKIP of a run (fleet-train's
# ips, ddp_mlp.py's the same way); each cell is the median of ROUNDS rounds, the two systems
# alternating (order swapped every round). ratio = fleet / torch DDP (> 1: fleet faster).
# The lab is always taken down on exit.
#
# Usage: bench/ddp_throughput.sh [BUILD_DIR]
#   WORKERS="1 2 4"  RATE=1gbit  BATCH=256 (per worker)  FUSE=4 (MiB, both systems)
#   STEPS=45  INTERVAL=5  SKIP=1  ROUNDS=5  CONFIG=bench/dense_mlp.yaml
#   RAW=FILE    also write every run's throughput there
#   LOOPBACK=1  dry run: local processes on 127.0.0.1, no lab (timings mean nothing)
#   GUARD_MAX_OTHER=10 GUARD_RETRIES=3  (bench/cpu_guard.sh); LAB_WAIT_S, LAB_QUIET_S
#   (bench/dense_lib.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
workers_list=${WORKERS:-1 2 4}
rate=${RATE:-1gbit}
batch=${BATCH:-256} fuse=${FUSE:-4}
steps=${STEPS:-45} interval=${INTERVAL:-5} skip=${SKIP:-1} rounds=${ROUNDS:-5}
config=${CONFIG:-$here/dense_mlp.yaml}
max_other=${GUARD_MAX_OTHER:-10} retries=${GUARD_RETRIES:-3}
ddp_py=$here/ddp_mlp.py
# shellcheck source=dense_lib.sh
source "$here/dense_lib.sh"
bench_start
/usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "ddp_throughput.sh: PyTorch not importable by /usr/bin/python3 (scripts/install-deps.sh --bench)" >&2; exit 1; }
maxhosts=0
for w in $workers_list; do ((w > maxhosts)) && maxhosts=$w; done

# the model of the config, for torch
hidden=$("$fleet_train" -c "$config" --print-config | sed -n 's/^model.hidden: \[\(.*\)\]/\1/p' | tr -d ' ')
feat=$("$fleet_train" -c "$config" --print-config | sed -n 's/^data.features: //p')
classes=$("$fleet_train" -c "$config" --print-config | sed -n 's/^data.classes: //p')
torch_args=(--in "$feat" --hidden "$hidden" --classes "$classes" --batch "$batch" --steps "$steps"
  --interval "$interval" --skip "$skip" --bucket-cap-mb "$fuse")

if ((maxhosts > 1)); then
  lab_wait_free
  lab_up "$maxhosts" "$rate"
fi

echo "# ddp_throughput: $(basename "$config") (mlp($feat,[$hidden],relu,$classes)), batch $batch/worker," \
  "fuse = bucket_cap_mb = $fuse MiB, $steps steps (windows of $interval, first $skip skipped)," \
  "links $rate, ROUNDS=$rounds, $([[ $loopback == 1 ]] && echo "LOOPBACK (dry run)" || echo netlab)," \
  "$(date -u +%Y-%m-%dT%H:%MZ)"

# fleet N ROUND PORT -> global samples/s
run_fleet() {
  local n=$1 r=$2 port=$3 out=$work/fleet.$1.$2 args
  args=(-c "$config" -o "train.batch_size=$batch" -o "train.max_steps=$steps"
    -o "train.log_interval=$interval" -o "strategy.fuse_grad_size_in_MB=$fuse"
    -o "data.train_size=$((steps * n * batch))")
  if ((n == 1)); then
    timeout 900 "$fleet_train" "${args[@]}" >"$out" 2>&1 || {
      echo "ddp_throughput.sh: fleet-train failed:" >&2; tail "$out" >&2; return 1; }
  else
    fleet_dist "$n" "$port" "$out" "${args[@]}" >&2
  fi
  awk -v skip="$skip" '/^worker_index: 0, .* ips / {
      for (i = 1; i <= NF; i++) if ($i == "ips") v = $(i + 1)
      if (++w > skip) print v }' "$out" | median
}

# torch N ROUND PORT [--no-ddp] -> global samples/s
run_torch() {
  local n=$1 r=$2 port=$3 out=$work/torch.$1.$2${4:+.bare} i pids=() rc=0 addr iface
  shift 3
  if ((n == 1)); then
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 WORLD_SIZE=1 GLOO_SOCKET_IFNAME=lo \
      timeout 900 /usr/bin/python3 "$ddp_py" "${torch_args[@]}" "$@" >"$out.0" 2>&1 || rc=$?
  else
    if ((loopback)); then addr=127.0.0.1 iface=lo; else addr=$("$netlab" addr 0) iface=eth0; fi
    for ((i = 0; i < n; i++)); do
      MASTER_ADDR=$addr MASTER_PORT=$port RANK=$i WORLD_SIZE=$n GLOO_SOCKET_IFNAME=$iface \
        on_host "$i" timeout 900 /usr/bin/python3 "$ddp_py" "${torch_args[@]}" >"$out.$i" 2>&1 &
      pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  fi
  if ((rc != 0)); then
    echo "ddp_throughput.sh: torch job of $n failed (exit $rc):" >&2
    tail -5 "$out".* >&2
    return 1
  fi
  sed -n 's/^median_ips //p' "$out.0"
}

port=6500
for ((r = 0; r < rounds; r++)); do
  for w in $workers_list; do
    systems=(fleet torch)
    ((w == 1)) && systems+=(torch-bare)
    ((r % 2)) && systems=("${systems[@]:1}" "${systems[0]}")
    for s in "${systems[@]}"; do
      for ((try = 0; ; try++)); do
        guard_wait_idle
        guard_begin
        case $s in
        fleet) run_fleet "$w" "$r" "$port" >"$work/v" & ;;
        torch) run_torch "$w" "$r" "$port" >"$work/v" & ;;
        torch-bare) run_torch "$w" "$r" "$port" --no-ddp >"$work/v" & ;;
        esac
        wait $!
        v=$(cat "$work/v")
        guard_end
        port=$((port + 10))
        ((GUARD_OTHER_PCT <= max_other || try >= retries)) && break
        echo "# round $((r + 1)) $w workers $s: other processes took ${GUARD_OTHER_PCT}% of the CPU; again" >&2
      done
      echo "$w $r $s $v $GUARD_OTHER_PCT" >>"$raw"
      echo "# round $((r + 1)) $w workers $s: $v samples/s (other CPU ${GUARD_OTHER_PCT}%)" >&2
    done
  done
done

cell() { awk -v w="$1" -v s="$2" '$1 == w && $3 == s { print $4 }' "$raw" | median; }
f1=$(cell "$(echo "$workers_list" | awk '{ print $1 }')" fleet)
t1=$(cell "$(echo "$workers_list" | awk '{ print $1 }')" torch)
echo
echo "# samples/s (global), median of $rounds rounds; ratio = fleet / torch DDP; scaling = samples/s" \
  "/ the first row's; per-round = median of each round's own ratio"
printf '%7s %12s %12s %7s %9s %9s %9s\n' workers fleet "torch DDP" ratio per-round "fleet x" "torch x"
for w in $workers_list; do
  f=$(cell "$w" fleet) t=$(cell "$w" torch)
  pr=$(awk -v w="$w" '$1 == w { v[$2, $3] = $4; r[$2] = 1 }
    END { for (k in r) if (v[k, "torch"] > 0) print v[k, "fleet"] / v[k, "torch"] }' "$raw" | median)
  awk -v w="$w" -v f="$f" -v t="$t" -v pr="$pr" -v f1="$f1" -v t1="$t1" 'BEGIN {
    printf "%7d %12.1f %12.1f %7.2f %9.2f %9.2f %9.2f\n", w, f, t, f / t, pr, f / f1, t / t1 }'
done
if awk '$3 == "torch-bare"' "$raw" | grep -q .; then
  echo "# torch without DDP, 1 worker: $(cell 1 torch-bare) samples/s"
fi
echo "# runs over ${max_other}% other CPU after $retries retries: $(awk -v mx="$max_other" '$5 > mx' "$raw" | wc -l)"
if [[ -n ${RAW:-} ]]; then
  { echo "# workers round system samples_per_s other_cpu_pct"; cat "$raw"; } >"$RAW"
fi
