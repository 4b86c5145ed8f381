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
# ms, and CPU ms of all threads together); a cell is the median over ROUNDS such processes (the
# programs alternate within each round, so that a burst of load hits both sides). ratio = the
# faster PyTorch layout's ms / fleet's ms (> 1: fleet faster), "cpu r" the same of CPU ms: on a
# machine other jobs share, wall time swings tenfold with their bursts while CPU time
# (OMP_WAIT_POLICY=passive) moves far less. The par(ameters) columns are each side's trainable
# parameter count: equal when the networks match.
# Usage: bench/pplcnet_step.sh [BUILD_DIR]
#   ROUNDS=2 WARMUP=2 REPEATS=5 MIN_SECONDS=3 THREADS=2 BACKENDS="onednn" ROWS="pplcnet_x1_0@224 ..."
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
fleet="$build/bench/cnn_step"
torch_py="$here/pplcnet_step_torch.py"
rounds=${ROUNDS:-2}
warmup=${WARMUP:-2}
repeats=${REPEATS:-5}
min_s=${MIN_SECONDS:-3}
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
# passive waiting: on a shared machine a spinning OpenMP thread burns the CPU time that the
# cpu columns measure while it waits for a descheduled peer (both programs use libgomp)
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads OMP_WAIT_POLICY=passive

printf '# %s, %s cores, load %s; batch %s, %s threads, %s warm-up + median of >= %s steps (>= %s s), %s round(s)\n' \
  "$(date -u +%FT%TZ)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$batch" "$threads" \
  "$warmup" "$repeats" "$min_s" "$rounds"
printf '%-14s %7s %-7s %9s %9s %9s %6s %9s %9s %9s %6s %9s %9s\n' model input backend \
  "fleet ms" "nchw ms" "nhwc ms" ratio "fleet cpu" "nchw cpu" "nhwc cpu" "cpu r" \
  "fleet par" "torch par"
for row in "${rows[@]}"; do
  name=${row%@*} size=${row#*@}
  declare -A f=() fc=() fp=()
  tn=() th=() tnc=() thc=() tp=""
  for ((r = 0; r < rounds; r++)); do
    for be in "${backends[@]}"; do
      f[$be]+="$(CNN_STEP_SIZE=$size CNN_STEP_WARMUP=$warmup CNN_STEP_MIN_S=$min_s "$fleet" \
        "$name" "$batch" 1 "$repeats" "$be" 2>"$err") "
      fc[$be]+="$(field cpu "$err") "
      fp[$be]=$(field params "$err")
    done
    tn+=("$(/usr/bin/python3 "$torch_py" "$name" "$size" "$batch" "$warmup" "$repeats" \
      "$threads" nchw "$min_s" 2>"$err")")
    tnc+=("$(field cpu "$err")")
    tp=$(field params "$err")
    th+=("$(/usr/bin/python3 "$torch_py" "$name" "$size" "$batch" "$warmup" "$repeats" \
      "$threads" nhwc "$min_s" 2>"$err")")
    thc+=("$(field cpu "$err")")
  done
  tnm=$(printf '%s\n' "${tn[@]}" | median) thm=$(printf '%s\n' "${th[@]}" | median)
  tncm=$(printf '%s\n' "${tnc[@]}" | median) thcm=$(printf '%s\n' "${thc[@]}" | median)
  for be in "${backends[@]}"; do
    fm=$(printf '%s\n' ${f[$be]} | median)
    fcm=$(printf '%s\n' ${fc[$be]} | median)
    ratio=$(awk -v a="$tnm" -v b="$thm" -v c="$fm" 'BEGIN { t = a < b ? a : b; print t / c }')
    cratio=$(awk -v a="$tncm" -v b="$thcm" -v c="$fcm" 'BEGIN { t = a < b ? a : b; print t / c }')
    printf '%-14s %7s %-7s %9.1f %9.1f %9.1f %6.2f %9.1f %9.1f %9.1f %6.2f %9s %9s%s\n' "$name" \
      "${size}x$size" "$be" "$fm" "$tnm" "$thm" "$ratio" "$fcm" "$tncm" "$thcm" "$cratio" \
      "${fp[$be]}" "$tp" "$([[ "${fp[$be]}" == "$tp" ]] || echo "  (params differ!)")"
  done
  unset f fc fp
done
printf '# load after: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
