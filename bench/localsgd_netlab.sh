#!/usr/bin/env bash
# localsgd_netlab.sh - seed 001's Local SGD table remade (issue 6): throughput and final
# accuracy of Local SGD with k_steps 1, 2, 4, 8, 16 and of adaptive communication, HOSTS
# fleet-train workers on netlab (one per emulated host, one compute thread each, links of RATE),
# beside the same workers with communication off; then a straggler run: the same jobs with one
# rank at a time randomly slowed, dense (k = 1) beside Local SGD.
#   k1 .. k16  strategy.localsgd with localsgd_configs.k_steps = k (k1 is dense synchronous SGD:
#              the same bytes as the dense strategy, tests/cli/test_localsgd.sh)
#   adaptive   strategy.adaptive_localsgd, init_k_steps ADA_INIT_K
#   no-comm    the same HOSTS processes at the same time on the same hosts, each a job of one
#              (same local batch, compute and CPU sharing, nothing sent): throughput only
# Every configuration trains the whole budget of CONFIG (bench/localsgd_mlp.yaml: the teacher
# MLP, 40 epochs, 2560 steps: about 2.5 minutes at k = 1 on 1 Gbit/s links, 15 a round); samples/s = global batch / median step time of rank 0's progress windows
# after the first SKIP, median over ROUNDS rounds (configurations in an order that rotates from
# round to round); accuracy = the final val_acc1 (each rank evaluates its own replica on its
# shard of the validation set: the run's last step averages only when the step count fits the
# interval), median over rounds. The straggler runs take STRAG_STEPS steps each.
#
# Usage: bench/localsgd_netlab.sh [BUILD_DIR]
#   HOSTS=4  RATE=1gbit  BATCH=512 (per worker)  ROUNDS=3  SKIP=1
#   CONFIG=bench/localsgd_mlp.yaml  EPOCHS= (default: the config's)  EXTRA="-o key=value ..."
#   KS="1 2 4 8 16"  ADA_INIT_K=1  BEGIN_STEP=1 (localsgd/adaptive begin_step for every run)
#   STRAGGLER=0.2:40  the straggler: each step, with probability 0.2, one rank drawn at random
#                 sleeps 40 ms before its forward pass (fleet-train's FLEET_BENCH_SLOW=PROB:MS
#                 [:RANK], src/train/straggler.h; add :RANK to slow always the same rank);
#                 STRAGGLER= (empty) skips the straggler runs
#   STRAG_STEPS=256  STRAG_CFGS="k1 k4 k16 adaptive"
#   ONLY=accuracy   skip the no-comm and straggler runs (e.g. with LOOPBACK=1 to choose a budget)
#   RAW=FILE      also write every run's numbers there
#   LOOPBACK=1    dry run: local processes on 127.0.0.1, no lab (timings mean nothing; the
#                 accuracies are real)
#   GUARD_MAX_OTHER=10 GUARD_RETRIES=3  a run during which other processes used more than
#                 GUARD_MAX_OTHER % of the cores runs again (bench/cpu_guard.sh)
#   LAB_WAIT_S, LAB_QUIET_S: see bench/dense_lib.sh (waiting for another lab to finish)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case ${1:-} in
-h | --help)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
  ;;
esac
build=$(cd "${1:-$here/../build}" && pwd)
hosts=${HOSTS:-4}
rate=${RATE:-1gbit}
batch=${BATCH:-512}
rounds=${ROUNDS:-3} skip=${SKIP:-1}
config=${CONFIG:-$here/localsgd_mlp.yaml}
ks=${KS:-1 2 4 8 16}
ada_init_k=${ADA_INIT_K:-1} begin_step=${BEGIN_STEP:-1}
straggler=${STRAGGLER-0.2:40}
strag_steps=${STRAG_STEPS:-256}
strag_cfgs=${STRAG_CFGS:-k1 k4 k16 adaptive}
only=${ONLY:-}
read -r -a extra <<<"${EXTRA:-}"
[[ -n ${EPOCHS:-} ]] && extra+=(-o "train.epochs=$EPOCHS")
max_other=${GUARD_MAX_OTHER:-10} retries=${GUARD_RETRIES:-3}
if [[ -n $straggler && ! $straggler =~ ^[0-9.]+:[0-9.]+(:[0-9]+)?$ ]]; then
  echo "localsgd_netlab.sh: STRAGGLER=$straggler: expected PROB:MS[:RANK], e.g. 0.2:40" >&2
  exit 2
fi
[[ -z $only || $only == accuracy ]] || { echo "localsgd_netlab.sh: ONLY=$only: only 'accuracy'" >&2; exit 2; }
# shellcheck source=dense_lib.sh
source "$here/dense_lib.sh"
bench_start

cfgs=()
for k in $ks; do cfgs+=("k$k"); done
cfgs+=(adaptive)
[[ -z $only ]] && cfgs+=(no-comm)

lab_wait_free
lab_up "$hosts" "$rate"

echo "# localsgd_netlab: $(basename "$config") batch $batch/worker x $hosts workers, links $rate," \
  "ROUNDS=$rounds, begin_step $begin_step, adaptive init_k $ada_init_k," \
  "$([[ $loopback == 1 ]] && echo "LOOPBACK (dry run: timings mean nothing)" || echo netlab)," \
  "$(date -u +%Y-%m-%dT%H:%MZ)"

strategy_of() { # CFG -> fleet-train overrides
  case $1 in
  k*) echo "-o strategy.localsgd=true -o strategy.localsgd_configs.k_steps=${1#k}" \
    "-o strategy.localsgd_configs.begin_step=$begin_step" ;;
  adaptive) echo "-o strategy.adaptive_localsgd=true" \
    "-o strategy.adaptive_localsgd_configs.init_k_steps=$ada_init_k" \
    "-o strategy.adaptive_localsgd_configs.begin_step=$begin_step" ;;
  esac
}

# last_acc FILE: the val_acc1 of the last eval line
last_acc() { sed -n 's/.*eval .*val_acc1 \([0-9.]*\).*/\1/p' "$1" | tail -1; }
# comm_mb FILE: median MB sent per step by rank 0 ("comm X MB" per window of INTERVAL steps)
comm_mb() {
  local iv
  iv=$(sed -n 's/^ *log_interval: *\([0-9]*\).*/\1/p' "$config" | head -1)
  awk -v iv="${iv:-32}" '/^worker_index: 0, .* ips / {
      for (i = 1; i <= NF; i++) if ($i == "comm") print $(i + 1) / iv }' "$1" | median
}

# run_cfg CFG ROUND PORT SLOW STEPS -> "samples/s acc1 MB/step" on stdout
run_cfg() {
  local cfg=$1 r=$2 port=$3 slow=$4 steps=$5 out=$work/$1.$2.${4:-fast} common ms
  common=(-c "$config" -o "train.batch_size=$batch" "${extra[@]}")
  ((steps > 0)) && common+=(-o "train.max_steps=$steps")
  if [[ $cfg == no-comm ]]; then
    FLEET_BENCH_SLOW=$slow fleet_solo "$hosts" "$out" "${common[@]}" >&2
    ms=$(window_ms "$skip" "$batch" "$out".* | median)
    awk -v ms="$ms" -v gb=$((hosts * batch)) 'BEGIN { printf "%.1f - 0\n", 1000 * gb / ms }'
    return
  fi
  # shellcheck disable=SC2046
  FLEET_BENCH_SLOW=$slow fleet_dist "$hosts" "$port" "$out" "${common[@]}" $(strategy_of "$cfg") >&2
  ms=$(window_ms "$skip" $((hosts * batch)) "$out" | median)
  awk -v ms="$ms" -v gb=$((hosts * batch)) -v acc="$(last_acc "$out")" -v mb="$(comm_mb "$out")" \
    'BEGIN { printf "%.1f %s %s\n", 1000 * gb / ms, acc == "" ? "-" : acc, mb }'
}

# measure PHASE CFG ROUND PORT SLOW STEPS: one guarded run, appended to $raw
measure() {
  local phase=$1 cfg=$2 r=$3 port=$4 slow=$5 steps=$6 try res
  for ((try = 0; ; try++)); do
    guard_wait_idle
    guard_begin
    run_cfg "$cfg" "$r" "$port" "$slow" "$steps" >"$work/res" &
    wait $!
    res=$(cat "$work/res")
    guard_end
    ((GUARD_OTHER_PCT <= max_other || try >= retries)) && break
    echo "# $phase round $((r + 1)) $cfg: other processes took ${GUARD_OTHER_PCT}% of the CPU; again" >&2
  done
  echo "$phase $cfg $r $res $GUARD_OTHER_PCT" >>"$raw"
  echo "# $phase round $((r + 1)) $cfg: samples/s acc1 MB/step = $res (other CPU ${GUARD_OTHER_PCT}%)" >&2
}

port=6400
ncfg=${#cfgs[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < ncfg; i++)); do
    measure main "${cfgs[$(((r + i) % ncfg))]}" "$r" "$port" "" 0
    port=$((port + 10))
  done
done
if [[ -n $straggler && -z $only ]]; then
  read -r -a scfgs <<<"$strag_cfgs"
  for ((r = 0; r < rounds; r++)); do
    for ((i = 0; i < ${#scfgs[@]}; i++)); do
      c=${scfgs[$(((r + i) % ${#scfgs[@]}))]}
      measure fast "$c" "$r" "$port" "" "$strag_steps"
      port=$((port + 10))
      measure slow "$c" "$r" "$port" "$straggler" "$strag_steps"
      port=$((port + 10))
    done
  done
fi

col() { awk -v p="$1" -v c="$2" -v f="$3" '$1 == p && $2 == c && $f != "-" { print $f }' "$raw" | median; }
echo
echo "# samples/s: global batch / median step time, median of $rounds rounds; acc1: final val_acc1"
echo "# (median); vs no-comm: samples/s over no-comm's; MB/step: sent per step by rank 0"
printf '%-9s %11s %9s %8s %9s %9s\n' config samples/s vs_nocomm acc1 "acc-k1" MB/step
nc=$(col main no-comm 4)
acc1=$(col main k1 5)
for c in "${cfgs[@]}"; do
  awk -v c="$c" -v s="$(col main "$c" 4)" -v nc="$nc" -v a="$(col main "$c" 5)" -v a1="$acc1" \
    -v mb="$(col main "$c" 6)" 'BEGIN {
      vs = (nc + 0 > 0 && c != "no-comm") ? sprintf("%.3f", s / nc) : "-"
      d = (a != "nan" && a1 != "nan" && c != "no-comm") ? sprintf("%+.2f", 100 * (a - a1)) : "-"
      printf "%-9s %11.1f %9s %8s %9s %9s\n", c, s, vs, c == "no-comm" ? "-" : a, d, c == "no-comm" ? "0" : mb }'
done
echo "# goals (issue 6): adaptive within 0.3 points of k1, k16 within 1 point; k16 within 10% of no-comm"
if [[ -n $straggler && -z $only ]]; then
  echo
  echo "# straggler: FLEET_BENCH_SLOW=$straggler ($strag_steps steps; samples/s, median of $rounds rounds)"
  printf '%-9s %11s %11s %9s\n' config fast straggler slowdown
  for c in "${scfgs[@]}"; do
    awk -v c="$c" -v f="$(col fast "$c" 4)" -v s="$(col slow "$c" 4)" \
      'BEGIN { printf "%-9s %11.1f %11.1f %9.3f\n", c, f, s, (s > 0 ? f / s : 0) }'
  done
fi
line="# runs over ${max_other}% other CPU after $retries retries:"
line+=" $(awk -v mx="$max_other" '$NF > mx' "$raw" | wc -l)"
echo "$line"
if [[ -n ${RAW:-} ]]; then
  { echo "# phase config round samples_per_s acc1 mb_per_step other_cpu_pct"; cat "$raw"; } >"$RAW"
fi
