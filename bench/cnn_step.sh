#!/usr/bin/env bash
# cnn_step.sh - training-step time (forward, cross-entropy, backward, Momentum update) of fleet's
# ResNets beside PyTorch 1.13 (Debian's python3-torch, oneDNN convolutions), same model, batch,
# optimizer and thread count, measured in the same run, alternating the two:
#   CIFAR ResNet-20 (option A, 3x32x32, 10 classes) at batch 64,
#   ResNet-50 (torchvision layout, 3x224x224, 1000 classes) at batch 8.
# Each cell is the median of ROUNDS medians (wall ms per step); "cpu" columns are CPU ms per step
# (all threads), less disturbed than wall time when other jobs share the machine.
# ratio = torch ms / fleet ms (> 1: fleet faster); "MB" columns the peak resident memory (max
# RSS) of each process, median over rounds. One fleet row per compute backend in BACKENDS.
# Usage: bench/cnn_step.sh [BUILD_DIR]
#   ROUNDS=3 THREADS="1 2" MODELS="resnet20 resnet50" BACKENDS="onednn cpu"
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
fleet="$build/bench/cnn_step"
torch_py="$here/cnn_step_torch.py"
rounds=${ROUNDS:-3}
threads_list=${THREADS:-"1 2"}
models_wanted=${MODELS:-"resnet20 resnet50"}
read -r -a backends <<<"${BACKENDS:-onednn cpu}"
[[ -x "$fleet" ]] || { echo "cnn_step.sh: $fleet not built (make build)" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "cnn_step.sh: PyTorch not importable by /usr/bin/python3 (scripts/install-deps.sh --bench)" >&2; exit 1; }

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
err=$(mktemp)
trap 'rm -f "$err"' EXIT

# model | batch | iters | repeats
models=(
  "resnet20|64|3|3"
  "resnet50|8|1|3"
)
printf '# %s, %s cores, load %s\n' "$(date -u +%FT%TZ)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %5s %7s %-7s %10s %10s %10s %10s %7s %9s %9s\n' model batch threads backend \
  "fleet ms" "torch ms" "fleet cpu" "torch cpu" ratio "fleet MB" "torch MB"
field() { grep -o "$1 [0-9.]*" "$2" | awk '{ print $2 }'; }
for m in "${models[@]}"; do
  IFS='|' read -r name batch iters reps <<<"$m"
  [[ " $models_wanted " == *" $name "* ]] || continue
  for threads in $threads_list; do
    export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
    declare -A f=() fc=() fm=()
    t=() tc=() tm=()
    for ((r = 0; r < rounds; r++)); do # alternate: every backend, then torch, each round
      for be in "${backends[@]}"; do
        f[$be]+="$("$fleet" "$name" "$batch" "$iters" "$reps" "$be" 2>"$err") "
        fc[$be]+="$(field cpu "$err") "
        fm[$be]+="$(field maxrss "$err") "
      done
      t+=("$(/usr/bin/python3 "$torch_py" "$name" "$batch" "$iters" "$reps" "$threads" 2>"$err")")
      tc+=("$(field cpu "$err")")
      tm+=("$(field maxrss "$err")")
    done
    tmed=$(printf '%s\n' "${t[@]}" | median)
    tcm=$(printf '%s\n' "${tc[@]}" | median)
    tmm=$(printf '%s\n' "${tm[@]}" | median)
    for be in "${backends[@]}"; do
      fmed=$(printf '%s\n' ${f[$be]} | median)
      fcm=$(printf '%s\n' ${fc[$be]} | median)
      fmm=$(printf '%s\n' ${fm[$be]} | median)
      ratio=$(awk -v a="$tmed" -v b="$fmed" 'BEGIN { print a / b }')
      printf '%-10s %5s %7s %-7s %10.1f %10.1f %10.1f %10.1f %7.2f %9.0f %9.0f\n' "$name" "$batch" \
        "$threads" "$be" "$fmed" "$tmed" "$fcm" "$tcm" "$ratio" "$fmm" "$tmm"
    done
    unset f fc fm
  done
done
printf '# load after: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
