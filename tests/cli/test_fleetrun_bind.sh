#!/usr/bin/env bash
# test_fleetrun_bind.sh - fleetrun --bind_to core|none with a shell program as the worker that
# prints its own Cpus_allowed_list (/proc/PID/status) and OMP_NUM_THREADS:
#   core, 2 workers: the two sets are non-empty and disjoint, their union is fleetrun's own set,
#     each is the contiguous cut of fleetrun's CPUs (the first sets one CPU larger when they do
#     not divide), OMP_NUM_THREADS is its size; a preset OMP_NUM_THREADS is kept; a restart
#     (--max_restarts) binds the next round's workers the same way;
#   core under taskset: the cut is of fleetrun's own CPUs, not the machine's;
#   more workers than CPUs: refused before anything starts, naming both counts;
#   --bind_to socket: refused, naming the value; none (and the default): the mask is untouched.
# On a machine where this test may use a single CPU the cases with two disjoint sets cannot
# run: they are reported skipped (exit 77 when everything else passed).
# Ports: one node and no --started_port, so fleetrun binds free ports itself (FLEET_LISTEN_FD):
# nothing to collide with other tests.
set -u
run="${FLEET_BIN:?}/fleetrun"
[ -x "$run" ] || { echo "SKIPPED: fleetrun not built"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD FLEET_RESTART_COUNT OMP_NUM_THREADS
export FAIL_ROUND=none # the round in which worker 0 exits 3 (the restart case)
fail=0 skipped=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
skip() { echo "SKIPPED: $*"; skipped=1; }

expand() { # expand "0-2,5" -> "0 1 2 5"
  local part a c out=()
  local -a parts
  IFS=, read -ra parts <<<"$1"
  for part in "${parts[@]}"; do
    if [[ $part == *-* ]]; then
      a=${part%-*}
      for ((c = a; c <= ${part#*-}; c++)); do out+=("$c"); done
    elif [ -n "$part" ]; then
      out+=("$part")
    fi
  done
  echo "${out[*]}"
}
cut_sets() { # cut_sets N CPU... -> N lines: fleetrun's contiguous cut
  local n=$1 i k=0 size
  shift
  local cpus=("$@") m=$#
  for ((i = 0; i < n; i++)); do
    size=$((m / n + (i < m % n ? 1 : 0)))
    echo "${cpus[*]:k:size}"
    k=$((k + size))
  done
}
words() { wc -w <<<"$1" | tr -d ' '; }
disjoint() { # disjoint "SET" "SET": no CPU in both
  [ -z "$(comm -12 <(tr ' ' '\n' <<<"$1" | sort) <(tr ' ' '\n' <<<"$2" | sort))" ]
}
same_set() { # same_set "SET" "SET": the same CPUs, whatever the order
  [ "$(tr ' ' '\n' <<<"$1" | sort -n | xargs)" = "$(tr ' ' '\n' <<<"$2" | sort -n | xargs)" ]
}

# the worker: its own mask and OMP_NUM_THREADS, one line "cpus=LIST omp=N|unset"
prog='echo "cpus=$(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/$$/status)" \
  "omp=${OMP_NUM_THREADS-unset}"; [ "${FAIL_ROUND-}" = "${FLEET_RESTART_COUNT-}" ] && \
  [ "$LOCAL_RANK" = 0 ] && exit 3; exit 0'
field() { # field LOG NAME [LINE]: NAME's value on the LINE-th worker line (default: the last)
  grep "^cpus=" "$1" | sed -n "${3:-\$}p" | tr ' ' '\n' | sed -n "s/^$2=//p"
}
launch() { # launch NAME FLEETRUN-ARGS...: output in $tmp/NAME.out, logs in $tmp/NAME/
  local name=$1; shift
  timeout 60 "$run" --log_dir "$tmp/$name" "$@" >"$tmp/$name.out" 2>&1
}

own_list=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
read -ra own <<<"$(expand "$own_list")"
ncpu=${#own[@]}
echo "this test may run on $ncpu CPU(s): $own_list"
check "fleetrun's own CPUs read" test "$ncpu" -ge 1

# 1. core, 2 workers: disjoint sets cut from fleetrun's, OMP_NUM_THREADS = each set's size
if [ "$ncpu" -ge 2 ]; then
  mapfile -t want < <(cut_sets 2 "${own[@]}")
  launch core --bind_to core --nproc_per_node 2 sh -c "$prog"
  check "core: exit 0" test $? -eq 0
  check "core: said where each worker runs" grep -q "^fleetrun: --bind_to core: worker 0 on CPU" "$tmp/core.out"
  s0=$(expand "$(field "$tmp/core/workerlog.0" cpus)")
  s1=$(expand "$(field "$tmp/core/workerlog.1" cpus)")
  echo "worker 0 on: $s0; worker 1 on: $s1; fleetrun's cut: ${want[0]} | ${want[1]}"
  check "core: worker 0's set non-empty" test -n "$s0"
  check "core: worker 1's set non-empty" test -n "$s1"
  check "core: the sets are disjoint" disjoint "$s0" "$s1"
  check "core: their union is fleetrun's own set" same_set "$s0 $s1" "${own[*]}"
  check "core: worker 0 got the first contiguous cut" same_set "$s0" "${want[0]}"
  check "core: worker 1 got the second contiguous cut" same_set "$s1" "${want[1]}"
  check "core: OMP_NUM_THREADS of worker 0 = its $(words "$s0") CPU(s)" \
    test "$(field "$tmp/core/workerlog.0" omp)" = "$(words "$s0")"
  check "core: OMP_NUM_THREADS of worker 1 = its $(words "$s1") CPU(s)" \
    test "$(field "$tmp/core/workerlog.1" omp)" = "$(words "$s1")"

  # 2. OMP_NUM_THREADS preset: kept
  OMP_NUM_THREADS=5 launch omp --bind-to core --nproc_per_node 2 sh -c "$prog"
  check "preset OMP_NUM_THREADS: exit 0" test $? -eq 0
  for i in 0 1; do
    check "preset OMP_NUM_THREADS: kept by worker $i" test "$(field "$tmp/omp/workerlog.$i" omp)" = 5
  done
  check "preset OMP_NUM_THREADS: worker 1 still bound" \
    same_set "$(expand "$(field "$tmp/omp/workerlog.1" cpus)")" "${want[1]}"

  # 3. a restart binds the next round the same way: worker 0 fails in round 0
  FAIL_ROUND=0 launch restart --bind_to core --max_restarts 1 \
    --nproc_per_node 2 sh -c "$prog"
  check "restart: exit 0 after one restart" test $? -eq 0
  check "restart: restarted" grep -q "restart 1 of 1" "$tmp/restart.out"
  for i in 0 1; do
    check "restart: worker $i ran twice" test "$(grep -c '^cpus=' "$tmp/restart/workerlog.$i")" = 2
    for line in 1 2; do
      check "restart: worker $i bound to its cut in round $((line - 1))" \
        same_set "$(expand "$(field "$tmp/restart/workerlog.$i" cpus "$line")")" "${want[$i]}"
    done
  done
else
  skip "two workers on disjoint CPU sets, preset OMP_NUM_THREADS, restart: this test may run on one CPU only"
fi

# 4. the cut is of fleetrun's own CPUs (taskset), and so is the refusal
if command -v taskset >/dev/null; then
  last=${own[$((ncpu - 1))]}
  timeout 60 taskset -c "$last" "$run" --log_dir "$tmp/ts" --bind_to core sh -c "$prog" \
    >"$tmp/ts.out" 2>&1
  check "taskset -c $last, core, 1 worker: exit 0" test $? -eq 0
  check "taskset -c $last: the worker runs on CPU $last" test "$(field "$tmp/ts/workerlog.0" cpus)" = "$last"
  check "taskset -c $last: OMP_NUM_THREADS=1" test "$(field "$tmp/ts/workerlog.0" omp)" = 1
  timeout 60 taskset -c "$last" "$run" --log_dir "$tmp/ts2" --bind_to core --nproc_per_node 2 \
    true >"$tmp/ts2.out" 2>&1
  check "taskset -c $last, core, 2 workers: refused (exit 2)" test $? -eq 2
  check "taskset -c $last, 2 workers: names both counts" \
    grep -q "fleetrun: error: --bind_to core: 2 workers but fleetrun may run on 1 CPU(s) ($last)" "$tmp/ts2.out"
else
  skip "taskset not found: the cut of a narrower mask"
fi

# 5. more workers than CPUs: refused before anything starts, naming both counts
n=$((ncpu + 1))
launch over --bind_to core --nproc_per_node "$n" sh -c 'echo started'
check "core, $n workers on $ncpu CPU(s): exit 2" test $? -eq 2
check "core, $n workers: names both counts" \
  grep -q "fleetrun: error: --bind_to core: $n workers but fleetrun may run on $ncpu CPU(s)" "$tmp/over.out"
check "core, $n workers: no worker started" test ! -e "$tmp/over/workerlog.0"
check "core, $n workers: the same with none runs" \
  launch over_none --bind_to none --nproc_per_node "$n" true

# 6. a bad value: refused, named
launch bad --bind_to socket true
check "--bind_to socket: exit 2" test $? -eq 2
check "--bind_to socket: names the value" grep -q "fleetrun: error: --bind_to: 'socket' is not core or none" "$tmp/bad.out"
launch bad2 --bind-to= true
check "--bind-to '': exit 2" test $? -eq 2
check "--help: --bind_to documented" bash -c "'$run' --help | grep -q -- '--bind_to, --bind-to core|none'"

# 7. none, and the default: the mask untouched, OMP_NUM_THREADS not set
for how in none default; do
  args=(--bind_to none)
  [ $how = default ] && args=()
  launch "$how" "${args[@]}" --nproc_per_node 2 sh -c "$prog"
  check "$how: exit 0" test $? -eq 0
  check "$how: nothing said about binding" bash -c "! grep -q 'bind_to core' '$tmp/$how.out'"
  for i in 0 1; do
    check "$how: worker $i may run on fleetrun's CPUs" \
      same_set "$(expand "$(field "$tmp/$how/workerlog.$i" cpus)")" "${own[*]}"
    check "$how: worker $i has no OMP_NUM_THREADS" test "$(field "$tmp/$how/workerlog.$i" omp)" = unset
  done
done

[ $fail -ne 0 ] && exit 1
[ $skipped -ne 0 ] && exit 77
exit 0
