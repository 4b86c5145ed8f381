#!/usr/bin/env bash
# crypto_netlab.sh - what encrypted frames cost between hosts (issue 35): fleet's allreduce (f32
# sum, fleet-commbench -c 0) with FLEET_COMM_ENCRYPT=0 and =1 between emulated hosts of
# bench/netlab, one rank per host, at each link rate of RATES and each host count of HOSTS:
# 4 KiB time (latency) and 64 MiB busbw. Every host's fleetrun runs in its own namespace
# (`netlab exec`; nothing from the root namespace touches the lab). Within every round each
# host count runs plain and encrypted back to back, the order rotated per round; each cell is
# the median of the rounds, and the ratio encrypted / plain is taken from the same rounds.
# Jobs during which other processes used more than GUARD_MAX_OTHER % of the cores are counted
# (bench/cpu_guard.sh) and said; on a shared machine read the ratios, not the absolutes.
# crypto_allreduce.sh is the loopback counterpart. The lab is always taken down on exit.
#
# Usage: bench/crypto_netlab.sh [BUILD_DIR]
#   RATES="1gbit 10gbit" HOSTS="2 4" ROUNDS=5 LAT_ITERS=500 BW_ITERS=5 WARMUP=2
#   GUARD_MAX_OTHER=10 GUARD_WAIT_S=20 (how long to wait for an idle machine before a job)
set -euo pipefail
trap 'echo "$(basename "$0"): failed at line $LINENO: $BASH_COMMAND" >&2' ERR
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
rates=${RATES:-1gbit 10gbit} hosts_list=${HOSTS:-2 4} rounds=${ROUNDS:-5}
lat_iters=${LAT_ITERS:-500} bw_iters=${BW_ITERS:-5} warmup=${WARMUP:-2}
max_other=${GUARD_MAX_OTHER:-10}
export GUARD_WAIT_S=${GUARD_WAIT_S:-20}
netlab=$here/netlab
# shellcheck source=SCRIPTDIR/cpu_guard.sh
source "$here/cpu_guard.sh"
fleetrun=$build/tools/fleetrun
commbench=$build/tools/fleet-commbench
for f in "$fleetrun" "$commbench"; do
  [[ -x $f ]] || { echo "crypto_netlab.sh: $f not built" >&2; exit 1; }
done
"$netlab" check >/dev/null || { echo "crypto_netlab.sh: netlab cannot run here (netlab check)" >&2; exit 77; }
maxhosts=0
for h in $hosts_list; do ((h > maxhosts)) && maxhosts=$h; done

work=$(mktemp -d /tmp/crypto_netlab.XXXXXX)
cleanup() { "$netlab" down >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
raw=$work/raw
: >"$raw"

# job NHOSTS ENC SIZE ITERS PORT: one fleetrun per host; prints "time_us busbw" of rank 0's row
job() {
  local n=$1 enc=$2 size=$3 iters=$4 port=$5 i ips="" pids=() rc=0 token
  for ((i = 0; i < n; i++)); do ips+=${ips:+,}$("$netlab" addr "$i"); done
  token=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for ((i = 0; i < n; i++)); do
    FLEET_JOB_TOKEN=$token FLEET_COMM_ENCRYPT=$enc timeout 600 "$netlab" exec "$i" "$fleetrun" \
      --ips "$ips" --nproc_per_node 1 --started_port "$port" --log_dir "$work/log/h$i" \
      "$commbench" -b "$size" -e "$size" -n "$iters" -w "$warmup" -c 0 -o allreduce \
      >"$work/out.$i" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  if ((rc != 0)); then
    echo "crypto_netlab.sh: $n-host job (FLEET_COMM_ENCRYPT=$enc, $size) failed (exit $rc):" >&2
    tail -n 5 "$work/out.0" >&2
    return 1
  fi
  # size count type redop root time_us algbw busbw #wrong; busbw recomputed from the time
  awk -v n="$n" '$1 ~ /^[0-9]+$/ && $3 == "f32" && NF >= 9 {
      if ($9 != "0" && $9 != "N/A") { print "wrong results: " $0 > "/dev/stderr"; exit 1 }
      printf "%.2f %.5f\n", $6, $1 / ($6 * 1e-6) / 1e9 * 2 * (n - 1) / n }' "$work/out.0"
}

echo "# crypto_netlab: allreduce f32 sum, 1 rank per host, FLEET_COMM_ENCRYPT 0/1, links $rates," \
  "hosts $hosts_list, ROUNDS=$rounds, 4 KiB x $lat_iters, 64 MiB x $bw_iters, $(date -u +%Y-%m-%dT%H:%MZ)"
port=6170
for rate in $rates; do
  "$netlab" up "$maxhosts" "$rate" >&2
  for ((r = 0; r < rounds; r++)); do
    order="0 1"
    ((r % 2)) && order="1 0"
    for h in $hosts_list; do
      for e in $order; do
        guard_wait_idle
        guard_begin
        lat=$(job "$h" "$e" 4K "$lat_iters" "$port")
        bw=$(job "$h" "$e" 64M "$bw_iters" $((port + 5)))
        guard_end
        read -r t _ <<<"$lat"
        read -r _ b <<<"$bw"
        port=$((port + 10)) # fresh ports per job: no wait on the last job's sockets
        echo "$rate $h $e $r $t $b $GUARD_OTHER_PCT" >>"$raw"
      done
    done
    echo "# $rate: round $((r + 1))/$rounds: $(awk -v r="$r" -v rt="$rate" '$1 == rt && $4 == r { printf "%sh enc=%s %s us %s GB/s (other %s%%); ", $2, $3, $5, $6, $7 }' "$raw")" >&2
  done
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v rt="$1" -v h="$2" -v e="$3" -v c="$4" '$1 == rt && $2 == h && $3 == e { print $c }' "$raw" | median; }
echo
echo "| link, hosts | 4 KiB plain (µs) | 4 KiB encrypted (µs) | Δ | 64 MiB busbw plain (GB/s) | encrypted (GB/s) | encrypted / plain | jobs disturbed (> ${max_other}% other CPU) |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for rate in $rates; do
  for h in $hosts_list; do
    l0=$(col "$rate" "$h" 0 5) l1=$(col "$rate" "$h" 1 5) b0=$(col "$rate" "$h" 0 6) b1=$(col "$rate" "$h" 1 6)
    # the bandwidth ratio per round (same round, adjacent jobs), then its median
    ratio=$(awk -v rt="$rate" -v h="$h" '$1 == rt && $2 == h { b[$4, $3] = $6; R[$4] = 1 }
      END { for (r in R) if (b[r, 0] > 0) print b[r, 1] / b[r, 0] }' "$raw" | median)
    dist=$(awk -v rt="$rate" -v h="$h" -v mx="$max_other" '$1 == rt && $2 == h && $7 > mx { n++ } END { print n + 0 }' "$raw")
    total=$(awk -v rt="$rate" -v h="$h" '$1 == rt && $2 == h { n++ } END { print n + 0 }' "$raw")
    awk -v rt="$rate" -v h="$h" -v l0="$l0" -v l1="$l1" -v b0="$b0" -v b1="$b1" -v q="$ratio" \
      -v d="$dist" -v t="$total" 'BEGIN { printf "| %s, %d | %.1f | %.1f | %+.1f | %.4f | %.4f | %.2f× | %d of %d |\n",
        rt, h, l0, l1, l1 - l0, b0, b1, q, d, t }'
  done
done
if [[ -n ${RAW:-} ]]; then
  { echo "# rate hosts encrypt round time_4k_us busbw_64m_GBps other_cpu_pct"; cat "$raw"; } >"$RAW"
fi
