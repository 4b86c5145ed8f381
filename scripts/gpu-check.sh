#!/usr/bin/env bash
# gpu-check.sh - everything fleet checks on a GPU machine, in one command (machines are lent
# for minutes: one call does it all). Brings the build libraries from DEBS (scripts/gpu-deps.sh)
# where the machine lacks them, configures without oneDNN for the machine's GPU architecture,
# builds, and runs the GPU tests (the cuda and nccl unit tests, test_fleet_train_gpu.sh), each
# log under OUT; with --bench also bench/gpu_step.sh (at batch 64 the AMP float16 and bfloat16
# rows first, fleet with the cuda table's low dtypes (FLEET_CUDA_LOW_DTYPES=1; its last column
# says native or emulated), then f32 and TF32; deterministic and fast, beside PyTorch; DGC's
# share), after the unit tests and before the slower training test, so that a run cut short by
# the machine's 10-minute limit still brings the table, the rows not measured before first.
# The bench's knobs (PRECISIONS, BATCHES, ROUNDS, REPEATS, ITERS) pass through; its defaults
# here (batch 256 only with BATCHES="64 256") fit the whole command in about 8 minutes on an
# H100.
#   scripts/gpu-check.sh DEBS OUT [--bench]      (DEBS: scripts/gpu-deps.sh download DEBS)
# --profile adds bench/gpu_profile.sh's table of a step at batch 64 (ncu) after the bench, for
# each of PROFILE (default tf32; also f32, tf32nhwc, f16, bf16).
# --accuracy adds bench/amp_accuracy.sh on Fashion-MNIST's recipe (configs/fashion_resnet.yaml,
# one worker at batch 128, the quality table's global batch) on the GPU: f32, then float16 and
# bfloat16 natively (FLEET_CUDA_LOW_DTYPES=1); the data from /usr/share/datasets, or from
# Debian's dataset-fashion-mnist .deb in DEBS (GPU_DEPS_DATA=1 scripts/gpu-deps.sh download).
# GPU_CHECK_BUDGET=SECONDS (default 560) fits the whole command in a lease: each step's limit
# is cut to what is left of it, and a step that would start with less than 20 s left is
# skipped and said so ("skipped (time)"), its log naming why; GPU_CHECK_TRAIN=0 leaves out the
# training test.
# GPU_CHECK_TAR=1 packs OUT into OUT.tgz at the end (the device tool brings back 8 files):
#   GPU_CHECK_TAR=1 bash scripts/gpu-check.sh .debs "$OUT/l" --bench > "$OUT/check.txt" 2>&1
# Prints one line per step with its exit status (77: skipped, no GPU); exits non-zero when a
# test failed.
set -uo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 DEBS OUT [--bench] [--profile] [--accuracy]" >&2; exit 2; }
src=$(cd "$(dirname "$0")/.." && pwd)
debs=$1 out=$2
shift 2
bench="" profile="" accuracy=""
for a in "$@"; do
  case $a in
    --bench) bench=--bench ;;
    --profile) profile=--profile ;;
    --accuracy) accuracy=--accuracy ;;
    *) echo "$0: unknown option $a" >&2; exit 2 ;;
  esac
done
budget=${GPU_CHECK_BUDGET:-560}
build=${FLEET_GPU_BUILD:-/tmp/fleet-gpu-build}
mkdir -p "$out"
if ! pkg-config --exists yaml-0.1 libjpeg 2>/dev/null; then
  eval "$(bash "$src/scripts/gpu-deps.sh" unpack "$debs" /tmp/fleet-sysroot)" || exit 1
fi
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/{cudnn,nccl}/lib; do
  [[ -d $d ]] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
command -v nvidia-smi >/dev/null && nvidia-smi -L | head -1
step() { # step NAME TIMEOUT COMMAND...: runs it with its log in OUT/NAME.log
  local name=$1 limit=$2 t0=$SECONDS left=$((budget - SECONDS))
  shift 2
  if ((left < 20)); then
    echo "skipped: ${left} s of GPU_CHECK_BUDGET=$budget left" >"$out/$name.log"
    echo "$name: skipped (time)"
    return 0
  fi
  ((limit > left)) && limit=$left
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc ($((SECONDS - t0)) s)"
  return $rc
}
step configure 300 cmake -S "$src" -B "$build" -DFLEET_ONEDNN=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" || { tail -20 "$out/configure.log"; exit 1; }
grep 'fleet:' "$out/configure.log"
step build 300 cmake --build "$build" -j"$(nproc)" || { grep -m5 error "$out/build.log"; exit 1; }
fail=0
verdict() { [[ $1 -eq 0 || $1 -eq 77 ]] || fail=1; } # 77: skipped (no GPU)
for t in test_cuda_device test_cuda_convert test_comm_nccl_open test_cuda_backend test_nccl \
  test_fastdiv test_optim test_dgc_batch; do
  (cd "$build/tests" && step "$t" 120 "./$t")
  verdict $?
done
(cd "$build/tests" && FLEET_CUDNN_BENCHMARK=1 step test_cuda_backend_find 120 ./test_cuda_backend)
verdict $?
(cd "$build/tests" && FLEET_CUDNN_DETERMINISTIC=0 step test_cuda_backend_fast 120 ./test_cuda_backend)
verdict $?
if [[ $bench == --bench ]]; then
  PRECISIONS=${PRECISIONS-f16 bf16 f32 tf32} BATCHES=${BATCHES:-64} ROUNDS=${ROUNDS:-1} \
    REPEATS=${REPEATS:-3} ITERS=${ITERS:-5} step gpu_step 420 bash "$src/bench/gpu_step.sh" "$build"
  cat "$out/gpu_step.log"
fi
if [[ $profile == --profile ]]; then
  for p in ${PROFILE:-tf32}; do
    step "gpu_profile_$p" 150 bash "$src/bench/gpu_profile.sh" "$build" 64 "$p"
    cat "$out/gpu_profile_$p.log"
  done
fi
if [[ $accuracy == --accuracy ]]; then
  fm=/usr/share/datasets/fashion-mnist
  if [[ ! -f $fm/t10k-labels-idx1-ubyte.gz ]]; then
    fm=/tmp/fleet-data/usr/share/datasets/fashion-mnist
    for d in "$debs"/dataset-fashion-mnist_*.deb; do
      [[ -f $d ]] && dpkg-deb -x "$d" /tmp/fleet-data
    done
  fi
  if [[ -f $fm/t10k-labels-idx1-ubyte.gz ]]; then
    CONFIG="$src/configs/fashion_resnet.yaml" NPROC=1 FLEET_CUDA_LOW_DTYPES=1 \
      EXTRA="-o train.device=gpu -o train.batch_size=128 -o data.root=$fm" \
      step amp_accuracy 240 bash "$src/bench/amp_accuracy.sh" "$build"
    cat "$out/amp_accuracy.log"
  else
    echo "amp_accuracy: skipped (no Fashion-MNIST: GPU_DEPS_DATA=1 scripts/gpu-deps.sh download DEBS)"
  fi
fi
if [[ ${GPU_CHECK_TRAIN:-1} != 0 ]]; then
  FLEET_BIN=$build/tools FLEET_BUILD=$build FLEET_SRC=$src OMP_NUM_THREADS=4 \
    step test_fleet_train_gpu 300 bash "$src/tests/cli/test_fleet_train_gpu.sh"
  verdict $?
fi
grep -hE '^FAIL|FAILED' "$out"/test_*.log | head -20
if [[ ${GPU_CHECK_TAR:-0} == 1 ]]; then
  tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")" && rm -rf "$out"
fi
exit $fail
