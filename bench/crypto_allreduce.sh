#!/usr/bin/env bash
# crypto_allreduce.sh - what encrypted frames cost the tcp backend (issue 35): allreduce with
# FLEET_COMM_ENCRYPT=0 and =1 on loopback TCP (FLEET_COMM_LOCAL=0, so neither unix sockets nor
# shared memory), fleetrun --bind_to core, f32 sum: 4 KiB time (latency) and 64 MiB busbw.
# The two systems alternate within every round (order rotated per round); the table gives the
# medians over the rounds and their ratio (encrypted / plain), measured in the same rounds:
# machines here are noisy, and only the ratio is worth comparing with other machines.
#
# Usage: bench/crypto_allreduce.sh [BUILD_DIR]
#   ROUNDS=5 NPROC=2 LAT_ITERS=2000 BW_ITERS=5
set -u
build=${1:-build}
run="$build/tools/fleetrun"
cb="$build/tools/fleet-commbench"
rounds=${ROUNDS:-5} nproc=${NPROC:-2} lat_iters=${LAT_ITERS:-2000} bw_iters=${BW_ITERS:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A lat bw
one() { # one ENC SIZE ITERS -> "time_us busbw"
  FLEET_COMM_LOCAL=0 FLEET_COMM_ENCRYPT=$1 timeout 300 "$run" --nproc_per_node "$nproc" \
    --bind_to core --log_dir "$tmp/log" "$cb" -b "$2" -e "$2" -n "$3" -w 2 -c 0 -o allreduce \
    2>&1 | awk '$1 ~ /^[0-9]+$/ && $3 == "f32" { print $6, $8 }'
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for r in $(seq "$rounds"); do
  order="0 1"
  [ $((r % 2)) -eq 0 ] && order="1 0"
  for e in $order; do
    read -r t _ <<<"$(one "$e" 4K "$lat_iters")"
    lat[$e]+=" $t"
    read -r _ b <<<"$(one "$e" 64M "$bw_iters")"
    bw[$e]+=" $b"
  done
  echo "round $r: 4 KiB us plain/enc ${lat[0]##* } ${lat[1]##* }; 64 MiB busbw GB/s ${bw[0]##* } ${bw[1]##* }"
done
l0=$(median <<<"${lat[0]}") l1=$(median <<<"${lat[1]}") b0=$(median <<<"${bw[0]}") b1=$(median <<<"${bw[1]}")
echo
echo "| $nproc ranks, loopback TCP | 4 KiB time (µs) | 64 MiB busbw (GB/s) |"
echo "| --- | ---: | ---: |"
echo "| plain (FLEET_COMM_ENCRYPT=0) | $l0 | $b0 |"
echo "| encrypted (FLEET_COMM_ENCRYPT=1) | $l1 | $b1 |"
echo "| encrypted / plain | +$(awk -v a="$l1" -v b="$l0" 'BEGIN { printf "%.1f µs", a - b }') | $(awk -v a="$b1" -v b="$b0" 'BEGIN { printf "%.2f×", a / b }') |"
