# shellcheck shell=bash disable=SC2154
# dense_lib.sh - sourced by bench/dense_overlap.sh and bench/ddp_throughput.sh: waiting for the
# netlab to be free, bringing it up and down, and starting fleet-train jobs one worker per
# emulated host (or, with LOOPBACK=1, as local processes on 127.0.0.1: a dry run of the script
# with no lab, whose timings mean nothing).
#
# Callers set here (bench/) and build (the build directory), source this file, then call
# bench_start, which makes the scratch directory $work and the empty record file $raw.
#   LAB_WAIT_S=1800   how long lab_wait_free waits for another lab (fl-* namespaces) or another
#                     network benchmark to go away before giving up
#   LAB_QUIET_S=60    how long the machine must have been free of them, polled every 10 s
# Jobs run in the background and are waited for, so that SIGINT/SIGTERM stop a script at once
# (its EXIT trap takes the lab down, which stops what runs in it).

# shellcheck source=cpu_guard.sh
source "$here/cpu_guard.sh"

netlab=$here/netlab
fleetrun=$build/tools/fleetrun
fleet_train=$build/tools/fleet-train
loopback=${LOOPBACK:-0}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# a plain process must be a job of one: nothing of a launcher's environment may leak in
unset PADDLE_TRAINER_ID PADDLE_TRAINERS_NUM PADDLE_TRAINER_ENDPOINTS PADDLE_CURRENT_ENDPOINT \
  FLEET_LISTEN_FD RANK WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK PMI_RANK

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }

# lab_busy: the number of fl-* namespaces plus other network benchmarks (and their drivers,
# which pause between runs) running
lab_busy() {
  local ns procs
  ns=$(ip netns list 2>/dev/null | grep -c '^fl-' || true)
  procs=$(pgrep -c -f 'fleet-commbench|mpi_allreduce|gloo_allreduce|allreduce_peers\.sh|allreduce_netlab\.sh' || true)
  echo $((ns + procs))
}

lab_wait_free() {
  local limit=${LAB_WAIT_S:-1800} quiet=${LAB_QUIET_S:-60} waited=0 free_for=0
  ((loopback)) && return 0
  while ((free_for < quiet)); do
    if (($(lab_busy) == 0)); then
      free_for=$((free_for + 10))
    else
      ((free_for > 0 || waited == 0)) && echo "# lab in use by someone else (fl-* namespaces or a network benchmark); waiting" >&2
      free_for=0
    fi
    ((free_for >= quiet)) && break
    if ((waited >= limit)); then
      echo "$(basename "$0"): the lab stayed busy for ${limit}s; giving up" >&2
      return 1
    fi
    sleep 10
    waited=$((waited + 10))
  done
}

lab_mine=0
lab_up() { # N RATE
  ((loopback)) && return 0
  "$netlab" check >/dev/null || { echo "$(basename "$0"): netlab cannot run here (netlab check)" >&2; exit 77; }
  lab_mine=1
  "$netlab" up "$1" "$2" >&2
}

# only a lab this script brought up: never someone else's that it was waiting for
lab_down() {
  ((lab_mine)) || return 0
  "$netlab" down >/dev/null 2>&1 || true
  lab_mine=0
}

# kill_tree PID: SIGTERM to PID and its descendants (children first), by process id
kill_tree() {
  local c
  for c in $(pgrep -P "$1" || true); do kill_tree "$c"; done
  kill -TERM "$1" 2>/dev/null || true
}

# stop_jobs: what this script still runs (on SIGINT/SIGTERM), then the lab if it is ours
stop_jobs() {
  local c
  for c in $(pgrep -P $$ || true); do kill_tree "$c"; done
  lab_down
}

lab_ips() { # N -> comma-separated addresses of hosts 0..N-1
  local i ips=""
  for ((i = 0; i < $1; i++)); do ips+=${ips:+,}$("$netlab" addr "$i"); done
  echo "$ips"
}

# on_host I CMD...: CMD in host I's namespace (loopback: here)
on_host() {
  local i=$1; shift
  if ((loopback)); then "$@"; else "$netlab" exec "$i" "$@"; fi
}

# fleet_dist N PORT OUT ARGS...: one fleet-train job of N workers, one per host; rank 0's output
# in OUT (fleetrun's terminal, which shows rank 0's lines), the other hosts' in OUT.hI
fleet_dist() {
  local n=$1 port=$2 out=$3 i pids=() rc=0 token ips
  shift 3
  token=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  if ((loopback)); then
    FLEET_JOB_TOKEN=$token timeout 900 "$fleetrun" --nproc_per_node "$n" --log_dir "$out.log" \
      "$fleet_train" "$@" >"$out" 2>&1 || rc=$?
  else
    ips=$(lab_ips "$n")
    for ((i = 0; i < n; i++)); do
      FLEET_JOB_TOKEN=$token timeout 900 "$netlab" exec "$i" "$fleetrun" --ips "$ips" \
        --nproc_per_node 1 --started_port "$port" --log_dir "$out.log/h$i" \
        "$fleet_train" "$@" >"$([[ $i == 0 ]] && echo "$out" || echo "$out.h$i")" 2>&1 &
      pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  fi
  if ((rc != 0)); then
    echo "$(basename "$0"): fleet-train job of $n failed (exit $rc); rank 0 said:" >&2
    tail -20 "$out" >&2
    return 1
  fi
}

# fleet_solo N OUT ARGS...: N fleet-train jobs of one at the same time, job I on host I, output
# in OUT.I: the same processes, compute and CPU sharing as a job of N, without communication
fleet_solo() {
  local n=$1 out=$2 i pids=() rc=0
  shift 2
  for ((i = 0; i < n; i++)); do
    on_host "$i" timeout 900 "$fleet_train" "$@" >"$out.$i" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  if ((rc != 0)); then
    echo "$(basename "$0"): one of $n jobs of one failed (exit $rc):" >&2
    tail -5 "$out".* >&2
    return 1
  fi
}

# window_ms SKIP GLOBAL_BATCH FILE...: the step time (ms) of every progress window of rank 0 in
# FILEs after the first SKIP windows of each: global batch / ips (ips counts every rank's samples)
window_ms() {
  local skip=$1 gb=$2
  shift 2
  awk -v skip="$skip" -v gb="$gb" '
    FNR == 1 { w = 0 }
    /^worker_index: 0, .* ips / {
      for (i = 1; i <= NF; i++) if ($i == "ips") ips = $(i + 1)
      if (++w > skip && ips > 0) printf "%.3f\n", 1000 * gb / ips
    }' "$@"
}

# buckets OUT: "B buckets" from a run with FLEET_LOG_LEVEL=debug
buckets() { sed -n 's/.*strategy dense: \([0-9]*\) buckets of at most \([0-9.]*\) MiB.*/\1 buckets of <= \2 MiB/p' "$1" | head -1; }

# bench_start: the common start of a driver: fleetrun and fleet-train must be built; $work (a
# scratch directory) and $raw (an empty file in it) exist; on exit the jobs are stopped, the
# lab taken down if it is ours and $work removed; SIGINT / SIGTERM exit at once (130 / 143).
bench_start() {
  local name f
  name=$(basename "$0" .sh)
  for f in "$fleetrun" "$fleet_train"; do
    [[ -x $f ]] || { echo "$name.sh: $f not built (make build)" >&2; exit 1; }
  done
  work=$(mktemp -d "/tmp/$name.XXXXXX")
  trap 'stop_jobs; rm -rf "$work"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  raw=$work/raw
  : >"$raw"
}
