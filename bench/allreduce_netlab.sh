#!/usr/bin/env bash
# allreduce_netlab.sh - fleet's allreduce busbw over emulated 1 Gbit/s links (bench/netlab)
# beside the ideal TCP goodput of the link (0.956 x rate: 1448 payload bytes per 1514-byte
# Ethernet frame; netlab.md). One rank per emulated host, every host's fleetrun started in its
# own namespace with `netlab exec` (nothing runs from the root namespace against the lab); only
# rank 0's table is read. Host counts alternate within each round; each cell is the median of
# ROUNDS rounds. The lab is always taken down on exit.
#
# Usage: bench/allreduce_netlab.sh [BUILD_DIR]
#   ROUNDS=5           rounds
#   HOSTS="4 2"        host counts, run in this order in every round (2 hosts use h0, h1 of the
#                      lab, whose links are the same)
#   RATE=1gbit         link rate (tc syntax, mbit or gbit)
#   ITERS=10 WARMUP=3  timed / warm-up allreduces per size (fleet-commbench -n / -w)
#   MINB=1M MAXB=64M   sizes (factor 2)
#   RAW=FILE           also write every single measurement there
#   GUARD_MAX_OTHER=10 GUARD_RETRIES=5  a job during which other processes used more than
#                      GUARD_MAX_OTHER % of the cores runs again, up to GUARD_RETRIES times;
#                      medians leave out what stayed disturbed (bench/cpu_guard.sh)
set -euo pipefail
trap 'echo "$(basename "$0"): failed at line $LINENO: $BASH_COMMAND" >&2' ERR
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
rounds=${ROUNDS:-5}
hosts_list=${HOSTS:-4 2}
rate=${RATE:-1gbit}
iters=${ITERS:-10} warmup=${WARMUP:-3}
minb=${MINB:-1M} maxb=${MAXB:-64M}
netlab=$here/netlab
max_other=${GUARD_MAX_OTHER:-10} retries=${GUARD_RETRIES:-5}
# shellcheck source=SCRIPTDIR/cpu_guard.sh
source "$here/cpu_guard.sh"
fleetrun=$build/tools/fleetrun
commbench=$build/tools/fleet-commbench
for f in "$fleetrun" "$commbench"; do
  [[ -x $f ]] || { echo "allreduce_netlab.sh: $f not built (make build)" >&2; exit 1; }
done
"$netlab" check >/dev/null || { echo "allreduce_netlab.sh: netlab cannot run here (netlab check)" >&2; exit 77; }

# ideal TCP goodput in GB/s (1e9 bytes): 0.956 x rate / 8
ideal=$(awk -v r="$rate" 'BEGIN {
  n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
  m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 0
  if (m == 0) exit 1
  printf "%.4f\n", 0.956 * n * m / 8 / 1e9 }') || { echo "allreduce_netlab.sh: RATE '$rate': use kbit, mbit or gbit" >&2; exit 2; }
maxhosts=0
for h in $hosts_list; do ((h > maxhosts)) && maxhosts=$h; done

work=$(mktemp -d /tmp/allreduce_netlab.XXXXXX)
cleanup() { "$netlab" down >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
raw=$work/raw
: >"$raw"

"$netlab" up "$maxhosts" "$rate" >&2

# run_job NHOSTS PORT ROUND: one fleetrun per host, in its namespace; rank 0's rows (hosts round
# bytes time_us busbw) on stdout
run_job() {
  local n=$1 port=$2 r=$3 i ips="" pids=() rc=0 token
  for ((i = 0; i < n; i++)); do ips+=${ips:+,}$("$netlab" addr "$i"); done
  token=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for ((i = 0; i < n; i++)); do
    FLEET_JOB_TOKEN=$token timeout 900 "$netlab" exec "$i" "$fleetrun" --ips "$ips" \
      --nproc_per_node 1 --started_port "$port" --log_dir "$work/log.$n.$r/h$i" \
      "$commbench" -b "$minb" -e "$maxb" -f 2 -n "$iters" -w "$warmup" -c 1 \
      >"$work/out.$n.$r.$i" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  if ((rc != 0)); then
    echo "allreduce_netlab.sh: $n-host job failed (exit $rc); host 0 said:" >&2
    cat "$work/out.$n.$r.0" >&2
    return 1
  fi
  # rows: size count type redop root time_us algbw busbw #wrong; busbw is recomputed from the
  # time (the table's 3 decimals are too coarse at 0.12 GB/s)
  awk -v n="$n" -v r="$r" '$1 ~ /^[0-9]+$/ && NF >= 9 {
      if ($9 != "0") { print "wrong results: " $0 > "/dev/stderr"; bad = 1 }
      printf "%d %d %d %.1f %.5f\n", n, r, $1, $6, $1 / ($6 * 1e-6) / 1e9 * 2 * (n - 1) / n }
    END { exit bad }' "$work/out.$n.$r.0"
}

echo "# allreduce_netlab: fleet-commbench allreduce f32 sum, 1 rank per host, links $rate," \
  "iters $iters, warmup $warmup, ROUNDS=$rounds, $(date -u +%Y-%m-%dT%H:%MZ)"
port=6170 try=0
for ((r = 0; r < rounds; r++)); do
  for h in $hosts_list; do
    for ((try = 0; ; try++)); do
      guard_wait_idle
      guard_begin
      run_job "$h" "$port" "$r" >"$work/rows"
      guard_end
      port=$((port + 10)) # a fresh port per job: no wait on the previous job's sockets
      ((GUARD_OTHER_PCT <= max_other || try >= retries)) && break
      echo "# round $((r + 1)) $h hosts: other processes took ${GUARD_OTHER_PCT}% of the CPU; again" >&2
    done
    sed "s/\$/ $GUARD_OTHER_PCT/" "$work/rows" >>"$raw"
  done
  echo "# round $((r + 1))/$rounds done" >&2
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }
echo
echo "# busbw (GB/s), median of $rounds rounds; ideal = 0.956 x $rate = $ideal GB/s;" \
  "ratio = busbw / ideal (goal >= 0.90 from 4 MiB)"
hdr=$(printf '%10s' size)
for h in $hosts_list; do hdr+=$(printf ' %13s %9s' "busbw ${h}h" "ratio ${h}h"); done
printf '%s %9s\n' "$hdr" ideal
for b in $(awk '{ print $3 }' "$raw" | sort -gu); do
  line=$(awk -v b="$b" 'BEGIN { if (b >= 1048576) printf "%6d MiB", b / 1048576; else printf "%6d KiB", b / 1024 }')
  for h in $hosts_list; do
    m=$(awk -v h="$h" -v b="$b" -v mx="$max_other" '$1 == h && $3 == b && $6 <= mx { print $5 }' "$raw" | median)
    [[ $m == nan ]] && m=$(awk -v h="$h" -v b="$b" '$1 == h && $3 == b { print $5 }' "$raw" | median)
    line+=$(awk -v m="$m" -v i="$ideal" 'BEGIN { printf " %13.4f %9.3f", m, m / i }')
  done
  printf '%s %9.4f\n' "$line" "$ideal"
done
line="# rounds left out as disturbed (other processes > ${max_other}% CPU):"
for h in $hosts_list; do
  line+=" ${h}h $(awk -v h="$h" -v mx="$max_other" '$1 == h && $6 > mx { d[$2] = 1 } END { print length(d) + 0 }' "$raw")"
done
echo "$line"
if [[ -n ${RAW:-} ]]; then
  { echo "# hosts round bytes time_us busbw_GBps other_cpu_pct"; cat "$raw"; } >"$RAW"
fi
