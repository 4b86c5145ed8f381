#!/usr/bin/env bash
# test_fleet_train_cnn.sh - a CIFAR-style ResNet learns the synthetic image task on 2 workers:
# configs/shapes_resnet.yaml made small enough for CI (ResNet-8, 16x16 images, 2 epochs of 8192
# images in global batches of 2 x 16: 512 steps) reaches >= 90% validation accuracy; with a
# loader thread per worker the losses are those of the run without one (the threaded loader
# makes the same batches); configs/shapes_resnet_dgc.yaml trains, made small, with the same losses
# whether DGC sends from the gradient-ready hooks or after backward; image keys that cannot work
# are refused naming the key. Under FLEET_TEST_NUMERIC_ONLY=1 (numeric_only_lib.sh) only the
# first run and its checks: the runs equal to other runs and the refused keys are left to the
# native pass.
set -u
bin="${FLEET_BIN:?}/fleet-train"
run="${FLEET_BIN:?}/fleetrun"
cfg="${FLEET_SRC:?}/configs/shapes_resnet.yaml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
source "${FLEET_SRC:?}/tests/cli/numeric_only_lib.sh"
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}
if [ ! -x "$run" ] || [ ! -x "$bin" ]; then
  echo "SKIPPED: fleetrun or fleet-train not built"; exit 77
fi
cd "$tmp" || exit 1
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD
small=(-o model.depth=8 -o data.image_size=16 -o data.train_size=8192 -o data.val_size=1024
  -o train.batch_size=16 -o train.epochs=2 -o train.log_interval=64 -o train.threads=1
  -o optimizer.lr.decay_steps=462) # the cosine's length whether the run stops early or not

# 1. learns: >= 90% on the validation set, 2 workers, a loader thread each
timeout 600 "$run" --nproc_per_node 2 --log_dir "$tmp/logA" "$bin" -c "$cfg" "${small[@]}" \
  -o data.num_workers=1 >"$tmp/A.out" 2>&1
check "2 workers: exit 0" test $? -eq 0
acc=$(grep '^worker_index: 0, .*eval ' "$tmp/A.out" | tail -1 | sed -E 's/.*val_acc1 ([0-9.]+).*/\1/')
echo "ResNet-8 on 16x16 shapes, 512 steps of 2 x 16: validation accuracy ${acc:-none}"
check "validation accuracy ${acc:-none} >= 0.90" awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.90) }'
check "512 steps" grep -q '^worker_index: 0, epoch 1, step 512, eval' "$tmp/A.out"

# 2. the same run's first 128 steps without loader threads print the same losses
if native_section "2 (loader threads)"; then
  timeout 300 "$run" --nproc_per_node 2 --log_dir "$tmp/logB" "$bin" -c "$cfg" "${small[@]}" \
    -o data.num_workers=0 -o train.max_steps=128 >"$tmp/B.out" 2>&1
  check "no loader threads: exit 0" test $? -eq 0
  losses() { grep "^worker_index: 0, epoch 0, step \(64\|128\), loss" "$1" | sed -E 's/, ips .*//'; }
  losses "$tmp/A.out" >"$tmp/A.loss"
  losses "$tmp/B.out" >"$tmp/B.loss"
  check "threaded loader: the same losses" bash -c "test -s '$tmp/A.loss' && cmp -s '$tmp/A.loss' '$tmp/B.loss'"
fi

# 4. the CNN's DGC config, small: dense for 16 steps, the warm-up schedule over 32 (0.75 falls
# back to dense on 2 workers), then 0.999 on the stage-3 convolutions; the residual network's
# gradient-ready hooks send each compressed tensor during backward, and sending them all after
# backward instead (overlap off) gives the same losses, bit for bit
if native_section "4 (DGC, overlap on and off)"; then
  dgc_small=("${small[@]}" -o data.num_workers=0 -o train.max_steps=96 -o train.log_interval=32
    -o strategy.dgc_configs.rampup_begin_step=16 -o strategy.dgc_configs.rampup_step=32)
  dcfg="${FLEET_SRC:?}/configs/shapes_resnet_dgc.yaml"
  FLEET_LOG_LEVEL=info timeout 300 "$run" --nproc_per_node 2 --log_dir "$tmp/logD" "$bin" \
    -c "$dcfg" "${dgc_small[@]}" >"$tmp/D.out" 2>&1
  check "shapes_resnet_dgc.yaml: exit 0" test $? -eq 0
  check "shapes_resnet_dgc.yaml: stage-3 convolutions compressed" \
    grep -qE 'strategy dgc: 2 tensors \(55296 values\) compressed' "$tmp/D.out"
  FLEET_LOG_LEVEL=info timeout 300 "$run" --nproc_per_node 2 --log_dir "$tmp/logE" "$bin" \
    -c "$dcfg" "${dgc_small[@]}" -o strategy.overlap=false >"$tmp/E.out" 2>&1
  check "shapes_resnet_dgc.yaml, overlap off: exit 0" test $? -eq 0
  dlosses() { grep "^worker_index: 0, epoch 0, step \(32\|64\|96\), loss" "$1" | sed -E 's/, ips .*//'; }
  dlosses "$tmp/D.out" >"$tmp/D.loss"
  dlosses "$tmp/E.out" >"$tmp/E.loss"
  cat "$tmp/D.loss"
  check "DGC on the ResNet: the same losses with and without overlap" \
    bash -c "test \$(wc -l <'$tmp/D.loss') -eq 3 && cmp -s '$tmp/D.loss' '$tmp/E.loss'"
fi

# 3. keys that cannot work stop before training, naming the key
if native_section "3 (refused keys)"; then
  refused() { # refused KEY OVERRIDES...
    local key=$1; shift
    "$bin" -c "$cfg" "$@" >"$tmp/r.out" 2>&1
    local rc=$?
    check "$* refused (exit $rc)" test $rc -eq 2
    check "$* message names $key" grep -q "$key" "$tmp/r.out"
  }
  refused model.type -o model.type=mlp
  refused data.classes -o data.classes=12
  refused data.root -o data.type=cifar10
  refused data.train_list -o data.type=imagelist -o data.root=/tmp
  refused model.depth -o model.depth=21
  refused model.depth -o model.type=resnet -o model.depth=20
  refused model.type -o data.type=teacher
  refused data.classes -o data.type=cifar10 -o data.root=/tmp -o data.classes=8
  refused data.lower_ratio -o data.lower_ratio=2 -o data.upper_ratio=1.5
fi
numeric_only_report
exit $fail
