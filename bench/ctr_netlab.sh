#!/usr/bin/env bash
# ctr_netlab.sh - CTR training across emulated links (issue 33 (b)): fleet-train's wide&deep on
# the synthetic CTR task (default configs/ctr_wide_deep.yaml) with WORKERS workers and SERVERS
# parameter servers, each process on its own bench/netlab host (workers on hosts 0..W-1,
# servers on the next S), links of RATE, in every mode on the same config, the same samples and
# the same number of them:
#   collective   no servers: both sparse tables replicated on the workers, the touched rows'
#                gradients all-gathered, the dense part allreduced (hosts 0..W-1 only)
#   sync         PS, a_sync false: rows pulled and row gradients pushed every step, merged
#   async        PS, a_sync true, k_steps -1: the same, applied on arrival (ASYNC_EXTRA added)
#   geoK         PS geo with k_steps K (CFGS "geo4 geo16 geo64"): local copies, an exchange of
#                the touched rows' differences (and the dense part's) every K steps
# and, once, a single process (no network, batch WORKERS x batch: the same global batches and
# updates as collective and sync) for the reference AUC.
# Per configuration, medians over ROUNDS rounds:
#   ex/s       global batch / median step time of worker 0's progress windows after the first
#              SKIP (ips of the progress lines: every worker's samples over worker 0's window)
#   wire       MB per step on the wire: the sum over all hosts of eth0's tx bytes
#              (/sys/class/net/eth0/statistics inside each host's namespace, before and after
#              the job) over the job's steps; whole-job counters, so startup, the evaluations'
#              traffic (PS sync and async pull the validation rows too) and the final exchange
#              are in it
#   busiest    the busiest link direction's MB per step (the largest tx or rx of any host)
#   link       busiest x 8 / step time / RATE: 1.0 = that direction busy all the time
#   w0comm     what worker 0 itself sent per training step, from its progress lines' "comm"
#              (fleet's own count: allreduce, allgather, PS requests; no TCP/IP headers)
#   cpu        the job's CPU (its processes and the kernel's threads) in % of all cores over
#              the job's wall time (bench/cpu_guard.sh): near 100 = CPU-bound
#   auc        the final validation AUC (eval line), beside the single process's and the
#              teacher's ("teacher's auc": the hidden logistic teacher's own AUC)
#
# Usage: bench/ctr_netlab.sh [BUILD_DIR]
#   WORKERS=4 SERVERS=2 RATE=1gbit ROUNDS=3 SKIP=2  CONFIG=configs/ctr_wide_deep.yaml
#   CFGS="collective sync async geo4 geo16 geo64"  SOLO=1 (0: no single-process reference)
#   EXTRA="-o train.log_interval=16" (overrides for every run, the single process's too)
#   ASYNC_EXTRA="" (async only)  RAW=FILE (the per-run records)
#   LOOPBACK=1 (dry run on 127.0.0.1: timings and wire bytes mean nothing)
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
rounds=${ROUNDS:-3} skip=${SKIP:-2} solo=${SOLO:-1}
config=${CONFIG:-$here/../configs/ctr_wide_deep.yaml}
read -r -a cfgs <<<"${CFGS:-collective sync async geo4 geo16 geo64}"
read -r -a extra <<<"${EXTRA--o train.log_interval=16}"
read -r -a async_extra <<<"${ASYNC_EXTRA:-}"
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
for ((i = 0; i < ${#extra[@]}; i++)); do # a batch_size override wins
  [[ ${extra[i]} == train.batch_size=* ]] && batch=${extra[i]#train.batch_size=}
done
gb=$((workers * batch))
echo "# ctr_netlab: $(basename "$config") ${extra[*]}, $workers workers x batch $batch," \
  "$servers servers, links $rate, ROUNDS=$rounds," \
  "$([[ $loopback == 1 ]] && echo "LOOPBACK (dry run: timings mean nothing)" || echo netlab)," \
  "$(date -u +%Y-%m-%dT%H:%MZ)"

strategy_of() { # CFG -> fleet-train overrides
  case $1 in
  sync) echo "-o strategy.a_sync=false" ;;
  async) echo "-o strategy.a_sync=true -o strategy.a_sync_configs.k_steps=-1 ${async_extra[*]}" ;;
  geo*) echo "-o strategy.a_sync=true -o strategy.a_sync_configs.k_steps=${1#geo}" ;;
  esac
}

# wire_bytes -> per host "tx rx" of eth0, one line each (loopback: zeros)
wire_bytes() {
  local i
  for ((i = 0; i < hosts; i++)); do
    if ((loopback)); then echo "0 0"; else
      on_host "$i" cat /sys/class/net/eth0/statistics/tx_bytes \
        /sys/class/net/eth0/statistics/rx_bytes | paste -sd' '
    fi
  done
}

eval_auc() { sed -n 's/.* eval: auc \([0-9.]*\),.*/\1/p' "$1" | tail -1; }
teacher_auc() { sed -n "s/.*teacher's auc \([0-9.]*\).*/\1/p" "$1" | tail -1; }
last_step() { sed -n 's/^worker_index: 0, epoch [0-9]*, step \([0-9]*\), loss .*/\1/p' "$1" | tail -1; }
comm_total() { # MB worker 0 sent over all its progress windows
  awk '/^worker_index: 0, .* ips / { for (i = 1; i <= NF; i++) if ($i == "comm") s += $(i + 1) }
       END { printf "%.3f\n", s }' "$1"
}

run_cfg() { # CFG ROUND PORT -> "ex/s auc wire_MB busiest_MB w0comm_MB step_ms teacher"
  local cfg=$1 r=$2 port=$3 out=$work/$1.$2 ms steps b0 b1 common
  common=(-c "$config" "${extra[@]}")
  b0=$(wire_bytes)
  # shellcheck disable=SC2046
  case $cfg in
  collective) fleet_dist "$workers" "$port" "$out" "${common[@]}" >&2 ;;
  *) ps_job "$port" "$out" "${common[@]}" $(strategy_of "$cfg") >&2 ;;
  esac
  b1=$(wire_bytes)
  steps=$(last_step "$out")
  ms=$(window_ms "$skip" "$gb" "$out" | median)
  paste -d' ' <(echo "$b0") <(echo "$b1") |
    awk -v ms="$ms" -v gb="$gb" -v st="${steps:-0}" -v auc="$(eval_auc "$out")" \
      -v comm="$(comm_total "$out")" -v tea="$(teacher_auc "$out")" '
      { tx = $3 - $1; rx = $4 - $2; sum += tx; if (tx > big) big = tx; if (rx > big) big = rx }
      END {
        if (st <= 0) st = 1
        printf "%.1f %s %.4f %.4f %.4f %s %s\n", 1000 * gb / ms, auc == "" ? "-" : auc,
          sum / st / 1e6, big / st / 1e6, comm / st, ms, tea == "" ? "-" : tea }'
}

solo_auc=- solo_ips=- teacher=-
if ((solo)); then # the reference: one process, the global batch, no network
  guard_wait_idle
  on_host 0 timeout 900 "$fleet_train" -c "$config" "${extra[@]}" -o "train.batch_size=$gb" \
    >"$work/single" 2>&1 || { echo "ctr_netlab.sh: the single process failed:" >&2; tail -20 "$work/single" >&2; exit 1; }
  solo_auc=$(eval_auc "$work/single")
  teacher=$(teacher_auc "$work/single")
  solo_ips=$(window_ms "$skip" "$gb" "$work/single" | median | awk -v gb="$gb" '{ printf "%.1f", 1000 * gb / $1 }')
  echo "# single process, batch $gb: auc $solo_auc, teacher's auc $teacher, $solo_ips ex/s" >&2
fi

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
      port=$((port + 20))
    done
    echo "$c $r $(cat "$work/res") $GUARD_JOB_PCT $GUARD_OTHER_PCT" >>"$raw"
    echo "# round $((r + 1)) $c: ex/s auc wire busiest w0comm step_ms teacher = $(cat "$work/res")," \
      "cpu ${GUARD_JOB_PCT}%, other ${GUARD_OTHER_PCT}%" >&2
    port=$((port + 20))
  done
done

[[ $teacher == - ]] && teacher=$(awk '$9 != "-" { print $9 }' "$raw" | head -1)
rate_bps=$(awk -v r="$rate" 'BEGIN { n = r + 0; u = tolower(substr(r, length(n "") + 1))
  m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1; print n * m }')
col() { awk -v c="$1" -v f="$2" '$1 == c && $f != "-" { print $f }' "$raw" | median; }
echo
echo "# ex/s: global batch / median step time (median of $rounds rounds); wire: all hosts' eth0 tx"
echo "# MB per step (whole job); busiest: the busiest link direction's MB/step; link: busiest over"
echo "# step time, of $rate; w0comm: worker 0's own MB/step (progress lines); cpu: the job's % of"
echo "# all cores; auc: final validation AUC, d_sync: minus sync's"
printf '%-11s %9s %7s %8s %8s %6s %8s %5s %7s %8s\n' config ex/s vs_sync wire busiest link w0comm \
  cpu auc d_sync
sync_ips=$(col sync 3) sync_auc=$(col sync 4)
for c in "${cfgs[@]}"; do
  awk -v c="$c" -v s="$(col "$c" 3)" -v si="$sync_ips" -v a="$(col "$c" 4)" -v sa="$sync_auc" \
    -v w="$(col "$c" 5)" -v b="$(col "$c" 6)" -v m="$(col "$c" 7)" -v ms="$(col "$c" 8)" \
    -v cpu="$(col "$c" 10)" -v bps="$rate_bps" 'BEGIN {
      vs = (si > 0) ? sprintf("%.2f", s / si) : "-"
      link = (ms > 0) ? sprintf("%.2f", b * 1e6 * 8 / (ms / 1000) / bps) : "-"
      d = (a != "nan" && sa != "nan") ? sprintf("%+.4f", a - sa) : "-"
      printf "%-11s %9.0f %7s %8.3f %8.3f %6s %8.3f %5s %7s %8s\n", c, s, vs, w, b, link, m, cpu, a, d }'
done
echo "single process (batch $gb, no network): auc $solo_auc, $solo_ips ex/s; teacher's auc $teacher"
for c in "${cfgs[@]}"; do
  [[ $c == geo* ]] || continue
  awk -v c="$c" -v s="$(col "$c" 3)" -v si="$sync_ips" -v a="$(col "$c" 4)" -v sa="$sync_auc" 'BEGIN {
    x = (si > 0) ? s / si : 0
    ok = (x >= 3 && sa - a <= 0.005) ? "met" : "not met"
    printf "# target (issue 33 (b)) %s: %.2fx sync ex/s (>= 3), auc %+.4f vs sync (>= -0.005): %s\n",
      c, x, a - sa, ok }'
done
if [[ -n ${RAW:-} ]]; then
  { echo "# config round ex_per_s auc wire_mb busiest_mb w0comm_mb step_ms teacher cpu_pct other_cpu_pct"
    echo "single - $solo_ips $solo_auc - - - - $teacher - -"
    cat "$raw"; } >"$RAW"
fi
