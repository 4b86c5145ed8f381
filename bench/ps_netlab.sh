#!/usr/bin/env bash
# ps_netlab.sh - parameter-server training on emulated links (issue 32's table): WORKERS
# fleet-train workers and SERVERS servers, each process on its own bench/netlab host (workers
# on hosts 0..W-1, servers on the next S), links of RATE, beside collective dense and DGC on the
# same worker hosts, all on one config (default the Fashion-MNIST MLP, configs/fashion_mlp.yaml).
#   dense        collective: ring / recursive-doubling allreduce among the workers
#   dgc          collective Deep Gradient Compression (sparsity 0.999)
#   sync         PS, a_sync false: every step pushes the gradients and pulls the parameters
#   async        PS, a_sync true, k_steps -1
#   geoK         PS geo with k_steps K (GEOS="4 16 100")
# Per configuration: samples/s = global batch / median step time of worker 0's progress windows
# after the first SKIP, median over ROUNDS rounds; MB/step = what worker 0 sent per step
# ("comm" of its progress lines: the servers' bytes in PS mode); link use (sync only) = the
# bytes the busiest link carries per step, in and out (a server's: workers x params x 4 /
# servers each way: every worker's gradients in, the parameters out) over the step time, against
# RATE (1.0: one direction of that link busy all the time; pushes and pulls do not overlap
# within a step); acc1 = the final val_acc1.
#
# Usage: bench/ps_netlab.sh [BUILD_DIR]
#   WORKERS=4 SERVERS=2 RATE=1gbit ROUNDS=3 SKIP=1 STEPS=600 (train.max_steps of every run)
#   CONFIG=configs/fashion_mlp.yaml  CFGS="dense dgc sync async geo4 geo16 geo100"
#   EXTRA="-o key=value ..."  ASYNC_EXTRA="-o optimizer.momentum=0.5" (async only: asynchrony
#   adds momentum of its own, docs/ps.md, and the config's 0.9 on top diverges)  RAW=FILE  LOOPBACK=1 (dry run on 127.0.0.1: timings mean nothing)
#   GUARD_MAX_OTHER=10 GUARD_RETRIES=3 (bench/cpu_guard.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case ${1:-} in
-h | --help)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
  ;;
esac
build=$(cd "${1:-$here/../build}" && pwd)
workers=${WORKERS:-4} servers=${SERVERS:-2}
rate=${RATE:-1gbit}
rounds=${ROUNDS:-3} skip=${SKIP:-1} steps=${STEPS:-600}
config=${CONFIG:-$here/../configs/fashion_mlp.yaml}
read -r -a cfgs <<<"${CFGS:-dense dgc sync async geo4 geo16 geo100}"
read -r -a extra <<<"${EXTRA:-}"
async_extra=${ASYNC_EXTRA--o optimizer.momentum=0.5}
max_other=${GUARD_MAX_OTHER:-10} retries=${GUARD_RETRIES:-3}
# shellcheck source=dense_lib.sh
source "$here/dense_lib.sh"
# shellcheck source=ps_lib.sh
source "$here/ps_lib.sh"
unset TRAINING_ROLE PADDLE_PSERVERS_IP_PORT_LIST POD_IP PADDLE_PORT
bench_start

hosts=$((workers + servers))
lab_wait_free
lab_up "$hosts" "$rate"
batch=$(sed -n 's/^ *batch_size: *\([0-9]*\).*/\1/p' "$config" | head -1)
gb=$((workers * batch))
echo "# ps_netlab: $(basename "$config"), $workers workers x batch $batch, $servers servers," \
  "links $rate, $steps steps, ROUNDS=$rounds," \
  "$([[ $loopback == 1 ]] && echo "LOOPBACK (dry run: timings mean nothing)" || echo netlab)," \
  "$(date -u +%Y-%m-%dT%H:%MZ)"

strategy_of() { # CFG -> fleet-train overrides
  case $1 in
  dgc) echo "-o strategy.dgc=true -o strategy.dgc_configs.rampup_begin_step=0" ;;
  sync) echo "-o strategy.a_sync=false" ;;
  async) echo "-o strategy.a_sync=true -o strategy.a_sync_configs.k_steps=-1 $async_extra" ;;
  geo*) echo "-o strategy.a_sync=true -o strategy.a_sync_configs.k_steps=${1#geo}" ;;
  esac
}

last_acc() { sed -n 's/.*eval .*val_acc1 \([0-9.]*\).*/\1/p' "$1" | tail -1; }

run_cfg() { # CFG ROUND PORT -> "samples/s acc1 MB/step"
  local cfg=$1 r=$2 port=$3 out=$work/$1.$2 ms common
  common=(-c "$config" -o "train.max_steps=$steps" "${extra[@]}")
  # shellcheck disable=SC2046
  case $cfg in
  dense | dgc) fleet_dist "$workers" "$port" "$out" "${common[@]}" $(strategy_of "$cfg") >&2 ;;
  *) ps_job "$port" "$out" "${common[@]}" $(strategy_of "$cfg") >&2 ;;
  esac
  ms=$(window_ms "$skip" "$gb" "$out" | median)
  awk -v ms="$ms" -v gb="$gb" -v acc="$(last_acc "$out")" -v mb="$(comm_mb "$out")" \
    'BEGIN { printf "%.1f %s %s %s\n", 1000 * gb / ms, acc == "" ? "-" : acc, mb, ms }'
}

port=6600
ncfg=${#cfgs[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < ncfg; i++)); do
    c=${cfgs[$(((r + i) % ncfg))]}
    for ((try = 0; ; try++)); do
      guard_wait_idle
      guard_begin
      run_cfg "$c" "$r" "$port" >"$work/res" &
      wait $!
      guard_end
      ((GUARD_OTHER_PCT <= max_other || try >= retries)) && break
      echo "# round $((r + 1)) $c: other processes took ${GUARD_OTHER_PCT}% of the CPU; again" >&2
    done
    echo "$c $r $(cat "$work/res") $GUARD_OTHER_PCT" >>"$raw"
    echo "# round $((r + 1)) $c: samples/s acc1 MB/step ms = $(cat "$work/res")" >&2
    port=$((port + 20))
  done
done

params=$(awk '/parameters$/ { for (i = 1; i <= NF; i++) if ($(i + 1) == "parameters") print $i }' \
  "$work"/sync.0 2>/dev/null | head -1)
rate_bps=$(awk -v r="$rate" 'BEGIN { n = r + 0; u = tolower(substr(r, length(n "") + 1))
  m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1; print n * m }')
col() { awk -v c="$1" -v f="$2" '$1 == c && $f != "-" { print $f }' "$raw" | median; }
echo
echo "# samples/s: global batch / median step time, median of $rounds rounds; MB/step: worker 0"
echo "# sent per step; link: sync's busiest link (a server's) busy fraction; acc1: final val_acc1"
printf '%-8s %11s %9s %9s %8s %8s\n' config samples/s vs_dense MB/step link acc1
dense=$(col dense 3)
for c in "${cfgs[@]}"; do
  awk -v c="$c" -v s="$(col "$c" 3)" -v d="$dense" -v a="$(col "$c" 4)" -v mb="$(col "$c" 5)" \
    -v ms="$(col "$c" 6)" -v p="${params:-0}" -v w="$workers" -v sv="$servers" -v bps="$rate_bps" \
    'BEGIN {
      link = "-"
      if (c == "sync" && p > 0 && ms > 0) link = sprintf("%.2f", 2 * (w * p * 4 / sv) * 8 / (ms / 1000) / bps)
      vs = (d > 0) ? sprintf("%.3f", s / d) : "-"
      printf "%-8s %11.1f %9s %9s %8s %8s\n", c, s, vs, mb, link, a }'
done
echo "# goals (issue 32): sync's link use >= 0.9; geo at 100mbit >= 5x sync's samples/s, accuracy within 0.5 points"
if [[ -n ${RAW:-} ]]; then
  { echo "# config round samples_per_s acc1 mb_per_step step_ms other_cpu_pct"; cat "$raw"; } >"$RAW"
fi
