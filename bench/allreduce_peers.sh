#!/usr/bin/env bash
# allreduce_peers.sh - fleet's allreduce beside OpenMPI and PyTorch's gloo on this machine: 2
# ranks on one host, f32 sum, in place, every system timed the same way (WARMUP untimed
# allreduces, barrier, ITERS timed ones; time = mean per allreduce, max over ranks;
# busbw = 2(n-1)/n x bytes / time, GB = 1e9 bytes).
#
# Systems (one 2-rank job each, alternated within every round, the order rotated per round):
#   fleet-tcp   fleetrun --nproc_per_node 2 fleet-commbench, FLEET_COMM_LOCAL=0 (TCP over loopback)
#   fleet-unix  the same with the default: same-host peers move onto unix sockets
#   mpi-tcp     mpirun -np 2 --mca btl tcp,self  bench/mpi_allreduce
#   mpi-shm     mpirun -np 2 --mca btl vader,self bench/mpi_allreduce (shared memory)
#   gloo        2 x /usr/bin/python3 bench/gloo_allreduce.py (torch.distributed, gloo, TCP on lo)
#
# Bandwidth mode: sizes 1, 4, 16, 64 MiB; busbw per system (median over ROUNDS rounds) and the
#   ratios fleet-tcp / best TCP peer (max of mpi-tcp and gloo), fleet-unix / best TCP peer and
#   fleet-unix / mpi-shm.
# Latency mode: 4 KiB allreduce time in us (median over rounds), ratio fleet / mpi-tcp.
#
# Usage: bench/allreduce_peers.sh [BUILD_DIR]
#   ROUNDS=5         rounds (each system once per round)
#   MODE=both        bw, lat or both
#   BW_ITERS=20 BW_WARMUP=5        timed / warm-up allreduces per size, bandwidth mode
#   LAT_ITERS=2000 LAT_WARMUP=200  the same, latency mode
#   RAW=FILE         also write every single measurement there
#   GUARD_MAX_OTHER=10 GUARD_RETRIES=5  a job during which other processes used more than
#                    GUARD_MAX_OTHER % of the cores runs again, up to GUARD_RETRIES times; medians
#                    leave out what stayed disturbed (bench/cpu_guard.sh; the tables say how many)
set -euo pipefail
trap 'echo "$(basename "$0"): failed at line $LINENO: $BASH_COMMAND" >&2' ERR
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
rounds=${ROUNDS:-5}
mode=${MODE:-both}
bw_iters=${BW_ITERS:-20} bw_warmup=${BW_WARMUP:-5}
lat_iters=${LAT_ITERS:-2000} lat_warmup=${LAT_WARMUP:-200}
fleetrun=$build/tools/fleetrun
commbench=$build/tools/fleet-commbench
mpibench=$build/bench/mpi_allreduce
gloobench=$here/gloo_allreduce.py
systems=(fleet-tcp fleet-unix mpi-tcp mpi-shm gloo)
max_other=${GUARD_MAX_OTHER:-10} retries=${GUARD_RETRIES:-5}
# shellcheck source=SCRIPTDIR/cpu_guard.sh
source "$here/cpu_guard.sh"

for f in "$fleetrun" "$commbench" "$mpibench"; do
  [[ -x $f ]] || { echo "allreduce_peers.sh: $f not built (make build; mpi_allreduce needs MPI)" >&2; exit 1; }
done
command -v mpirun >/dev/null || { echo "allreduce_peers.sh: mpirun not found" >&2; exit 1; }
/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || {
  echo "allreduce_peers.sh: torch.distributed not importable by /usr/bin/python3" >&2; exit 1; }

work=$(mktemp -d /tmp/allreduce_peers.XXXXXX)
trap 'rm -rf "$work"' EXIT
raw=$work/raw          # system round bytes time_us busbw
: >"$raw"

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run_one SYSTEM ITERS WARMUP MINBYTES MAXBYTES -> rows "bytes time_us busbw" on stdout
# (sizes MIN, 4 MIN, 16 MIN ... MAX)
run_one() {
  local sys=$1 iters=$2 warmup=$3 lo=$4 hi=$5 sizes=() b
  for ((b = lo; b <= hi; b *= 4)); do sizes+=("$b"); done
  local out=$work/out.$sys
  case $sys in
    fleet-tcp | fleet-unix)
      local envs=(env -u FLEET_COMM_LOCAL -u FLEET_TCP_RD_MAX_BYTES -u FLEET_TCP_SEG_MAX_BYTES
        -u FLEET_TCP_RH_MIN_RANKS -u FLEET_TCP_RH_MIN_BYTES -u FLEET_TCP_RH_MAX_BYTES
        -u FLEET_TCP_BRUCK_MAX_BYTES)
      [[ $sys == fleet-tcp ]] && envs+=(FLEET_COMM_LOCAL=0)
      timeout 600 "${envs[@]}" "$fleetrun" --nproc_per_node 2 --log_dir "$work/log" \
        "$commbench" -b "$lo" -e "$hi" -f 4 -n "$iters" -w "$warmup" -c 0 >"$out" 2>&1 ||
        { cat "$out" >&2; return 1; }
      # rows: size count type redop root time_us algbw busbw #wrong
      awk '$1 ~ /^[0-9]+$/ && NF >= 9 { print $1, $6, $8 }' "$out" ;;
    mpi-tcp | mpi-shm)
      local btl=tcp,self
      [[ $sys == mpi-shm ]] && btl=vader,self
      timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl "$btl" \
        "$mpibench" -n "$iters" -w "$warmup" -r 1 "${sizes[@]}" >"$out" 2>&1 ||
        { cat "$out" >&2; return 1; }
      awk '$1 ~ /^[0-9]+$/ && NF == 5 { print $1, $3, $5 }' "$out" ;;
    gloo)
      local port pids=() r rc=0
      port=$(free_port)
      for r in 0 1; do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 GLOO_SOCKET_IFNAME=lo \
          timeout 600 /usr/bin/python3 "$gloobench" -n "$iters" -w "$warmup" -r 1 "${sizes[@]}" \
          >"$out.$r" 2>&1 &
        pids+=($!)
      done
      for r in "${pids[@]}"; do wait "$r" || rc=$?; done
      ((rc == 0)) || { cat "$out".* >&2; return 1; }
      awk '$1 ~ /^[0-9]+$/ && NF == 5 { print $1, $3, $5 }' "$out.0" ;;
  esac
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }
# med SYSTEM BYTES FIELD(4 = time_us, 5 = busbw) TAG: median over the undisturbed rounds (all
# rounds if none was)
med() {
  local rows
  rows=$(awk -v s="$1" -v b="$2" -v t="$4" -v mx="$max_other" '$1 == s && $3 == b && $6 == t && $7 <= mx' "$raw")
  [[ -n $rows ]] || rows=$(awk -v s="$1" -v b="$2" -v t="$4" '$1 == s && $3 == b && $6 == t' "$raw")
  awk -v f="$3" '{ print $f }' <<<"$rows" | median
}

# measure TAG ITERS WARMUP MINBYTES MAXBYTES: ROUNDS rounds, systems alternated and rotated.
# Every job waits for an idle machine first and is run again (up to GUARD_RETRIES times) when
# something else took more than GUARD_MAX_OTHER percent of the cores while it ran.
measure() {
  local tag=$1 iters=$2 warmup=$3 lo=$4 hi=$5 r k sys try
  for ((r = 0; r < rounds; r++)); do
    for ((k = 0; k < ${#systems[@]}; k++)); do
      sys=${systems[(r + k) % ${#systems[@]}]}
      for ((try = 0; ; try++)); do
        guard_wait_idle
        guard_begin
        run_one "$sys" "$iters" "$warmup" "$lo" "$hi" >"$work/rows"
        guard_end
        ((GUARD_OTHER_PCT <= max_other || try >= retries)) && break
        echo "# $tag round $((r + 1)) $sys: other processes took ${GUARD_OTHER_PCT}% of the CPU; again" >&2
      done
      while read -r b t bw; do
        echo "$sys $r $b $t $bw $tag $GUARD_OTHER_PCT" >>"$raw"
      done <"$work/rows"
    done
    echo "# $tag round $((r + 1))/$rounds done" >&2
  done
}
# disturbed SYSTEM TAG: how many of its jobs kept a disturbed measurement
disturbed() { awk -v s="$1" -v t="$2" -v mx="$max_other" '$1 == s && $6 == t && $7 > mx { d[$2] = 1 } END { print length(d) + 0 }' "$raw"; }

echo "# allreduce_peers: 2 ranks on $(hostname), $(nproc) cores, f32 sum in place, ROUNDS=$rounds," \
  "$(date -u +%Y-%m-%dT%H:%MZ)"

if [[ $mode == bw || $mode == both ]]; then
  measure bw "$bw_iters" "$bw_warmup" $((1 << 20)) $((64 << 20))
  echo
  echo "# busbw (GB/s), median of $rounds rounds; iters $bw_iters, warmup $bw_warmup per size;" \
    "best-tcp = max(mpi-tcp, gloo)"
  printf '%8s %10s %10s %10s %10s %10s %13s %14s %14s\n' size fleet-tcp fleet-unix mpi-tcp \
    mpi-shm gloo "tcp/best-tcp" "unix/best-tcp" "unix/mpi-shm"
  for mib in 1 4 16 64; do
    b=$((mib << 20)) v=()
    for sys in "${systems[@]}"; do v+=("$(med "$sys" "$b" 5 bw)"); done
    awk -v m="$mib" -v ft="${v[0]}" -v fu="${v[1]}" -v mt="${v[2]}" -v ms="${v[3]}" -v g="${v[4]}" \
      'BEGIN { best = mt > g ? mt : g
               printf "%5d MiB %10.3f %10.3f %10.3f %10.3f %10.3f %13.2f %14.2f %14.2f\n",
                      m, ft, fu, mt, ms, g, ft / best, fu / best, fu / ms }'
  done
  line="# rounds left out as disturbed (other processes > ${max_other}% CPU):"
  for sys in "${systems[@]}"; do line+=" $sys $(disturbed "$sys" bw)"; done
  echo "$line"
fi

if [[ $mode == lat || $mode == both ]]; then
  measure lat "$lat_iters" "$lat_warmup" 4096 4096
  echo
  echo "# 4 KiB allreduce time (us), median of $rounds rounds; iters $lat_iters, warmup $lat_warmup"
  printf '%8s %10s %10s %10s %10s %10s %14s %15s\n' size fleet-tcp fleet-unix mpi-tcp mpi-shm \
    gloo "tcp/mpi-tcp" "unix/mpi-tcp"
  v=()
  for sys in "${systems[@]}"; do v+=("$(med "$sys" 4096 4 lat)"); done
  awk -v ft="${v[0]}" -v fu="${v[1]}" -v mt="${v[2]}" -v ms="${v[3]}" -v g="${v[4]}" \
    'BEGIN { printf "%8s %10.1f %10.1f %10.1f %10.1f %10.1f %14.2f %15.2f\n",
                    "4 KiB", ft, fu, mt, ms, g, ft / mt, fu / mt }'
  line="# rounds left out as disturbed (other processes > ${max_other}% CPU):"
  for sys in "${systems[@]}"; do line+=" $sys $(disturbed "$sys" lat)"; done
  echo "$line"
fi

if [[ -n ${RAW:-} ]]; then
  { echo "# system round bytes time_us busbw_GBps mode other_cpu_pct"; cat "$raw"; } >"$RAW"
fi
