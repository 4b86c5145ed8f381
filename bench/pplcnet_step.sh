#!/usr/bin/env bash
# pplcnet_step.sh - training-step time (forward, cross-entropy, backward, Momentum 0.9 with
# weight decay 1e-4) of PaddleClas's CPU models in fleet (bench/cnn_step, the zoo's networks)
# beside PyTorch 1.13 (Debian's python3-torch, only ever /usr/bin/python3;
# bench/pplcnet_step_torch.py writes the same networks out, NCHW and channels-last), same
# model, input, batch, thread count and optimizer, f32, 1000 classes, measured in the same run,
# the programs alternating: PP-LCNet x1.0 and x0.25, PP-LCNetV2-base (training form) and
# PP-HGNet-tiny at batch 32: PP-LCNet at 224 x 224, and every model at 96 x 96 with the
# ImageNet stem (at 224 a step of PP-LCNetV2 takes 3-5 s and one of PP-HGNet-tiny over 10 s on
# 2 cores, too long for a run of 10 minutes; ROWS="pplcnetv2@224" adds it).
# Each process runs WARMUP untimed steps, then REPEATS timed single steps, or more (up to 64)
# until MIN_SECONDS are timed (a short step is sampled more), and reports their median (wall
# ms); a cell is the median over ROUNDS such processes (the programs alternate
# within each round, so that a burst of load on a shared machine hits both sides). ratio = the faster PyTorch
# layout's ms / fleet's ms (> 1: fleet faster). The params columns are each side's trainable
# parameter count: equal when the networks match.
# Usage: bench/pplcnet_step.sh [BUILD_DIR]
#   ROUNDS=2 WARMUP=2 REPEATS=5 MIN_SECONDS=4 THREADS=2 BACKENDS="onednn" ROWS="pplcnet_x1_0@224 ..."
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
fleet="$build/bench/cnn_step"
torch_py="$here/pplcnet_step_torch.py"
rounds=${ROUNDS:-2}
warmup=${WARMUP:-2}
repeats=${REPEATS:-5}
min_s=${MIN_SECONDS:-4}
threads=${THREADS:-2}
batch=${BATCH:-32}
read -r -a backends <<<"${BACKENDS:-onednn}"
read -r -a rows <<<"${ROWS:-pplcnet_x1_0@224 pplcnet_x0_25@224 pplcnet_x1_0@96 pplcnet_x0_25@96 pplcnetv2@96 pphgnet_tiny@96}"
[[ -x "$fleet" ]] || { echo "pplcnet_step.sh: $fleet not built (make build)" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "pplcnet_step.sh: PyTorch not importable by /usr/bin/python3 (scripts/install-deps.sh --bench)" >&2; exit 1; }

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
field() { grep -o "$1 [0-9.]*" "$2" | awk '{ print $2 }'; }
err=$(mktemp)
trap 'rm -f "$err"' EXIT
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

printf '# %s, %s cores, load %s; batch %s, %s threads, %s warm-up + median of >= %s steps (>= %s s), %s round(s)\n' \
  "$(date -u +%FT%TZ)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$batch" "$threads" \
  "$warmup" "$repeats" "$min_s" "$rounds"
printf '%-14s %5s %-7s %10s %11s %11s %7s %13s %13s\n' model input backend "fleet ms" \
  "torch nchw" "torch nhwc" ratio "fleet params" "torch params"
for row in "${rows[@]}"; do
  name=${row%@*} size=${row#*@}
  declare -A f=() fp=()
  tn=() th=() tp=""
  for ((r = 0; r < rounds; r++)); do
    for be in "${backends[@]}"; do
      f[$be]+="$(CNN_STEP_SIZE=$size CNN_STEP_WARMUP=$warmup CNN_STEP_MIN_S=$min_s "$fleet" "$name" "$batch" 1 \
        "$repeats" "$be" 2>"$err") "
      fp[$be]=$(field params "$err")
    done
    tn+=("$(/usr/bin/python3 "$torch_py" "$name" "$size" "$batch" "$warmup" "$repeats" \
      "$threads" nchw "$min_s" 2>"$err")")
    tp=$(field params "$err")
    th+=("$(/usr/bin/python3 "$torch_py" "$name" "$size" "$batch" "$warmup" "$repeats" \
      "$threads" nhwc "$min_s" 2>"$err")")
  done
  tnm=$(printf '%s\n' "${tn[@]}" | median)
  thm=$(printf '%s\n' "${th[@]}" | median)
  for be in "${backends[@]}"; do
    fm=$(printf '%s\n' ${f[$be]} | median)
    ratio=$(awk -v a="$tnm" -v b="$thm" -v c="$fm" 'BEGIN { t = a < b ? a : b; print t / c }')
    printf '%-14s %5s %-7s %10.1f %11.1f %11.1f %7.2f %13s %13s%s\n' "$name" "${size}x$size" \
      "$be" "$fm" "$tnm" "$thm" "$ratio" "${fp[$be]}" "$tp" \
      "$([[ "${fp[$be]}" == "$tp" ]] || echo "  (params differ!)")"
  done
  unset f fp
done
printf '# load after: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
