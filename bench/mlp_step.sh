#!/usr/bin/env bash
# mlp_step.sh - training-step time of fleet beside PyTorch 1.13 (Debian's python3-torch), same
# model, batch, optimizer and thread count, measured in the same run, alternating the two.
# PyTorch runs twice: as Debian ships it (libblas.so.3 resolves to the pthread OpenBLAS, whose
# threads contend with torch's OpenMP threads) and with the OpenMP OpenBLAS that fleet links
# (LD_LIBRARY_PATH); the ratio is against the faster of the two.
# Each cell is the median of ROUNDS medians; ratio = best torch ms / fleet ms (> 1: fleet faster).
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
omp_blas=/usr/lib/$(gcc -print-multiarch)/openblas-openmp
printf '%-40s %7s %10s %10s %14s %7s\n' model threads "fleet ms" "torch ms" "torch-omp ms" ratio
for m in "${models[@]}"; do
  IFS='|' read -r name in hidden act classes batch iters reps <<<"$m"
  for threads in 1 2; do
    export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
    f=() t=() o=()
    args=("$in" "$hidden" "$act" "$classes" "$batch" "$iters" "$reps")
    for ((r = 0; r < rounds; r++)); do
      f+=("$("$fleet" "${args[@]}" 2>/dev/null)")
      t+=("$(/usr/bin/python3 "$torch_py" "${args[@]}" "$threads")")
      o+=("$(LD_LIBRARY_PATH=$omp_blas /usr/bin/python3 "$torch_py" "${args[@]}" "$threads")")
    done
    fm=$(printf '%s\n' "${f[@]}" | median)
    tm=$(printf '%s\n' "${t[@]}" | median)
    om=$(printf '%s\n' "${o[@]}" | median)
    ratio=$(awk -v a="$tm" -v o="$om" -v b="$fm" 'BEGIN { m = a < o ? a : o; print m / b }')
    printf '%-40s %7s %10.3f %10.3f %14.3f %7.2f\n' "$name" "$threads" "$fm" "$tm" "$om" "$ratio"
  done
done
