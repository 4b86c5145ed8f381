# shellcheck shell=bash disable=SC2034  # GUARD_OTHER_PCT is read by the sourcing script
# cpu_guard.sh - sourced by the bench drivers: waiting for an idle machine before a timed job,
# and measuring how much CPU something other than the job used while it ran. On a shared
# 2-core machine one compile or test run beside a benchmark halves its numbers; rounds are
# medians, and these make the disturbance visible (and avoidable) instead of silent.
#
#   guard_wait_idle            block until the machine looks idle: under GUARD_IDLE_PCT (default
#                              5) percent of all cores busy over 1 s, for at most GUARD_WAIT_S
#                              (default 300) seconds; then warn and go on
#   guard_begin; JOB; guard_end   sets GUARD_OTHER_PCT: the CPU time used during JOB by anything
#                              but this shell's waited-for descendants and the kernel's threads
#                              (ksoftirqd), in percent of all cores over JOB's wall time; and
#                              GUARD_JOB_PCT: what the job (with the kernel's threads) used, the
#                              same way (near 100: the job kept every core busy), and in CPU
#                              seconds GUARD_JOB_CPU_S, over GUARD_WALL_S seconds of wall time
# Linux only (/proc/stat and /proc/$$/stat, both in clock ticks).

_guard_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }
# shell PID's children's user+system ticks (descendants that were waited for, recursively), plus
# every kernel thread's (ksoftirqd does much of a network job's packet processing)
_guard_mine() {
  { cat "/proc/$1/stat"; cat /proc/[0-9]*/stat 2>/dev/null || true; } |
    awk '{ sub(/^.*\) /, "") }
         NR == 1 { t += $14 + $15; next }
         $2 == 2 { t += $12 + $13 }
         END { print t }'
}
_guard_now() { awk '{ print $1 }' /proc/uptime; }
_guard_ncpu=$(getconf _NPROCESSORS_ONLN)
_guard_hz=$(getconf CLK_TCK)

guard_wait_idle() {
  local limit=${GUARD_WAIT_S:-300} pct=${GUARD_IDLE_PCT:-5} waited=0 b0 b1 busy
  while :; do
    b0=$(_guard_busy); sleep 1; b1=$(_guard_busy)
    busy=$(awk -v d=$((b1 - b0)) -v n="$_guard_ncpu" -v hz="$_guard_hz" 'BEGIN { printf "%.0f", 100 * d / (n * hz) }')
    ((busy < pct)) && return 0
    if ((waited >= limit)); then
      echo "# cpu_guard: machine still ${busy}% busy after ${waited}s of waiting; going on" >&2
      return 0
    fi
    ((waited == 0)) && echo "# cpu_guard: machine ${busy}% busy; waiting for it to go idle" >&2
    sleep 2
    waited=$((waited + 3))
  done
}

# (BASHPID, not $$: the shell that runs the job, also when it is a subshell)
guard_begin() { _g_pid=$BASHPID; _g_b0=$(_guard_busy); _g_m0=$(_guard_mine "$_g_pid"); _g_t0=$(_guard_now); }

guard_end() {
  local b1 m1 t1
  b1=$(_guard_busy); m1=$(_guard_mine "$_g_pid"); t1=$(_guard_now)
  read -r GUARD_OTHER_PCT GUARD_JOB_PCT GUARD_JOB_CPU_S GUARD_WALL_S < <(awk \
    -v b=$((b1 - _g_b0)) -v m=$((m1 - _g_m0)) -v t0="$_g_t0" -v t1="$t1" -v n="$_guard_ncpu" \
    -v hz="$_guard_hz" 'BEGIN {
      o = b - m; if (o < 0) o = 0; w = t1 - t0; if (w <= 0) w = 0.01
      printf "%.0f %.0f %.2f %.2f\n", 100 * o / (n * hz * w), 100 * m / (n * hz * w), m / hz, w }')
}
