#!/usr/bin/env bash
# gpu_profile.sh - where a ResNet-50 training step's GPU time goes: Nsight Compute's
# gpu__time_duration of every kernel of bench/cnn_step's two steps (the warm-up and one timed,
# cuDNN's heuristics so that no Find trials mix in), summed by kernel function, the largest
# first, with each one's share and launches per step. The table that RESULTS.md's "where the
# step goes" lines come from; what to make faster next.
# Usage: bench/gpu_profile.sh BUILD_DIR [BATCH [PRECISION [TOP]]]   (PRECISION f32, tf32,
#   tf32nhwc, or f16 / bf16: gpu_step.sh's AMP rows, strategy.amp's step natively in the low
#   dtype, channels-last, TF32 off; FLEET_CUDNN_DETERMINISTIC=0 profiles the fast backward
#   algorithms; NCU=path)
set -euo pipefail
build=${1:?usage: gpu_profile.sh BUILD_DIR [BATCH [PRECISION [TOP]]]}
b=${2:-64} p=${3:-tf32} top=${4:-25}
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
py=${PYTHON:-python3}
[[ -x $ncu ]] || { echo "gpu_profile.sh: no ncu (NCU=...)" >&2; exit 1; }
nhwc=0 amp=()
case $p in
  f32) tf=0 ;;
  tf32) tf=1 ;;
  tf32nhwc) tf=1 nhwc=1 ;; # channels-last activations (FLEET_CUDA_NHWC=1), as gpu_step.sh's row
  f16 | bf16) tf=0 nhwc=1 amp=(CNN_STEP_AMP="$p" FLEET_CUDA_LOW_DTYPES=1) ;;
  *) echo "gpu_profile.sh: precision f32, tf32, tf32nhwc, f16 or bf16" >&2; exit 2 ;;
esac
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
env "${amp[@]}" FLEET_CUDA_TF32=$tf FLEET_CUDA_NHWC=$nhwc FLEET_CUDNN_BENCHMARK=0 "$ncu" --metrics gpu__time_duration.sum --csv \
  --print-units base --print-kernel-base function "$build/bench/cnn_step" resnet50 "$b" 1 1 \
  cuda >"$csv" 2>/dev/null
"$py" - "$csv" "$b" "$p" "$top" <<'EOF'
import csv, sys
path, batch, prec, top = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = [r for r in csv.reader(open(path)) if len(r) > 5]
head = rows[0]
name, metric, value = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
by = {}
for r in rows[1:]:
    if r[metric] != "gpu__time_duration.sum":
        continue
    t = float(r[value].replace(",", ""))
    n, c = by.get(r[name], (0.0, 0))
    by[r[name]] = (n + t, c + 1)
steps = 2  # the warm-up step and the timed one
total = sum(t for t, _ in by.values()) / steps
print(f"ResNet-50, batch {batch}, {prec}: {total / 1e6:.2f} ms of kernels per step, "
      f"{sum(c for _, c in by.values()) // steps} launches")
print(f"{'ms/step':>8} {'share':>6} {'calls':>6}  kernel")
for k, (t, c) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]:
    print(f"{t / steps / 1e6:8.3f} {100 * t / steps / total:5.1f}% {c // steps:6d}  {k[:110]}")
EOF
