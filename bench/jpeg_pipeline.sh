#!/usr/bin/env bash
# jpeg_pipeline.sh - images per second (and per core) of fleet's ImageNet training pipeline:
# read + libjpeg-turbo decode (DCT-scaled when the crop allows) + random resized crop + flip +
# normalise to 3 x 224 x 224, beside libjpeg-turbo's decode-only speed (full size, from memory)
# on the same JPEGs, on 1 thread and 2 worker threads. Each cell is the median of ROUNDS rounds
# over IMAGES JPEGs of 500 x 375 at quality 90 made once under DIR.
# Usage: bench/jpeg_pipeline.sh [BUILD_DIR]    (ROUNDS=5 IMAGES=200 DIR=/tmp/fl_jpeg_bench)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
bin="$build/bench/jpeg_pipeline"
rounds=${ROUNDS:-5}
images=${IMAGES:-200}
dir=${DIR:-/tmp/fl_jpeg_bench}
[[ -x "$bin" ]] || { echo "jpeg_pipeline.sh: $bin not built (make build)" >&2; exit 1; }
# shellcheck source=cpu_guard.sh
source "$here/cpu_guard.sh"

echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(getconf _NPROCESSORS_ONLN) cores; libjpeg-turbo $(pkg-config --modversion libjpeg 2>/dev/null || echo '?')"
guard_wait_idle
guard_begin
out=$("$bin" "$dir" "$images" "$rounds")
guard_end
echo "$out" | grep '^#'
printf '%-52s %7s %9s %11s %17s %14s\n' path threads "img/s" "img/s/core" "range img/s" "img/CPU-s"
echo "$out" | grep -v '^#' | while read -r what threads med lo hi cpu; do
  case $what in
    decode_only)      name="libjpeg-turbo decode only (full size)";;
    pipeline_inline)  name="pipeline, loader without workers (caller's thread)";;
    pipeline_workers) name="pipeline, loader with $threads worker thread(s)";;
    *)                name=$what;;
  esac
  awk -v n="$name" -v t="$threads" -v m="$med" -v lo="$lo" -v hi="$hi" -v c="$cpu" 'BEGIN {
    printf "%-52s %7d %9.1f %11.1f %8.1f-%-8.1f %14.1f\n", n, t, m, m / t, lo, hi, c }'
done
echo "# ${rounds} rounds each, medians; pipeline = read + decode + crop + flip + normalise to 224"
echo "# img/s/core = wall-clock img/s over threads; img/CPU-s = images over the process's CPU seconds"
printf '# other processes used %s%% of all cores during the run (noise: a shared machine)\n' "$GUARD_OTHER_PCT"
