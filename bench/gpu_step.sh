#!/usr/bin/env bash
# gpu_step.sh - ResNet-50 (3x224x224, 1000 classes) training throughput on one GPU: fleet's cuda
# backend (bench/cnn_step.c) beside the PyTorch on the machine (bench/gpu_step_torch.py, same
# model, batch, SGD with momentum, random data on the device), alternating the two, each cell the
# median of ROUNDS runs of ITERS steps (after a warm-up). Rows: f32 with TF32 off and on, AMP
# float16 and bfloat16 (PyTorch: autocast, channels-last); with COMPILE=1 also torch.compile's
# time of each row (one run: compiling takes minutes). ratio = fleet img/s / PyTorch eager img/s.
# Both time cuDNN's convolution algorithms once per shape (PyTorch: cudnn.benchmark = True;
# fleet: FLEET_CUDNN_BENCHMARK=1, the fastest deterministic backward algorithms).
# Also the share of a step that DGC's local work takes on the GPU (CNN_STEP_DGC: the fused
# accumulate + top-k selection at sparsity 0.999, encoding, pairs to the host) at each batch.
# Usage: bench/gpu_step.sh [BUILD_DIR]     (on a machine with a GPU and PyTorch)
#   ROUNDS=3 ITERS=10 BATCHES="64 256" PRECISIONS="f32 tf32 f16 bf16" COMPILE=0 DGC=1 PYTHON=python3
#   (PRECISIONS="" skips the table, DGC=0 the DGC lines)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
fleet="$build/bench/cnn_step"
py=${PYTHON:-python3}
rounds=${ROUNDS:-3} iters=${ITERS:-10}
read -r -a batches <<<"${BATCHES:-64 256}"
read -r -a precisions <<<"${PRECISIONS-f32 tf32 f16 bf16}"
[[ -x "$fleet" ]] || { echo "gpu_step.sh: $fleet not built" >&2; exit 1; }
"$py" -c 'import torch, torchvision; assert torch.cuda.is_available()' 2>/dev/null || {
  echo "gpu_step.sh: $py has no PyTorch with a GPU (PYTHON=...)" >&2; exit 1; }
err=$(mktemp)
trap 'rm -f "$err"' EXIT
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ips() { awk -v b="$1" -v ms="$2" 'BEGIN { if (ms > 0) printf "%.0f", b * 1000 / ms; else print "-" }'; }

export FLEET_CUDNN_BENCHMARK=${FLEET_CUDNN_BENCHMARK:-1} # as PyTorch's cudnn.benchmark below
fleet_ms() { # fleet_ms BATCH PRECISION -> ms (or nothing: a row fleet cannot run), peak in $err.f
  case $2 in
    f32) FLEET_CUDA_TF32=0 "$fleet" resnet50 "$1" "$iters" 1 cuda 2>"$err.f" ;;
    tf32) FLEET_CUDA_TF32=1 "$fleet" resnet50 "$1" "$iters" 1 cuda 2>"$err.f" ;;
    *) return 0 ;; # AMP: fleet emulates it in f32 kernels (docs/amp.md), no f16 speed to time
  esac
}
torch_ms() { "$py" "$here/gpu_step_torch.py" "$1" "$iters" 1 "$2" "${3:-eager}" 2>"$err.t"; }
peak() { sed -nE 's/.*device memory peak ([0-9.]+) MiB.*/\1/p' "$1" | tail -1; }

echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); PyTorch $("$py" -c 'import torch; print(torch.__version__)')"
[[ ${#precisions[@]} -gt 0 ]] && printf '%-6s %-5s | %9s %9s %8s | %9s %9s %8s | %6s | %9s\n' batch prec "fleet ms" "img/s" "peak MiB" \
  "torch ms" "img/s" "peak MiB" ratio "compile"
for b in "${batches[@]}"; do
  for p in ${precisions[@]+"${precisions[@]}"}; do
    fl=() tr=() fpk="" tpk=""
    for ((r = 0; r < rounds; r++)); do
      m=$(fleet_ms "$b" "$p") || { echo "gpu_step.sh: fleet failed:" >&2; cat "$err.f" >&2; exit 1; }
      [[ -n "$m" ]] && fl+=("$m") && fpk=$(peak "$err.f")
      m=$(torch_ms "$b" "$p") || { echo "gpu_step.sh: torch failed:" >&2; cat "$err.t" >&2; exit 1; }
      tr+=("$m") tpk=$(peak "$err.t")
    done
    fm=$([[ ${#fl[@]} -gt 0 ]] && printf '%s\n' "${fl[@]}" | median || echo 0)
    tm=$(printf '%s\n' "${tr[@]}" | median)
    cm=0
    if [[ "${COMPILE:-0}" == 1 ]]; then
      cm=$(torch_ms "$b" "$p" compile) || { echo "gpu_step.sh: torch.compile failed:" >&2; tail -5 "$err.t" >&2; cm=0; }
    fi
    ratio=$(awk -v f="$fm" -v t="$tm" 'BEGIN { if (f > 0) printf "%.2f", t / f; else print "-" }')
    printf '%-6s %-5s | %9s %9s %8s | %9.2f %9s %8s | %6s | %9s\n' "$b" "$p" \
      "$([[ $fm != 0 ]] && printf '%.2f' "$fm" || echo -)" "$(ips "$b" "$fm")" "${fpk:--}" \
      "$tm" "$(ips "$b" "$tm")" "$tpk" "$ratio" "$([[ $cm != 0 ]] && ips "$b" "$cm" || echo -)"
  done
done
[[ "${DGC:-1}" == 1 ]] || exit 0
echo
echo "DGC's local work on the GPU (sparsity 0.999, f32, TF32 off), share of a fleet step:"
for b in "${batches[@]}"; do
  CNN_STEP_DGC=0.999 FLEET_CUDA_TF32=0 "$fleet" resnet50 "$b" "$iters" "$rounds" cuda 2>"$err.f" >/dev/null ||
    { cat "$err.f" >&2; exit 1; }
  echo "  batch $b: $(sed -nE 's/^cnn_step: dgc at (.*)/\1/p' "$err.f")"
done
