#!/usr/bin/env bash
# gpu_profile.sh - where a ResNet-50 training step's GPU time goes: Nsight Compute's
# gpu__time_duration of every kernel of bench/cnn_step's two steps (the warm-up and one timed,
# cuDNN's heuristics so that no Find trials mix in), summed by kernel function, the largest
# first, with each one's share and launches per step. The table that RESULTS.md's "where the
# step goes" lines come from; what to make faster next. Beside each kernel's time, how near it
# ran to the memory's and the SMs' peak (ncu's dram__throughput and sm__throughput, % of peak
# sustained, time-weighted over its calls): a kernel far below both is bound by latency or
# launch shape, not by what it moves or computes.
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
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
env "${amp[@]}" FLEET_CUDA_TF32=$tf FLEET_CUDA_NHWC=$nhwc FLEET_CUDNN_BENCHMARK=0 "$ncu" --metrics "$metrics" --csv \
  --print-units base --print-kernel-base function "$build/bench/cnn_step" resnet50 "$b" 1 1 \
  cuda >"$csv" 2>/dev/null
"$py" - "$csv" "$b" "$p" "$top" <<'EOF'
import csv, sys
path, batch, prec, top = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = [r for r in csv.reader(open(path)) if len(r) > 5]
head = rows[0]
name, metric, value = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
# one row per kernel launch and metric: the launch's time, then its throughputs weighted by it
launch = head.index("ID") if "ID" in head else None
per = {}
for r in rows[1:]:
    key = (r[launch] if launch is not None else len(per), r[name])
    per.setdefault(key, {})[r[metric]] = float(r[value].replace(",", ""))
by, pct = {}, {}
for (_, k), m in per.items():
    t = m.get("gpu__time_duration.sum")
    if t is None:
        continue
    n, c = by.get(k, (0.0, 0))
    by[k] = (n + t, c + 1)
    d, s_ = pct.get(k, (0.0, 0.0))
    pct[k] = (d + t * m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", 0),
              s_ + t * m.get("sm__throughput.avg.pct_of_peak_sustained_elapsed", 0))
steps = 2  # the warm-up step and the timed one
total = sum(t for t, _ in by.values()) / steps
print(f"ResNet-50, batch {batch}, {prec}: {total / 1e6:.2f} ms of kernels per step, "
      f"{sum(c for _, c in by.values()) // steps} launches")
print(f"{'ms/step':>8} {'share':>6} {'calls':>6} {'dram%':>6} {'sm%':>6}  kernel")
for k, (t, c) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]:
    d, s_ = pct[k]
    print(f"{t / steps / 1e6:8.3f} {100 * t / steps / total:5.1f}% {c // steps:6d} "
          f"{d / t:6.1f} {s_ / t:6.1f}  {k[:100]}")
EOF
