#!/usr/bin/env bash
# test-isa.sh - runs the tests labelled "numeric" (those whose checks compare trained accuracy
# or losses, or kernel results, and so depend on the kernels oneDNN and OpenBLAS pick for this
# CPU) a second time with both libraries held to an older instruction set than this machine's:
# what passes here then passes on the next CPU too. On an AVX-512 machine that is AVX2
# (ONEDNN_MAX_CPU_ISA=AVX2, OPENBLAS_CORETYPE=Haswell); on an AVX2 one AVX without FMA
# (ONEDNN_MAX_CPU_ISA=AVX, OPENBLAS_CORETYPE=Sandybridge: other kernels and, without fused
# multiply-adds, other roundings; SSE4.1's kernels are as different but make the pass 1.7x
# dearer: 148 against 95 CPU-s on the 2-core development machine); older CPUs skip it.
# FLEET_TEST_ISA="ONEDNN_ISA CORETYPE" chooses by hand, e.g. FLEET_TEST_ISA="SSE41 Nehalem".
# The tests run with FLEET_TEST_NUMERIC_ONLY=1: a CLI test then runs only its sections whose
# checks can depend on the kernels and prints one line naming those it leaves to the run on this
# CPU's kernels (make test's first pass; tests/cli/numeric_only_lib.sh); the unit tests ignore it.
# make test-isa runs it; make test runs it for the numeric tests that are not unit tests and
# runs the unit tests (the numeric ones among them) under the sanitizers with `--env`'s
# variables (scripts/run-tests.sh).
#   scripts/test-isa.sh BUILD_DIR [ctest options...]
#   scripts/test-isa.sh --env    prints the variables (NAME=VALUE ...; nothing where skipped)
set -euo pipefail
dir=${1:?usage: test-isa.sh BUILD_DIR [ctest options...] | --env}
shift
if [ -n "${FLEET_TEST_ISA:-}" ]; then
  read -r isa core <<<"$FLEET_TEST_ISA"
elif grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  isa=AVX2 core=Haswell
elif grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  isa=AVX core=Sandybridge
else
  [ "$dir" = --env ] && exit 0
  echo "test-isa: this CPU has no AVX2: pass 1 ran the older kernels already; skipped"
  exit 0
fi
# DNNL_MAX_CPU_ISA: the name oneDNN 2.x read before ONEDNN_MAX_CPU_ISA
vars=(ONEDNN_MAX_CPU_ISA=$isa DNNL_MAX_CPU_ISA=$isa OPENBLAS_CORETYPE=$core)
if [ "$dir" = --env ]; then
  echo "${vars[*]}"
  exit 0
fi
echo "test-isa: the numeric tests again with ONEDNN_MAX_CPU_ISA=$isa OPENBLAS_CORETYPE=$core" \
  "FLEET_TEST_NUMERIC_ONLY=1"
cd "$dir"
env "${vars[@]}" FLEET_TEST_NUMERIC_ONLY=1 ctest --output-on-failure -L numeric "$@"
