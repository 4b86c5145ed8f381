#!/usr/bin/env bash
# mlp_step.sh - training-step time of fleet beside PyTorch 1.13 (Debian's python3-torch), same
# model, batch, optimizer and thread count, measured in the same run, alternating the two.
# Each cell is the median of ROUNDS medians; ratio = torch ms / fleet ms (> 1: fleet faster).
# Usage: bench/mlp_step.sh [BUILD_DIR]    (ROUNDS=5 by default)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
fleet="$build/bench/mlp_step"
torch_py="$here/mlp_step_torch.py"
rounds=${ROUNDS:-5}
[[ -x "$fleet" ]] || { echo "mlp_step.sh: $fleet not built (make build)" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "mlp_step.sh: PyTorch not importable by /usr/bin/python3 (scripts/install-deps.sh --bench)" >&2; exit 1; }

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# name | in | hidden | act | classes | batch | iters | repeats
models=(
  "seed mlp(32,[128,128],tanh,2)|32|128,128|tanh|2|128|200|5"
  "wide mlp(1024,[4096,4096],relu,1000)|1024|4096,4096|relu|1000|128|4|3"
)
printf '%-40s %7s %12s %12s %8s\n' model threads "fleet ms" "torch ms" ratio
for m in "${models[@]}"; do
  IFS='|' read -r name in hidden act classes batch iters reps <<<"$m"
  for threads in 1 2; do
    export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
    f=() t=()
    for ((r = 0; r < rounds; r++)); do
      f+=("$("$fleet" "$in" "$hidden" "$act" "$classes" "$batch" "$iters" "$reps" 2>/dev/null)")
      t+=("$(/usr/bin/python3 "$torch_py" "$in" "$hidden" "$act" "$classes" "$batch" "$iters" "$reps" "$threads")")
    done
    fm=$(printf '%s\n' "${f[@]}" | median)
    tm=$(printf '%s\n' "${t[@]}" | median)
    printf '%-40s %7s %12.3f %12.3f %8.2f\n' "$name" "$threads" "$fm" "$tm" "$(awk -v a="$tm" -v b="$fm" 'BEGIN { print a / b }')"
  done
done
