#!/usr/bin/env bash
# gpu_step.sh - ResNet-50 (3x224x224, 1000 classes) training throughput on one GPU: fleet's cuda
# backend (bench/cnn_step.c) beside the PyTorch on the machine (bench/gpu_step_torch.py, same
# model, batch, SGD with momentum, random data on the device), alternating the two, each cell the
# median of ROUNDS runs of ITERS steps (after a warm-up). Rows: f32 with TF32 off and on, AMP
# float16 and bfloat16 (PyTorch: autocast, channels-last); with COMPILE=1 also torch.compile's
# time of each row (one run: compiling takes minutes). ratio = fleet img/s / PyTorch eager img/s.
# Both time cuDNN's convolution algorithms once per shape (PyTorch: cudnn.benchmark = True;
# fleet: FLEET_CUDNN_BENCHMARK=1). fleet runs twice per cell: deterministic (its default, the
# fastest deterministic backward algorithms) and fast (train.deterministic: false, through
# FLEET_CUDNN_DETERMINISTIC=0: any backward algorithm, as PyTorch's default); ratio compares
# each with PyTorch eager. Each process times REPEATS runs of ITERS steps and reports their
# median; ROUNDS processes alternate fleet and PyTorch, and the cell is their median.
# PRECISIONS may add tf32nhwc: fleet's TF32 with channels-last activations (FLEET_CUDA_NHWC=1)
# beside PyTorch's TF32 row.
# Also the share of a step that DGC's local work takes on the GPU (CNN_STEP_DGC: the fused
# accumulate + top-k selection at sparsity 0.999, encoding, pairs to the host) at each batch,
# all tensors in one batched call and tensor by tensor.
# Usage: bench/gpu_step.sh [BUILD_DIR]     (on a machine with a GPU and PyTorch)
#   ROUNDS=3 ITERS=10 REPEATS=1 BATCHES="64 256" PRECISIONS="f32 tf32 f16 bf16" COMPILE=0 DGC=1
#   PYTHON=python3
#   (PRECISIONS="" skips the table, DGC=0 the DGC lines)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
fleet="$build/bench/cnn_step"
py=${PYTHON:-python3}
rounds=${ROUNDS:-3} iters=${ITERS:-10} repeats=${REPEATS:-1}
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
fleet_ms() { # fleet_ms BATCH PRECISION DET -> ms (or nothing: a row fleet cannot run), peak in $err.f
  local tf nhwc=0
  case $2 in
    f32) tf=0 ;;
    tf32) tf=1 ;;
    tf32nhwc) tf=1 nhwc=1 ;; # channels-last activations (FLEET_CUDA_NHWC), PyTorch's tf32 row
    *) return 0 ;; # AMP: fleet emulates it in f32 kernels (docs/amp.md), no f16 speed to time
  esac
  FLEET_CUDA_TF32=$tf FLEET_CUDA_NHWC=$nhwc FLEET_CUDNN_DETERMINISTIC=$3 "$fleet" resnet50 "$1" "$iters" "$repeats" \
    cuda 2>"$err.f"
}
torch_ms() { "$py" "$here/gpu_step_torch.py" "$1" "$iters" "$repeats" "${2%nhwc}" "${3:-eager}" 2>"$err.t"; }
peak() { sed -nE 's/.*device memory peak ([0-9.]+) MiB.*/\1/p' "$1" | tail -1; }

echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); PyTorch $("$py" -c 'import torch; print(torch.__version__)')"
[[ ${#precisions[@]} -gt 0 ]] && printf '%-6s %-5s | %9s %9s %9s %9s %8s | %9s %9s %8s | %6s %6s | %9s\n' \
  batch prec "det ms" "img/s" "fast ms" "img/s" "peak MiB" "torch ms" "img/s" "peak MiB" \
  "r det" "r fast" "compile"
for b in "${batches[@]}"; do
  for p in ${precisions[@]+"${precisions[@]}"}; do
    fl=() ff=() tr=() fpk="" tpk=""
    for ((r = 0; r < rounds; r++)); do
      m=$(fleet_ms "$b" "$p" 1) || { echo "gpu_step.sh: fleet failed:" >&2; cat "$err.f" >&2; exit 1; }
      [[ -n "$m" ]] && fl+=("$m") && fpk=$(peak "$err.f")
      m=$(fleet_ms "$b" "$p" 0) || { echo "gpu_step.sh: fleet failed:" >&2; cat "$err.f" >&2; exit 1; }
      [[ -n "$m" ]] && ff+=("$m")
      m=$(torch_ms "$b" "$p") || { echo "gpu_step.sh: torch failed:" >&2; cat "$err.t" >&2; exit 1; }
      tr+=("$m") tpk=$(peak "$err.t")
    done
    fm=$([[ ${#fl[@]} -gt 0 ]] && printf '%s\n' "${fl[@]}" | median || echo 0)
    fq=$([[ ${#ff[@]} -gt 0 ]] && printf '%s\n' "${ff[@]}" | median || echo 0)
    tm=$(printf '%s\n' "${tr[@]}" | median)
    cm=0
    if [[ "${COMPILE:-0}" == 1 ]]; then
      cm=$(torch_ms "$b" "$p" compile) || { echo "gpu_step.sh: torch.compile failed:" >&2; tail -5 "$err.t" >&2; cm=0; }
    fi
    ratio() { awk -v f="$1" -v t="$tm" 'BEGIN { if (f > 0) printf "%.2f", t / f; else print "-" }'; }
    msf() { [[ $1 != 0 ]] && printf '%.2f' "$1" || echo -; }
    printf '%-6s %-5s | %9s %9s %9s %9s %8s | %9.2f %9s %8s | %6s %6s | %9s\n' "$b" "$p" \
      "$(msf "$fm")" "$(ips "$b" "$fm")" "$(msf "$fq")" "$(ips "$b" "$fq")" "${fpk:--}" \
      "$tm" "$(ips "$b" "$tm")" "$tpk" "$(ratio "$fm")" "$(ratio "$fq")" \
      "$([[ $cm != 0 ]] && ips "$b" "$cm" || echo -)"
  done
done
[[ "${DGC:-1}" == 1 ]] || exit 0
echo
echo "DGC's local work on the GPU (sparsity 0.999, f32, TF32 off), share of a fleet step:"
for b in "${batches[@]}"; do
  for batched in 1 0; do # every tensor in one batched call; tensor by tensor
    CNN_STEP_DGC=0.999 CNN_STEP_DGC_BATCH=$batched FLEET_CUDA_TF32=0 "$fleet" resnet50 "$b" \
      "$iters" "$((rounds * repeats))" cuda 2>"$err.f" >/dev/null || { cat "$err.f" >&2; exit 1; }
    echo "  batch $b: $(sed -nE 's/^cnn_step: dgc at (.*)/\1/p' "$err.f")"
  done
done
