#!/usr/bin/env bash
# dense_overlap.sh - how much of the dense strategy's communication overlap hides (issue 4).
# On netlab (one fleet-train worker per emulated host, one compute thread each) the median
# training-step time of
#   overlap    dense, buckets start during backward (strategy.overlap: true, the default)
#   no-overlap dense with strategy.overlap=false: every bucket starts after backward
#   no-comm    the same N processes at the same time on the same hosts, each a job of one: the
#              same local batch, compute and CPU sharing, no communication (fleet has no
#              "communication off" switch; a job of one sends nothing)
# comm = no-overlap - no-comm; hidden = (no-overlap - overlap) / (no-overlap - no-comm), the
# fraction of the communication time that overlap takes off the step (goal: >= 0.5).
# A step time is global batch / ips of fleet-train's progress lines (every INTERVAL steps),
# median over the windows after the first SKIP of a run; each cell is the median over ROUNDS
# rounds; in every round the three configurations run one after the other, in an order that
# rotates from round to round. The lab is always taken down on exit.
#
# Usage: bench/dense_overlap.sh [BUILD_DIR]
#   HOSTS="2 4"  RATE=1gbit  BATCH=256 (per worker)  FUSE=4 (strategy.fuse_grad_size_in_MB)
#   STEPS=45  INTERVAL=5  SKIP=1  ROUNDS=5
#   CONFIG=bench/dense_mlp.yaml  EXTRA="-o key=value ..." (more fleet-train overrides)
#   RAW=FILE      also write every run's step time there
#   LOOPBACK=1    dry run: local processes on 127.0.0.1, no lab (timings mean nothing)
#   GUARD_MAX_OTHER=10 GUARD_RETRIES=3  a run during which other processes used more than
#                 GUARD_MAX_OTHER % of the cores runs again (bench/cpu_guard.sh)
#   LAB_WAIT_S, LAB_QUIET_S: see bench/dense_lib.sh (waiting for another lab to finish)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
hosts_list=${HOSTS:-2 4}
rate=${RATE:-1gbit}
batch=${BATCH:-256} fuse=${FUSE:-4}
steps=${STEPS:-45} interval=${INTERVAL:-5} skip=${SKIP:-1} rounds=${ROUNDS:-5}
config=${CONFIG:-$here/dense_mlp.yaml}
read -r -a extra <<<"${EXTRA:-}"
max_other=${GUARD_MAX_OTHER:-10} retries=${GUARD_RETRIES:-3}
# shellcheck source=dense_lib.sh
source "$here/dense_lib.sh"
bench_start
maxhosts=0
for h in $hosts_list; do ((h > maxhosts)) && maxhosts=$h; done

lab_wait_free
lab_up "$maxhosts" "$rate"

echo "# dense_overlap: $(basename "$config") batch $batch/worker, fuse $fuse MiB, $steps steps" \
  "(windows of $interval, first $skip skipped), links $rate, ROUNDS=$rounds," \
  "$([[ $loopback == 1 ]] && echo "LOOPBACK (dry run)" || echo netlab), $(date -u +%Y-%m-%dT%H:%MZ)"

# run_cfg N CFG ROUND PORT -> the run's step time in ms on stdout
run_cfg() {
  local n=$1 cfg=$2 r=$3 port=$4 out=$work/$1.$2.$3 common
  common=(-c "$config" -o "train.batch_size=$batch" -o "train.max_steps=$steps"
    -o "train.log_interval=$interval" -o "strategy.fuse_grad_size_in_MB=$fuse" "${extra[@]}")
  case $cfg in
  overlap | no-overlap)
    FLEET_LOG_LEVEL=debug fleet_dist "$n" "$port" "$out" "${common[@]}" \
      -o "data.train_size=$((steps * n * batch))" \
      -o "strategy.overlap=$([[ $cfg == overlap ]] && echo true || echo false)" >&2
    window_ms "$skip" $((n * batch)) "$out" | median
    ;;
  no-comm)
    fleet_solo "$n" "$out" "${common[@]}" -o "data.train_size=$((steps * batch))" >&2
    window_ms "$skip" "$batch" "$out".* | median
    ;;
  esac
}

cfgs=(overlap no-overlap no-comm)
port=6300
for ((r = 0; r < rounds; r++)); do
  for h in $hosts_list; do
    for ((k = 0; k < 3; k++)); do
      c=${cfgs[$(((r + k) % 3))]}
      for ((try = 0; ; try++)); do
        guard_wait_idle
        guard_begin
        run_cfg "$h" "$c" "$r" "$port" >"$work/ms" &
        wait $!
        ms=$(cat "$work/ms")
        guard_end
        port=$((port + 10)) # a fresh port per job
        ((GUARD_OTHER_PCT <= max_other || try >= retries)) && break
        echo "# round $((r + 1)) $h hosts $c: other processes took ${GUARD_OTHER_PCT}% of the CPU; again" >&2
      done
      echo "$h $r $c $ms $GUARD_OTHER_PCT" >>"$raw"
      echo "# round $((r + 1)) $h hosts $c: $ms ms/step (other CPU ${GUARD_OTHER_PCT}%)" >&2
    done
  done
done

# wire MB per step per rank, from rank 0's "comm X MB" (bytes sent during a window)
wire_mb() {
  local r files=()
  for ((r = 0; r < rounds; r++)); do files+=("$work/$1.overlap.$r"); done
  awk -v iv="$interval" '/^worker_index: 0, .* ips / {
      for (i = 1; i <= NF; i++) if ($i == "comm") print $(i + 1) / iv }' "${files[@]}" | median
}
# ideal time of W MB at the link rate (TCP goodput 0.956 x rate, netlab.md), ms
ideal_ms() {
  awk -v w="$1" -v r="$rate" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
    m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 0
    if (m == 0) print "nan"; else printf "%.1f\n", w * 8e6 / (0.956 * n * m) * 1000 }'
}
cell() { awk -v h="$1" -v c="$2" '$1 == h && $3 == c { print $4 }' "$raw" | median; }

echo
echo "# step time (ms), median of $rounds rounds; comm = no-overlap - no-comm;" \
  "hidden = (no-overlap - overlap) / comm (goal >= 0.5); wire = MB sent per step per rank and"
echo "# its time at 0.956 x $rate; per-round hidden = median over rounds of each round's own ratio"
printf '%5s %9s %10s %8s %8s %7s %8s %8s %9s %9s  %s\n' hosts overlap no-overlap no-comm comm \
  hidden "hidden/r" "wire MB" "wire ms" "overhead" buckets
for h in $hosts_list; do
  ov=$(cell "$h" overlap) no=$(cell "$h" no-overlap) nc=$(cell "$h" no-comm)
  per_round=$(awk -v h="$h" '$1 == h { t[$2, $3] = $4; r[$2] = 1 }
    END { for (k in r) { d = t[k, "no-overlap"] - t[k, "no-comm"]
                         if (d > 0) print (t[k, "no-overlap"] - t[k, "overlap"]) / d } }' "$raw" | median)
  w=$(wire_mb "$h")
  b=$(buckets "$work/$h.overlap.0")
  awk -v h="$h" -v ov="$ov" -v no="$no" -v nc="$nc" -v pr="$per_round" -v w="$w" \
    -v wi="$(ideal_ms "$w")" -v b="$b" 'BEGIN {
      c = no - nc; hid = c > 0 ? (no - ov) / c : 0
      printf "%5d %9.1f %10.1f %8.1f %8.1f %7.2f %8.2f %8.1f %9.1f %9.2f  %s\n",
        h, ov, no, nc, c, hid, pr, w, wi, ov / nc, b }'
done
echo "# overhead = overlap / no-comm (DESIGN.md's comm overhead of the strategy)"
line="# runs over ${max_other}% other CPU after $retries retries:"
line+=" $(awk -v mx="$max_other" '$5 > mx' "$raw" | wc -l)"
echo "$line"
if [[ -n ${RAW:-} ]]; then
  { echo "# hosts round config step_ms other_cpu_pct"; cat "$raw"; } >"$RAW"
fi
