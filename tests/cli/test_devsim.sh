#!/usr/bin/env bash
# test_devsim.sh - fleet-train on a device without a GPU: fleet-train-devsim is fleet-train with
# train.device: gpu served by tests/support/devsim (the cpu table behind a memory the host
# cannot touch: any host read or write of it outside the table aborts, naming the allocation,
# as does host memory handed to its kernels). Every run here is made twice, on the cpu backend
# and on devsim, and must print the same losses, accuracies and evaluations and end with the
# same checkpoint tensors, bit for bit: an MLP (one worker, evaluations, the inference model and
# fleet-eval on it), configs/quickstart.yaml, a CIFAR ResNet-8 on the shapes task (one worker,
# and two under fleetrun with dense buckets overlapped with backward), the MLP on two workers
# with f16 allreduce and gradient merge, DGC after its rampup (allgather with the dense
# fallback; on 6 workers the sparse exchange at a 4 k budget, which drops pairs), Local SGD,
# mixed precision (float16, an injected inf skipped on both workers; and with its activations
# natively in float16 on devsim over the ref table, FLEET_DEVSIM_TABLE=ref), and resumes of
# stopped devsim runs (ResNet-8; DGC on two workers) against the uninterrupted cpu runs. Then
# the device selection: fleetrun --gpus gives each worker its GPU (FLAGS_selected_gpus), and
# train.device: gpu without a GPU backend, with train.backend cpu, or with a GPU that is not
# there is refused before training (exit 2) by a message naming train.device.
set -u
bin="${FLEET_BIN:?}"
build="${FLEET_BUILD:?}"
dev="$build/tests/support/fleet-train-devsim"
deval="$build/tests/support/fleet-eval-devsim"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for b in "$bin/fleet-train" "$bin/fleetrun" "$bin/fleet-ckpt" "$bin/fleet-eval" "$dev" "$deval"; do
  [ -x "$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done
# Results do not depend on the thread count; idle OpenMP threads that spin would only slow
# devsim's runs down (its guard makes a system call per kernel) on this shared machine.
export OMP_WAIT_POLICY=passive

cat >"$tmp/mlp.yaml" <<'EOF'
model: {type: mlp, hidden: [64, 64], activation: tanh}
data: {type: teacher, features: 32, classes: 2, train_size: 1024, val_size: 256, teacher_hidden: 16, seed: 3}
optimizer:
  type: momentum
  momentum: 0.9
  weight_decay: 0.0001
  lr: {base: 0.1, schedule: cosine, decay_steps: 80, warmup_steps: 4}
train: {batch_size: 32, epochs: 2, max_steps: 24, log_interval: 4, seed: 7}
EOF
cat >"$tmp/r8.yaml" <<'EOF'
model: {type: resnet_cifar, depth: 8, shortcut: A}
data: {type: shapes, classes: 10, image_size: 16, train_size: 256, val_size: 64, seed: 1}
optimizer:
  type: momentum
  momentum: 0.9
  weight_decay: 0.0005
  label_smoothing: 0.1
  lr: {base: 0.05, schedule: cosine, decay_steps: 40, warmup_steps: 4}
train: {batch_size: 16, epochs: 2, max_steps: 20, log_interval: 4, seed: 5}
EOF

# launch PROG N NAME CFG ARGS...: PROG on N workers (1: a plain process); output in $tmp/NAME.*,
# worker logs in $tmp/wlog_NAME; $gpus (if set) is fleetrun's --gpus instead of N.
launch() {
  local prog=$1 n=$2 name=$3 cfg=$4
  shift 4
  if [ "$n" = 1 ]; then
    timeout 120 "$prog" -c "$tmp/$cfg.yaml" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  else
    local who=(--nproc_per_node "$n")
    [ -n "${gpus:-}" ] && who=(--gpus "$gpus")
    FLEET_COMM_TIMEOUT=60 timeout 180 "$bin/fleetrun" "${who[@]}" --log_dir "$tmp/wlog_$name" \
      "$prog" -c "$tmp/$cfg.yaml" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  fi
  local rc=$?
  [ $rc -eq 0 ] || { echo "FAIL: $name exited $rc"; tail -n 5 "$tmp/$name.out" "$tmp/$name.err"; fail=1; }
  return $rc
}

# the progress and evaluation lines of rank r, without the timings and memory
lines() { # lines NAME N R
  local f="$tmp/$1.out"
  [ "$2" = 1 ] || f="$tmp/wlog_$1/workerlog.$3"
  grep '^worker_index:' "$f" | sed 's/, ips .*//'
}

same_lines() { # same_lines WHAT A B N
  local r
  for ((r = 0; r < $4; r++)); do
    if ! diff <(lines "$2" "$4" "$r") <(lines "$3" "$4" "$r") >"$tmp/diff" ||
       [ "$(lines "$2" "$4" "$r" | wc -l)" -lt 3 ]; then
      echo "FAIL: $1: rank $r's lines differ between cpu and devsim:"; head -20 "$tmp/diff"; fail=1; return 1
    fi
  done
}

same_end() { # same_end WHAT DIR_A DIR_B NFILES: the latest checkpoints hold identical tensors
  local what=$1 a=$2 b=$3 n=$4 la lb f out=""
  la=$(cat "$a/latest" 2>/dev/null); lb=$(cat "$b/latest" 2>/dev/null)
  if [ -z "$la" ] || [ "$la" != "$lb" ]; then
    echo "FAIL: $what: latest '$la' vs '$lb'"; fail=1; return 1
  fi
  local files=(model.safetensors)
  [ "$n" = 1 ] || { files=(); for ((r = 0; r < n; r++)); do files+=("rank_$r.safetensors"); done; }
  for f in "${files[@]}"; do
    if ! out=$("$bin/fleet-ckpt" diff "$a/$la/$f" "$b/$lb/$f" 2>&1); then
      echo "FAIL: $what: $la/$f differs: $out"; fail=1; return 1
    fi
  done
  echo "ok: $what: $la ${files[*]} identical"
}

# pair NAME N NFILES CFG ARGS...: the same run on cpu and devsim, compared
pair() {
  local name=$1 n=$2 nf=$3 cfg=$4
  shift 4
  launch "$bin/fleet-train" "$n" "${name}_cpu" "$cfg" -o train.backend=cpu \
    -o checkpoint.dir="$tmp/$name/cpu" "$@" || return 1
  launch "$dev" "$n" "${name}_dev" "$cfg" -o train.device=gpu \
    -o checkpoint.dir="$tmp/$name/dev" "$@" || return 1
  same_lines "$name" "${name}_cpu" "${name}_dev" "$n" &&
    same_end "$name: cpu and devsim" "$tmp/$name/cpu" "$tmp/$name/dev" "$nf"
}

# resumed NAME N NFILES CFG STOP ARGS...: devsim stopped at STOP and resumed ends as the cpu run
# `pair NAME` did
resumed() {
  local name=$1 n=$2 nf=$3 cfg=$4 stop=$5
  shift 5
  launch "$dev" "$n" "${name}_stop" "$cfg" -o train.device=gpu -o checkpoint.dir="$tmp/$name/part" \
    -o train.max_steps="$stop" "$@" &&
    launch "$dev" "$n" "${name}_resume" "$cfg" -o train.device=gpu \
      -o checkpoint.dir="$tmp/$name/part" --resume "$tmp/$name/part" "$@" &&
    same_end "$name: devsim stopped at $stop and resumed = cpu uninterrupted" "$tmp/$name/cpu" \
      "$tmp/$name/part" "$nf"
}

# 1. the MLP on one worker: two epochs (an evaluation between them), a periodic checkpoint, the
# inference model, and fleet-eval on it (devsim's model says train.device gpu: fleet-eval-devsim
# evaluates it on devsim)
one=(-o train.max_steps=0 -o checkpoint.save_interval=16)
launch "$bin/fleet-train" 1 mlp1_cpu mlp -o train.backend=cpu -o checkpoint.dir="$tmp/mlp1/cpu" \
    "${one[@]}" -o checkpoint.inference_model="$tmp/model_cpu.safetensors" &&
  launch "$dev" 1 mlp1_dev mlp -o train.device=gpu -o checkpoint.dir="$tmp/mlp1/dev" \
    "${one[@]}" -o checkpoint.inference_model="$tmp/model_dev.safetensors" &&
  same_lines mlp1 mlp1_cpu mlp1_dev 1 && same_end "mlp1: cpu and devsim" "$tmp/mlp1/cpu" "$tmp/mlp1/dev" 1 &&
  "$bin/fleet-ckpt" diff "$tmp/model_cpu.safetensors" "$tmp/model_dev.safetensors" >/dev/null &&
  echo "ok: mlp1: inference models identical" || { echo "FAIL: mlp1: inference models"; fail=1; }
grep -q 'dev_peak [0-9]* MB' "$tmp/mlp1_dev.out" && ! grep -q dev_peak "$tmp/mlp1_cpu.out" ||
  { echo "FAIL: dev_peak in devsim's progress lines only"; fail=1; }
"$bin/fleet-eval" -m "$tmp/model_cpu.safetensors" --out "$tmp/cpu.npy" >"$tmp/ev_cpu.out" 2>&1 &&
  "$deval" -m "$tmp/model_dev.safetensors" --out "$tmp/dev.npy" >"$tmp/ev_dev.out" 2>&1 &&
  grep -q "backend devsim" "$tmp/ev_dev.out" && cmp -s "$tmp/cpu.npy" "$tmp/dev.npy" &&
  diff <(grep samples "$tmp/ev_cpu.out") <(grep samples "$tmp/ev_dev.out") &&
  echo "ok: fleet-eval on devsim: the same logits and $(grep -o 'loss [0-9.]*' "$tmp/ev_dev.out")" ||
  { echo "FAIL: fleet-eval on cpu and devsim"; cat "$tmp/ev_cpu.out" "$tmp/ev_dev.out"; fail=1; }

# the quick start itself, 40 steps and the final evaluation
cp "${FLEET_SRC:?}/configs/quickstart.yaml" "$tmp/quickstart.yaml"
pair quickstart 1 1 quickstart -o train.max_steps=40 -o train.log_interval=8 \
  -o train.log_dir="$tmp/qs_log"

# 2. ResNet-8 on shapes, one worker (batch norm's running statistics, evaluation after epoch 0),
# and resumed from a devsim checkpoint at step 10
pair r8 1 1 r8 && resumed r8 1 1 r8 10
# 3. two workers, dense buckets overlapped with backward (comm threads see host copies only);
# their running statistics averaged before each evaluation
pair r8x2 2 1 r8 -o strategy.fuse_grad_size_in_MB=0.05
# 4. f16 allreduce and gradient merge
pair f16x2 2 1 mlp -o strategy.fp16_allreduce=true -o strategy.gradient_merge=true \
  -o strategy.gradient_merge_configs.k_steps=2
# 5. DGC: dense until step 4, then sparsity 0.5 (the dense fallback at 2 workers) and 0.99
# (pairs); the devsim workers get GPUs 3 and 1 from fleetrun --gpus; resumed at step 10
dgc=(-o strategy.dgc=true -o strategy.dgc_configs.rampup_begin_step=4
     -o strategy.dgc_configs.rampup_step=8 -o "strategy.dgc_configs.sparsity=[0.5, 0.99]"
     -o strategy.dgc_configs.min_compress_numel=1000)
launch "$bin/fleet-train" 2 dgc_cpu mlp -o train.backend=cpu -o checkpoint.dir="$tmp/dgc/cpu" "${dgc[@]}" &&
  gpus=3,1 launch "$dev" 2 dgc_dev mlp -o train.device=gpu -o checkpoint.dir="$tmp/dgc/dev" "${dgc[@]}" &&
  same_lines dgc dgc_cpu dgc_dev 2 && same_end "dgc: cpu and devsim" "$tmp/dgc/cpu" "$tmp/dgc/dev" 2 &&
  grep -q "sparse allgather would send more" "$tmp/wlog_dgc_dev/workerlog.0" &&
  grep -q "exchange by allgather" "$tmp/wlog_dgc_dev/workerlog.0" &&
  grep -q "selection in 1 batched groups" "$tmp/wlog_dgc_dev/workerlog.0" ||
  { echo "FAIL: dgc: the dense fallback and the sparse steps did not both run, batched"; fail=1; }
grep -q "gpu 3 bound" "$tmp/wlog_dgc_dev/workerlog.0" && grep -q "gpu 1 bound" "$tmp/wlog_dgc_dev/workerlog.1" &&
  echo "ok: fleetrun --gpus 3,1: the workers bound GPUs 3 and 1" ||
  { echo "FAIL: the workers did not bind the GPUs fleetrun --gpus gave them"; fail=1; }
resumed dgc 2 2 mlp 10 "${dgc[@]}"
# 6. DGC's sparse exchange on 6 workers, where a budget of 4 k drops pairs (the default, 7 k,
# holds 6 workers' union): the dropped ones go back into v, the kept ones are masked in u
OMP_NUM_THREADS=1 pair dgcsp 6 6 mlp "${dgc[@]}" -o "strategy.dgc_configs.sparsity=[0.99]" \
  -o strategy.dgc_configs.rampup_begin_step=2 -o strategy.dgc_configs.exchange=sparse \
  -o strategy.dgc_configs.sparse_budget=4 \
  -o train.batch_size=16 -o train.max_steps=20 -o train.log_dir="$tmp/dgcsp_log" &&
  grep -q '"dgc_dropped":0\.[0-9]*[1-9]' "$tmp/dgcsp_log/metrics.jsonl" &&
  echo "ok: dgcsp: the sparse exchange dropped pairs" ||
  { echo "FAIL: dgcsp: no pairs dropped by the sparse exchange"; fail=1; }
# 7. Local SGD
pair lsgd 2 2 mlp -o strategy.localsgd=true -o strategy.localsgd_configs.k_steps=4
# 7b. mixed precision on the device (its amp_round, the loss scaling), ResNet-8 in float16 on
# two workers with an inf injected at step 6: skipped alike on both
FLEET_AMP_INJECT_INF=6 pair ampx2 2 1 r8 -o strategy.amp=true &&
  grep -q 'skipped 1$' "$tmp/wlog_ampx2_dev/workerlog.1" &&
  echo "ok: ampx2: the injected inf was skipped on the devsim workers" ||
  { echo "FAIL: ampx2: no skipped step on the devsim workers"; fail=1; }
# 7c. activations natively in float16 on the device (docs/amp.md): devsim over the ref table
# (FLEET_DEVSIM_TABLE=ref passes on its low dtypes and convert) runs the MLP's fc layers and
# tanh in float16 with its conversions at the edges under the memory rule, and matches
# fleet-train on the ref table bit for bit (the MLP only: the ref's convolutions take ~7 CPU-s a
# ResNet-8 step)
lowp=(-o strategy.amp=true -o train.max_steps=12)
launch "$bin/fleet-train" 1 lowp_ref mlp -o train.backend=ref -o checkpoint.dir="$tmp/lowp/cpu" \
    "${lowp[@]}" &&
  FLEET_DEVSIM_TABLE=ref launch "$dev" 1 lowp_dev mlp -o train.device=gpu \
    -o checkpoint.dir="$tmp/lowp/dev" "${lowp[@]}" &&
  cat "$tmp/lowp_dev.out" "$tmp/lowp_dev.err" |
    grep -q 'native float16 activations on the devsim table (5 of 5 layers' &&
  echo "ok: lowp: native float16 activations on devsim" &&
  same_lines lowp lowp_ref lowp_dev 1 &&
  same_end "lowp: ref and devsim over ref" "$tmp/lowp/cpu" "$tmp/lowp/dev" 1 ||
  { echo "FAIL: lowp: native float16 on devsim over the ref table"; fail=1; }

# 8. device selection refused before training, naming train.device
refused() { # refused WHAT PATTERN PROG ARGS...
  local what=$1 pat=$2 prog=$3 rc
  shift 3
  "$prog" -c "$tmp/mlp.yaml" "$@" >"$tmp/r.out" 2>&1
  rc=$?
  if [ $rc -eq 2 ] && grep -q "$pat" "$tmp/r.out" && ! grep -q '^worker_index' "$tmp/r.out"; then
    echo "ok: $what: $(grep error "$tmp/r.out" | head -1)"
  else
    echo "FAIL: $what (exit $rc)"; cat "$tmp/r.out"; fail=1
  fi
}
# no GPU here: built without CUDA, or with it and no device (a GPU machine trains instead)
if "$bin/fleet-train" -c "$tmp/mlp.yaml" -o train.device=gpu -o train.max_steps=1 >"$tmp/g.out" 2>&1; then
  echo "ok: no GPU backend: not checked, a GPU is at hand: $(grep 'train.device: gpu' "$tmp/g.out" | head -1)"
else
  refused "no GPU backend" "train.device: gpu, but this fleet was built without CUDA\|train.device: gpu, but GPU 0 (FLAGS_selected_gpus) cannot be used: CUDA device 0: no CUDA device" \
    "$bin/fleet-train" -o train.device=gpu
fi
refused "gpu with a CPU backend" "train.device: gpu needs train.backend auto or cuda, but it is cpu" \
  "$bin/fleet-train" -o train.device=gpu -o train.backend=cpu
refused "cuda on the CPU" "train.backend: cuda computes on a GPU: it needs train.device: gpu" \
  "$bin/fleet-train" -o train.backend=cuda
FLAGS_selected_gpus=9 refused "a GPU that is not there" \
  "train.device: gpu, but GPU 9 (FLAGS_selected_gpus) cannot be used: devsim: device 9" \
  "$dev" -o train.device=gpu
exit $fail
