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
# The f16 and bf16 rows run fleet as PyTorch's autocast rows run: strategy.amp's step
# (CNN_STEP_AMP=f16|bf16 of bench/cnn_step.c: conv2d and fc in the low dtype, static loss scale
# 1024, inf steps skipped; PyTorch: a dynamic GradScaler for f16, none for bf16), TF32 off,
# channels-last (FLEET_CUDA_NHWC=1), and the cuda table's low dtypes on
# (FLEET_CUDA_LOW_DTYPES=1; set it to 0 to time the f32 emulation instead). The last column says
# what fleet ran: "native N/M" (N of the M layers with 2-byte activations) or "emulated" (f32
# kernels on rounded values: a table without low dtypes), "-" for f32 rows.
# A cell fleet or PyTorch cannot run (a plan refused, out of memory) shows "-" and a line under
# the row says why, and the table goes on; an AMP run that skipped steps or had losses that were
# not finite gets such a line too.
# Also the share of a step that DGC's local work takes on the GPU (CNN_STEP_DGC: the fused
# accumulate + top-k selection at sparsity 0.999, encoding, pairs to the host) at each batch,
# all tensors in one batched call and tensor by tensor.
# Usage: bench/gpu_step.sh [BUILD_DIR]     (on a machine with a GPU and PyTorch)
#   ROUNDS=3 ITERS=10 REPEATS=1 BATCHES="64 256" PRECISIONS="f32 tf32 f16 bf16" COMPILE=0 DGC=1
#   PYTHON=python3 FLEET_CUDA_LOW_DTYPES=1 (f16 / bf16 rows: 0 times the emulation)
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
fleet_ms() { # fleet_ms BATCH PRECISION DET -> ms; its stderr (peak, amp line, error) in $err.f
  local env=(FLEET_CUDNN_DETERMINISTIC="$3")
  case $2 in
    f32) env+=(FLEET_CUDA_TF32=0 FLEET_CUDA_NHWC=0) ;;
    tf32) env+=(FLEET_CUDA_TF32=1 FLEET_CUDA_NHWC=0) ;;
    tf32nhwc) env+=(FLEET_CUDA_TF32=1 FLEET_CUDA_NHWC=1) ;; # channels-last, PyTorch's tf32 row
    f16 | bf16) # PyTorch's autocast row: TF32 off, channels-last; the table's low dtypes on
      env+=(FLEET_CUDA_TF32=0 FLEET_CUDA_NHWC=1 CNN_STEP_AMP="$2"
        FLEET_CUDA_LOW_DTYPES="${FLEET_CUDA_LOW_DTYPES:-1}") ;;
    *) echo "cnn_step: precision $2 is not f32, tf32, tf32nhwc, f16 or bf16" >"$err.f"; return 1 ;;
  esac
  env -u CNN_STEP_AMP -u CNN_STEP_DGC "${env[@]}" "$fleet" resnet50 "$1" "$iters" "$repeats" \
    cuda 2>"$err.f"
}
torch_ms() { "$py" "$here/gpu_step_torch.py" "$1" "$iters" "$repeats" "${2%nhwc}" "${3:-eager}" 2>"$err.t"; }
peak() { sed -nE 's/.*device memory peak ([0-9.]+) MiB.*/\1/p' "$1" | tail -1; }
# what fleet's AMP ran, from cnn_step's "amp float16 native N of M layers" line: native N/M,
# emulated, or - (f32)
ampmode() {
  sed -nE 's/^cnn_step: amp [a-z0-9]+ (native|emulated) ([0-9]+) of ([0-9]+) layers.*/\1 \2\/\3/p' \
    "$1" | sed -E 's/^emulated .*/emulated/' | tail -1
}
# why a run failed: its last line that says (cnn_step's or Python's error), cut to one line
why() { { grep -vE '^\s*$' "$1" || echo "(no message)"; } | tail -1 | cut -c1-160; }
# a sanity note on an AMP run: steps skipped or losses not finite
ampnote() {
  sed -nE 's/^cnn_step: amp .* ([0-9]+) of [0-9]+ updates .* skipped .*, ([0-9]+) losses not finite/\1 \2/p' \
    "$1" | awk '$1 > 0 || $2 > 0 { printf "%d steps skipped (inf/NaN gradients), %d losses not finite", $1, $2 }'
}

echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); PyTorch $("$py" -c 'import torch; print(torch.__version__)')"
[[ ${#precisions[@]} -gt 0 ]] && printf '%-6s %-5s | %9s %9s %9s %9s %8s | %9s %9s %8s | %6s %6s | %9s | %s\n' \
  batch prec "det ms" "img/s" "fast ms" "img/s" "peak MiB" "torch ms" "img/s" "peak MiB" \
  "r det" "r fast" "compile" "fleet amp"
for b in "${batches[@]}"; do
  for p in ${precisions[@]+"${precisions[@]}"}; do
    fl=() ff=() tr=() fpk="" tpk="" mode="" notes=() dead_d="" dead_f="" dead_t=""
    for ((r = 0; r < rounds; r++)); do # a cell that failed once is not tried again
      if [[ -z $dead_d ]]; then
        m=$(fleet_ms "$b" "$p" 1) && rc=0 || rc=$?
        if [[ $rc == 0 && -n $m ]]; then
          fl+=("$m") fpk=$(peak "$err.f") mode=$(ampmode "$err.f")
          n=$(ampnote "$err.f") && [[ -n $n ]] && notes+=("fleet deterministic: $n")
        else
          dead_d=1 notes+=("fleet deterministic failed (exit $rc): $(why "$err.f")")
        fi
      fi
      if [[ -z $dead_f ]]; then
        m=$(fleet_ms "$b" "$p" 0) && rc=0 || rc=$?
        if [[ $rc == 0 && -n $m ]]; then
          ff+=("$m") mode=${mode:-$(ampmode "$err.f")}
          n=$(ampnote "$err.f") && [[ -n $n ]] && notes+=("fleet fast: $n")
        else
          dead_f=1 notes+=("fleet fast failed (exit $rc): $(why "$err.f")")
        fi
      fi
      if [[ -z $dead_t ]]; then
        m=$(torch_ms "$b" "$p") && rc=0 || rc=$?
        if [[ $rc == 0 && -n $m ]]; then
          tr+=("$m") tpk=$(peak "$err.t")
        else
          dead_t=1 notes+=("torch failed (exit $rc): $(why "$err.t")")
        fi
      fi
    done
    fm=$([[ ${#fl[@]} -gt 0 ]] && printf '%s\n' "${fl[@]}" | median || echo 0)
    fq=$([[ ${#ff[@]} -gt 0 ]] && printf '%s\n' "${ff[@]}" | median || echo 0)
    tm=$([[ ${#tr[@]} -gt 0 ]] && printf '%s\n' "${tr[@]}" | median || echo 0)
    cm=0
    if [[ "${COMPILE:-0}" == 1 ]]; then
      cm=$(torch_ms "$b" "$p" compile) || { notes+=("torch.compile failed: $(why "$err.t")"); cm=0; }
    fi
    ratio() { awk -v f="$1" -v t="$tm" 'BEGIN { if (f > 0 && t > 0) printf "%.2f", t / f; else print "-" }'; }
    msf() { [[ $1 != 0 ]] && printf '%.2f' "$1" || echo -; }
    printf '%-6s %-5s | %9s %9s %9s %9s %8s | %9s %9s %8s | %6s %6s | %9s | %s\n' "$b" "$p" \
      "$(msf "$fm")" "$(ips "$b" "$fm")" "$(msf "$fq")" "$(ips "$b" "$fq")" "${fpk:--}" \
      "$(msf "$tm")" "$(ips "$b" "$tm")" "${tpk:--}" "$(ratio "$fm")" "$(ratio "$fq")" \
      "$([[ $cm != 0 ]] && ips "$b" "$cm" || echo -)" "${mode:--}"
    for n in ${notes[@]+"${notes[@]}"}; do echo "         ^ $b $p: $n"; done
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
