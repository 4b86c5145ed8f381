#!/usr/bin/env bash
# shm_allreduce.sh - fleet's shared-memory transport beside OpenMPI's shared-memory path: 2 ranks
# on this host, f32 sum in place, 4 KiB (latency) and 64 MiB (bandwidth), timed the same way
# (WARMUP untimed allreduces, barrier, ITERS timed ones; time = mean per allreduce, max over
# ranks; busbw = 2(n-1)/n x bytes / time, GB = 1e9 bytes). Issue "Fast inside the node": target
# fleet-shm <= 1.0x mpi-shm's time at 4 KiB and >= 1.2x its busbw at 64 MiB.
#
# Systems (one 2-rank job per system and size, alternated within every round, the order rotated
# per round):
#   fleet-shm   build/tests/test_shm --bench --bind_to core: 2 forked ranks over src/comm/shm.c
#               (allreduce as the tcp backend picks it: recursive doubling up to 256 KiB, ring
#               above), bound by fleetrun --bind_to core's rule: this script's CPUs cut into 2
#               contiguous halves, rank 0 on the first, rank 1 on the second (2 CPUs: rank 0 on
#               CPU 0, rank 1 on CPU 1; test_shm prints the sets as a "#" line)
#   mpi-shm     mpirun -np 2 --bind-to core --mca btl vader,self build/bench/mpi_allreduce:
#               mpirun's own default for 2 ranks, given explicitly (rank 0 on core 0, rank 1
#               on core 1: --report-bindings); like for like with fleet-shm
#   fleet-shm-unbound  test_shm --bench without binding, as fleet-shm ran before fleetrun had
#               --bind_to: the scheduler may put both ranks on one core (context)
#   mpi-shm-unbound  mpirun --bind-to none, as this script ran mpi-shm before (the shared-
#               memory table of bench/RESULTS.md, 2026-11-25, set the two unbound systems side
#               by side); run only when named in SYSTEMS
#   fleet-unix  fleetrun --nproc_per_node 2 fleet-commbench with FLEET_COMM_SHM=0 (unix
#               sockets, not bound; context only; without FLEET_COMM_SHM=0 the tcp backend
#               would use shared memory too)
# Why fleet-shm binds inside test_shm rather than run under fleetrun --bind_to core: test_shm
# --bench forks its ranks from one process, which fleetrun would start as one worker bound to
# every CPU (both ranks free to share a core); and fleetrun --bind_to core --nproc_per_node 2
# fleet-commbench does run over shared memory, but it also times the communicator's request
# queue and comm thread, not the transport and algorithms alone that mpi_allreduce is set
# against. So test_shm --bench --bind_to core binds its forked ranks itself, by the same rule.
#
# Usage: bench/shm_allreduce.sh [BUILD_DIR]
#   ROUNDS=5                          rounds; the tables give medians over them
#   LAT_ITERS=5000 LAT_WARMUP=500     timed / warm-up allreduces at 4 KiB
#   BW_ITERS=20 BW_WARMUP=5           the same at 64 MiB
#   SYSTEMS="fleet-shm mpi-shm fleet-shm-unbound fleet-unix"
#   RAW=FILE                          also write every single measurement there
#   GUARD_MAX_OTHER=10 GUARD_RETRIES=5  a job during which other processes used more than
#                    GUARD_MAX_OTHER % of the cores runs again (bench/cpu_guard.sh)
set -euo pipefail
trap 'echo "$(basename "$0"): failed at line $LINENO: $BASH_COMMAND" >&2' ERR
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
rounds=${ROUNDS:-5}
lat_iters=${LAT_ITERS:-5000} lat_warmup=${LAT_WARMUP:-500}
bw_iters=${BW_ITERS:-20} bw_warmup=${BW_WARMUP:-5}
read -r -a systems <<<"${SYSTEMS:-fleet-shm mpi-shm fleet-shm-unbound fleet-unix}"
max_other=${GUARD_MAX_OTHER:-10} retries=${GUARD_RETRIES:-5}
shmbench=$build/tests/test_shm
mpibench=$build/bench/mpi_allreduce
fleetrun=$build/tools/fleetrun
commbench=$build/tools/fleet-commbench
# shellcheck source=SCRIPTDIR/cpu_guard.sh
source "$here/cpu_guard.sh"

for sys in "${systems[@]}"; do
  case $sys in
    fleet-shm | fleet-shm-unbound) need=("$shmbench") ;;
    mpi-shm | mpi-shm-unbound) need=("$mpibench")
      command -v mpirun >/dev/null || { echo "shm_allreduce.sh: mpirun not found" >&2; exit 1; } ;;
    fleet-unix) need=("$fleetrun" "$commbench") ;;
    *) echo "shm_allreduce.sh: unknown system $sys" >&2; exit 1 ;;
  esac
  for f in "${need[@]}"; do
    [[ -x $f ]] || { echo "shm_allreduce.sh: $f not built (make build; mpi_allreduce needs MPI)" >&2; exit 1; }
  done
done

work=$(mktemp -d /tmp/shm_allreduce.XXXXXX)
trap 'rm -rf "$work"' EXIT
raw=$work/raw # system round bytes time_us busbw other_cpu_pct
: >"$raw"

# run_one SYSTEM BYTES ITERS WARMUP -> "bytes time_us busbw" on stdout
run_one() {
  local sys=$1 bytes=$2 iters=$3 warmup=$4 out=$work/out
  case $sys in
    fleet-shm | fleet-shm-unbound)
      local bind=core
      [[ $sys == fleet-shm-unbound ]] && bind=none
      timeout 600 env -u FLEET_SHM_RING_KIB -u FLEET_COMM_SPIN_US "$shmbench" --bench -p 2 \
        --bind_to "$bind" -n "$iters" -w "$warmup" -r 1 "$bytes" >"$out" 2>&1 ||
        { cat "$out" >&2; return 1; }
      awk '$1 ~ /^[0-9]+$/ && NF == 5 { print $1, $3, $5 }' "$out" ;;
    mpi-shm | mpi-shm-unbound)
      local bind=core
      [[ $sys == mpi-shm-unbound ]] && bind=none
      timeout 600 mpirun --allow-run-as-root --oversubscribe --bind-to "$bind" -np 2 \
        --mca btl vader,self "$mpibench" -n "$iters" -w "$warmup" -r 1 "$bytes" >"$out" 2>&1 ||
        { cat "$out" >&2; return 1; }
      awk '$1 ~ /^[0-9]+$/ && NF == 5 { print $1, $3, $5 }' "$out" ;;
    fleet-unix)
      timeout 600 env -u FLEET_COMM_LOCAL -u FLEET_TCP_RD_MAX_BYTES -u FLEET_TCP_SEG_MAX_BYTES \
        -u FLEET_TCP_RH_MIN_RANKS -u FLEET_TCP_RH_MIN_BYTES -u FLEET_TCP_RH_MAX_BYTES \
        -u FLEET_TCP_BRUCK_MAX_BYTES FLEET_COMM_SHM=0 \
        "$fleetrun" --nproc_per_node 2 --log_dir "$work/log" "$commbench" -b "$bytes" \
        -e "$bytes" -f 2 -n "$iters" -w "$warmup" -c 0 >"$out" 2>&1 || { cat "$out" >&2; return 1; }
      awk '$1 ~ /^[0-9]+$/ && NF >= 9 { print $1, $6, $8 }' "$out" ;;
  esac
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }
# med SYSTEM BYTES FIELD(4 = time_us, 5 = busbw): median over undisturbed rounds (all if none)
med() {
  local rows
  rows=$(awk -v s="$1" -v b="$2" -v mx="$max_other" '$1 == s && $3 == b && $6 <= mx' "$raw")
  [[ -n $rows ]] || rows=$(awk -v s="$1" -v b="$2" '$1 == s && $3 == b' "$raw")
  awk -v f="$3" '{ print $f }' <<<"$rows" | median
}

echo "# shm_allreduce: 2 ranks on $(hostname), $(nproc) cores, f32 sum in place, fleet-shm and" \
  "mpi-shm bound one rank to a core, ROUNDS=$rounds," \
  "$(date -u +%Y-%m-%dT%H:%MZ)"
for ((r = 0; r < rounds; r++)); do
  for ((k = 0; k < ${#systems[@]}; k++)); do
    sys=${systems[(r + k) % ${#systems[@]}]}
    for spec in "4096 $lat_iters $lat_warmup" "$((64 << 20)) $bw_iters $bw_warmup"; do
      read -r bytes iters warmup <<<"$spec"
      for ((try = 0; ; try++)); do
        guard_wait_idle
        guard_begin
        run_one "$sys" "$bytes" "$iters" "$warmup" >"$work/rows"
        guard_end
        ((GUARD_OTHER_PCT <= max_other || try >= retries)) && break
        echo "# round $((r + 1)) $sys $bytes: other processes took ${GUARD_OTHER_PCT}% of the CPU; again" >&2
      done
      while read -r b t bw; do
        echo "$sys $r $b $t $bw $GUARD_OTHER_PCT" >>"$raw"
      done <"$work/rows"
    done
  done
  echo "# round $((r + 1))/$rounds done" >&2
done

echo
echo "# medians of $rounds rounds; 4 KiB: iters $lat_iters, warmup $lat_warmup; 64 MiB: iters" \
  "$bw_iters, warmup $bw_warmup"
printf '%-18s %14s %16s\n' system "4KiB time_us" "64MiB busbw_GBps"
declare -A lat bw
for sys in "${systems[@]}"; do
  lat[$sys]=$(med "$sys" 4096 4)
  bw[$sys]=$(med "$sys" $((64 << 20)) 5)
  printf '%-18s %14.2f %16.3f\n' "$sys" "${lat[$sys]}" "${bw[$sys]}"
done
if [[ -n ${lat[fleet-shm]:-} && -n ${lat[mpi-shm]:-} ]]; then
  awk -v fl="${lat[fleet-shm]}" -v ml="${lat[mpi-shm]}" -v fb="${bw[fleet-shm]}" -v mb="${bw[mpi-shm]}" \
    'BEGIN { printf "fleet-shm / mpi-shm: 4 KiB time %.2fx (target <= 1.0), 64 MiB busbw %.2fx (target >= 1.2)\n",
                    fl / ml, fb / mb }'
fi
line="# jobs left disturbed (other processes > ${max_other}% CPU):"
for sys in "${systems[@]}"; do
  line+=" $sys $(awk -v s="$sys" -v mx="$max_other" '$1 == s && $6 > mx' "$raw" | wc -l)"
done
echo "$line"
if [[ -n ${RAW:-} ]]; then
  { echo "# system round bytes time_us busbw_GBps other_cpu_pct"; cat "$raw"; } >"$RAW"
fi
