#!/bin/bash
# ps_scale.sh - parameter-server tables at scale (issue 33, benchmark c; bench/RESULTS.md
# "Parameter-server tables at scale"): a sparse table of dim 8 with Adagrad and life-cycle
# counters at 10^6, 10^7 and 10^8 rows over 2 forked server processes, one worker timing steps
# of 10^5 ids (pull, then push with counts). 10^8 rows need about 7 GB: skipped, saying so,
# when less than 12 GB are free. Waits for an idle machine first (bench/cpu_guard.sh).
#
#   bench/ps_scale.sh [build dir (build)] [steps (10)]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
steps=${2:-10}
bin=$build/bench/ps_scale
[ -x "$bin" ] || { echo "ps_scale.sh: $bin missing: cmake --build $build --target ps_scale" >&2; exit 1; }
# shellcheck source=bench/cpu_guard.sh
. "$here/cpu_guard.sh"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rows in 1e6 1e7 1e8; do
  if [ "$rows" = 1e8 ]; then
    free_gb=$(awk '/^MemAvailable:/ { printf "%d", $2 / 1048576 }' /proc/meminfo)
    if [ "$free_gb" -lt 12 ]; then
      echo "## rows $rows: skipped, $free_gb GB available (12 needed)"
      continue
    fi
  fi
  guard_wait_idle
  guard_begin
  start=$(date +%s)
  /usr/bin/time -f "peak RSS of the largest process (a server, or the worker): %M KiB" "$bin" "$rows" 2 "$steps" 100000
  guard_end
  echo "## rows $rows: wall $(( $(date +%s) - start )) s, other jobs used ${GUARD_OTHER_PCT}% of the CPU"
done
