#!/usr/bin/env bash
# amp_accuracy.sh - mixed precision against f32 on the synthetic image task: configs/
# shapes_resnet.yaml as it is (ResNet-20, 32x32 images, 3 epochs of 16384, 2 workers under
# fleetrun), f32, amp float16 and amp bfloat16 (the white list's conv2d and fc emulated on the
# CPU: docs/amp.md), the same seeds. Goal: amp within 0.5 points of f32's validation accuracy.
# CONFIG=configs/fashion_resnet.yaml takes Fashion-MNIST's recipe instead (scripts/gpu-check.sh
# --accuracy: on a GPU, natively in f16 / bf16, one worker at the quality table's global batch).
# Prints one row per run: final validation accuracy, the loss scale at the end, the steps
# skipped, and the wall time (which measures the emulation's cost, not a GPU's gain).
#
# Usage: bench/amp_accuracy.sh [BUILD_DIR]
#   NPROC=2   SEEDS="2024"   EXTRA="-o key=value ..."   KEEP=DIR (keep logs)   CONFIG=FILE
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
config=${CONFIG:-$here/../configs/shapes_resnet.yaml}
nproc=${NPROC:-2}
read -r -a seeds <<<"${SEEDS:-2024}"
read -r -a extra <<<"${EXTRA:-}"
work=${KEEP:-$(mktemp -d /tmp/amp_accuracy.XXXXXX)}
mkdir -p "$work"
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
runs=("f32:-o strategy.amp=false" "float16:-o strategy.amp=true"
  "bfloat16:-o strategy.amp=true -o strategy.amp_configs.dtype=bfloat16")
echo "# amp_accuracy: $(basename "$config") ${extra[*]}, $nproc workers, seeds ${seeds[*]}, $(date -u +%Y-%m-%dT%H:%MZ)"
echo "| run | seed | val acc | vs f32 (pt) | loss scale | skipped | wall s |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for seed in "${seeds[@]}"; do
  base=""
  for r in "${runs[@]}"; do
    name=${r%%:*}
    read -r -a args <<<"${r#*:}"
    start=$(date +%s.%N)
    "$build/tools/fleetrun" --nproc_per_node "$nproc" --log_dir "$work/$name.$seed.log" \
      "$build/tools/fleet-train" -c "$config" -o train.seed="$seed" -o train.log_dir="$work/$name.$seed" \
      "${extra[@]}" "${args[@]}" >"$work/$name.$seed.out" 2>&1 ||
      { echo "amp_accuracy.sh: $name failed" >&2; tail -5 "$work/$name.$seed.out" >&2; exit 1; }
    wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.0f", e - s }')
    acc=$(grep ', eval ' "$work/$name.$seed.out" | tail -1 | sed -E 's/.*val_acc1 ([0-9.]+).*/\1/')
    last=$(grep -E '^worker_index: 0, .* step [0-9]+, loss ' "$work/$name.$seed.out" | tail -1)
    scale=$(sed -nE 's/.*loss_scale ([0-9.e+]+), skipped ([0-9]+)$/\1/p' <<<"$last")
    skipped=$(sed -nE 's/.*loss_scale ([0-9.e+]+), skipped ([0-9]+)$/\2/p' <<<"$last")
    [[ -n $base ]] || base=$acc
    diff=$(awk -v a="$acc" -v b="$base" 'BEGIN { printf "%+.2f", 100 * (a - b) }')
    echo "| $name | $seed | $(awk -v a="$acc" 'BEGIN { printf "%.2f%%", 100 * a }') | $diff | ${scale:--} | ${skipped:--} | $wall |"
  done
done
