#!/usr/bin/env bash
# cnn_step.sh - training-step time (forward, cross-entropy, backward, Momentum update) of fleet's
# ResNets beside PyTorch 1.13 (Debian's python3-torch, oneDNN convolutions), same model, batch,
# optimizer and thread count, measured in the same run, alternating the two:
#   CIFAR ResNet-20 (option A, 3x32x32, 10 classes) at batch 64,
#   ResNet-50 (torchvision layout, 3x224x224, 1000 classes) at batch 8.
# Each cell is the median of ROUNDS medians (wall ms per step); "cpu" columns are CPU ms per step
# (all threads), less disturbed than wall time when other jobs share the machine.
# ratio = torch ms / fleet ms (> 1: fleet faster).
# Usage: bench/cnn_step.sh [BUILD_DIR]    (ROUNDS=3, THREADS="1 2", MODELS="resnet20 resnet50")
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
fleet="$build/bench/cnn_step"
torch_py="$here/cnn_step_torch.py"
rounds=${ROUNDS:-3}
threads_list=${THREADS:-"1 2"}
models_wanted=${MODELS:-"resnet20 resnet50"}
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
printf '%-10s %5s %7s %10s %10s %10s %10s %7s\n' model batch threads "fleet ms" "torch ms" \
  "fleet cpu" "torch cpu" ratio
for m in "${models[@]}"; do
  IFS='|' read -r name batch iters reps <<<"$m"
  [[ " $models_wanted " == *" $name "* ]] || continue
  for threads in $threads_list; do
    export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
    f=() t=() fc=() tc=()
    for ((r = 0; r < rounds; r++)); do
      f+=("$("$fleet" "$name" "$batch" "$iters" "$reps" 2>"$err")")
      fc+=("$(grep -o 'cpu [0-9.]*' "$err" | awk '{ print $2 }')")
      t+=("$(/usr/bin/python3 "$torch_py" "$name" "$batch" "$iters" "$reps" "$threads" 2>"$err")")
      tc+=("$(grep -o 'cpu [0-9.]*' "$err" | awk '{ print $2 }')")
    done
    fm=$(printf '%s\n' "${f[@]}" | median)
    tm=$(printf '%s\n' "${t[@]}" | median)
    fcm=$(printf '%s\n' "${fc[@]}" | median)
    tcm=$(printf '%s\n' "${tc[@]}" | median)
    ratio=$(awk -v a="$tm" -v b="$fm" 'BEGIN { print a / b }')
    printf '%-10s %5s %7s %10.1f %10.1f %10.1f %10.1f %7.2f\n' "$name" "$batch" "$threads" \
      "$fm" "$tm" "$fcm" "$tcm" "$ratio"
  done
done
printf '# load after: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
