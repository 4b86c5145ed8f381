#!/bin/bash
# run_fuzz.sh BIN CORPUS - runs the libFuzzer target BIN for FUZZ_SECONDS (default 15) over a
# scratch copy of the seed corpus, so inputs it discovers stay out of the source tree; a crash
# leaves its input as fuzz-crash-* in the working directory. Exit 77 (skipped) without BIN.
bin=$1
corpus=$2
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "SKIPPED: no clang with libFuzzer to build the fuzz target"
    exit 77
fi
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
cp "$corpus"/* "$work"/
"$bin" -max_total_time="${FUZZ_SECONDS:-15}" -runs=20000000 -timeout=10 -rss_limit_mb=2048 \
    -max_len=4096 -print_final_stats=1 -artifact_prefix="$PWD/fuzz-" "$work"
