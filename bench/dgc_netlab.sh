#!/usr/bin/env bash
# dgc_netlab.sh - seed 000's table remade on netlab (issue 5): the step time of dense Momentum
# beside Deep Gradient Compression's (sparsity 0.999 from step 0, seed 000's fine-tuning
# setting) and beside the step with communication off, for a model of about 25M parameters
# (bench/dgc_netlab.yaml, the size of ResNet-50) on 2 (and 4) emulated hosts, one fleet-train
# worker with one compute thread per host, links of 10gbit, 1gbit and 100mbit. Goal: DGC's step
# within 10% of no-comm at every rate, selection and state updates included (seed 000: DGC flat
# at 0.375 s from 100G to 1G while dense grows 6.5x).
#   dense    strategy.dgc=false: fused allreduce buckets overlapping backward
#   dgc      strategy.dgc=true (each tensor sent from the gradient-ready hook during backward)
#   dgc-after  strategy.dgc=true, strategy.overlap=false: the same work after backward (an A/B of
#            the overlap; not in the default set)
#   no-comm  the same N processes at the same time on the same hosts, each a job of one (fleet
#            has no "communication off" switch; a job of one sends nothing): same local batch,
#            compute and CPU sharing, no communication
# A step time is global batch / ips of fleet-train's progress lines (every INTERVAL steps),
# median over the windows after the first SKIP of a run; each cell is the median over ROUNDS
# rounds; in every round the three configurations run one after the other in an order that
# rotates from round to round. The lab is brought up once per rate and always taken down on exit.
#
# Usage: bench/dgc_netlab.sh [BUILD_DIR]
#   HOSTS="2 4"  RATES="10gbit 1gbit 100mbit"  BATCH=128 (per worker)
#   STEPS=16  INTERVAL=4  SKIP=1  ROUNDS=3
#   CONFIG=bench/dgc_netlab.yaml  EXTRA="-o key=value ..." (more fleet-train overrides)
#   CONFIGS="dense dgc no-comm"  the configurations to run (any of dense dgc dgc-after no-comm)
#   RAW=FILE      also write every run's step time there
#   DRY=1         print the plan (runs and their fleet-train arguments) and exit: no lab, no jobs
#   LOOPBACK=1    dry run with jobs: local processes on 127.0.0.1, no lab (timings mean nothing)
#   GUARD_MAX_OTHER=10 GUARD_RETRIES=3  a run during which other processes used more than
#                 GUARD_MAX_OTHER % of the cores runs again (bench/cpu_guard.sh)
#   LAB_WAIT_S, LAB_QUIET_S: see bench/dense_lib.sh (waiting for another lab to finish)
# Time: at 100mbit a dense step of this model moves ~100 MB per rank (about 9 s), so the dense
# runs dominate: with the defaults expect about 45 minutes for both host counts.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
hosts_list=${HOSTS:-2 4}
rates=${RATES:-10gbit 1gbit 100mbit}
batch=${BATCH:-128}
steps=${STEPS:-16} interval=${INTERVAL:-4} skip=${SKIP:-1} rounds=${ROUNDS:-3}
config=${CONFIG:-$here/dgc_netlab.yaml}
read -r -a extra <<<"${EXTRA:-}"
max_other=${GUARD_MAX_OTHER:-10} retries=${GUARD_RETRIES:-3}
dry=${DRY:-0}
read -r -a cfgs <<<"${CONFIGS:-dense dgc no-comm}"
for c in "${cfgs[@]}"; do
  case $c in
  dense | dgc | dgc-after | no-comm) ;;
  *) echo "dgc_netlab: unknown configuration '$c' in CONFIGS" >&2; exit 2 ;;
  esac
done
ncfg=${#cfgs[@]}

# args_of CFG N -> fleet-train arguments of one run, one per line
args_of() {
  local cfg=$1 n=$2
  printf '%s\n' -c "$config" -o "train.batch_size=$batch" -o "train.max_steps=$steps" \
    -o "train.log_interval=$interval" "${extra[@]}"
  case $cfg in
  dense) printf '%s\n' -o "data.train_size=$((steps * n * batch))" -o strategy.dgc=false ;;
  dgc) printf '%s\n' -o "data.train_size=$((steps * n * batch))" -o strategy.dgc=true ;;
  dgc-after) printf '%s\n' -o "data.train_size=$((steps * n * batch))" -o strategy.dgc=true \
    -o strategy.overlap=false ;;
  no-comm) printf '%s\n' -o "data.train_size=$((steps * batch))" -o strategy.dgc=false ;;
  esac
}

if [[ $dry == 1 ]]; then
  echo "# dgc_netlab plan: hosts [$hosts_list], rates [$rates], $rounds rounds, $(basename "$config")," \
    "batch $batch/worker, $steps steps (windows of $interval, first $skip skipped)"
  for rate in $rates; do
    for h in $hosts_list; do
      for c in "${cfgs[@]}"; do
        mapfile -t a < <(args_of "$c" "$h")
        printf '%-8s %2s hosts %-8s fleet-train %s\n' "$rate" "$h" "$c" "${a[*]}"
      done
    done
  done
  exit 0
fi

# shellcheck source=dense_lib.sh
source "$here/dense_lib.sh"
bench_start
maxhosts=0
for h in $hosts_list; do ((h > maxhosts)) && maxhosts=$h; done

echo "# dgc_netlab: $(basename "$config") batch $batch/worker, $steps steps (windows of $interval," \
  "first $skip skipped), rates [$rates], ROUNDS=$rounds," \
  "$([[ $loopback == 1 ]] && echo "LOOPBACK (dry run)" || echo netlab), $(date -u +%Y-%m-%dT%H:%MZ)"

# run_cfg N CFG RATE ROUND PORT -> the run's step time in ms on stdout
run_cfg() {
  local n=$1 cfg=$2 out=$work/$1.$2.$3.$4 port=$5 a
  mapfile -t a < <(args_of "$cfg" "$n")
  case $cfg in
  dense | dgc | dgc-after)
    FLEET_LOG_LEVEL=info fleet_dist "$n" "$port" "$out" "${a[@]}" >&2
    window_ms "$skip" $((n * batch)) "$out" | median
    ;;
  no-comm)
    fleet_solo "$n" "$out" "${a[@]}" >&2
    window_ms "$skip" "$batch" "$out".* | median
    ;;
  esac
}

lab_wait_free
port=6400
for rate in $rates; do
  lab_up "$maxhosts" "$rate"
  for ((r = 0; r < rounds; r++)); do
    for h in $hosts_list; do
      for ((k = 0; k < ncfg; k++)); do
        c=${cfgs[$(((r + k) % ncfg))]}
        for ((try = 0; ; try++)); do
          guard_wait_idle
          guard_begin
          run_cfg "$h" "$c" "$rate" "$r" "$port" >"$work/ms" &
          wait $!
          ms=$(cat "$work/ms")
          guard_end
          port=$((port + 10)) # a fresh port per job
          ((GUARD_OTHER_PCT <= max_other || try >= retries)) && break
          echo "# $rate round $((r + 1)) $h hosts $c: other processes took ${GUARD_OTHER_PCT}% of the CPU; again" >&2
        done
        echo "$rate $h $r $c $ms $GUARD_OTHER_PCT" >>"$raw"
        echo "# $rate round $((r + 1)) $h hosts $c: $ms ms/step (other CPU ${GUARD_OTHER_PCT}%)" >&2
      done
    done
  done
done

# wire MB per step per rank, from rank 0's "comm X MB" (bytes sent during a window)
has_cfg() { [[ " ${cfgs[*]} " == *" $1 "* ]]; }
wire_mb() { # RATE N CFG
  has_cfg "$3" || return 0
  local r files=()
  for ((r = 0; r < rounds; r++)); do files+=("$work/$2.$3.$1.$r"); done
  awk -v iv="$interval" -v skip="$skip" 'FNR == 1 { w = 0 }
    /^worker_index: 0, .* ips / { if (++w <= skip) next
      for (i = 1; i <= NF; i++) if ($i == "comm") print $(i + 1) / iv }' "${files[@]}" | median
}
cell() { awk -v rt="$1" -v h="$2" -v c="$3" '$1 == rt && $2 == h && $4 == c { print $5 }' "$raw" | median; }

echo
echo "# step time (ms), median of $rounds rounds; speedup = dense / dgc (seed 000: 0.99, 1.47, 6.53" \
  "at 100G, 10G, 1G); dgc/no-comm: goal <= 1.10; wire = MB a rank sent per step; - = not run"
printf '%8s %5s %9s %9s %9s %9s %8s %12s %12s %10s %10s\n' rate hosts dense dgc dgc-after \
  no-comm speedup dgc/no-comm after/no-comm "dense MB" "dgc MB"
for rate in $rates; do
  for h in $hosts_list; do
    awk -v rt="$rate" -v h="$h" -v d="$(cell "$rate" "$h" dense)" -v g="$(cell "$rate" "$h" dgc)" \
      -v ga="$(cell "$rate" "$h" dgc-after)" -v nc="$(cell "$rate" "$h" no-comm)" \
      -v dw="$(wire_mb "$rate" "$h" dense)" -v gw="$(wire_mb "$rate" "$h" dgc)" '
      function none(x) { return x == "" || x == "nan" }
      function ms(x) { return none(x) ? sprintf("%9s", "-") : sprintf("%9.1f", x) }
      function ratio(a, b, w) {
        return (none(a) || none(b) || b == 0) ? sprintf("%" w "s", "-") : sprintf("%" w ".3f", a / b) }
      function mb(x) { return none(x) ? sprintf("%10s", "-") : sprintf("%10.3f", x) }
      BEGIN {
        printf "%8s %5d %s %s %s %s %s %s %s %s %s\n", rt, h, ms(d), ms(g), ms(ga), ms(nc),
          ratio(d, g, 8), ratio(g, nc, 12), ratio(ga, nc, 12), mb(dw), mb(gw) }'
  done
done
line="# runs over ${max_other}% other CPU after $retries retries:"
line+=" $(awk -v mx="$max_other" '$6 > mx' "$raw" | wc -l)"
echo "$line"
if [[ -n ${RAW:-} ]]; then
  { echo "# rate hosts round config step_ms other_cpu_pct"; cat "$raw"; } >"$RAW"
fi
