#!/usr/bin/env bash
# test_fleet_eval.sh - the inference model and fleet-eval end to end, and fleet's files read by
# other tools. 2 workers (fleetrun) train the MLP with checkpoint.inference_model set; fleet-eval
# runs the validation set and prints the loss and top-1 fleet-train printed for it; the .npy
# loads in NumPy; Debian's /usr/bin/python3 reads the checkpoint and the inference model with
# json + struct alone (checksums with zlib.crc32) and, when importable, NumPy and PyTorch, and
# their forward pass on fleet-eval's inputs gives fleet-eval's logits (1e-5). A damaged model
# (a flipped byte, a truncated file) is refused naming the file and the tensor. fleet-eval -c
# takes the samples from another data section and the network from the model. Without
# /usr/bin/python3 the Python half is skipped (exit 77 after the rest passed). Under
# FLEET_TEST_NUMERIC_ONLY=1 (numeric_only_lib.sh) only fleet-eval against fleet-train's numbers
# and against NumPy/PyTorch's forward pass: the rest is left to the native pass.
set -u
bin="${FLEET_BIN:?}"
src="${FLEET_SRC:?}"
reader="$src/tests/python/safetensors_read.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
source "$src/tests/cli/numeric_only_lib.sh"
for b in fleet-train fleet-eval fleetrun; do
  [ -x "$bin/$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done

cat >"$tmp/cfg.yaml" <<'EOF'
model: {type: mlp, hidden: [64, 32], activation: relu}
data: {type: teacher, features: 32, classes: 2, train_size: 2048, val_size: 1000, seed: 9}
optimizer: {type: momentum, momentum: 0.9, lr: {base: 0.1}}
train: {batch_size: 32, epochs: 2, log_interval: 16, seed: 3}
EOF
FLEET_COMM_TIMEOUT=60 timeout 180 "$bin/fleetrun" --nproc_per_node 2 --log_dir "$tmp/wlog" \
  "$bin/fleet-train" -c "$tmp/cfg.yaml" -o train.log_dir="$tmp/log" \
  -o checkpoint.dir="$tmp/ck" -o checkpoint.inference_model="$tmp/model.safetensors" \
  >"$tmp/train.out" 2>&1 || { echo "FAIL: training"; tail -5 "$tmp/train.out"; exit 1; }
line=$(grep 'eval train_loss' "$tmp/train.out" | tail -1)
val_loss=$(sed -E 's/.*val_loss ([0-9.]+).*/\1/' <<<"$line")
val_acc=$(sed -E 's/.*val_acc1 ([0-9.]+).*/\1/' <<<"$line")

if ! "$bin/fleet-eval" -m "$tmp/model.safetensors" --out "$tmp/logits.npy" \
     --inputs "$tmp/inputs.npy" >"$tmp/eval.out" 2>&1; then
  echo "FAIL: fleet-eval"; cat "$tmp/eval.out"; exit 1
fi
cat "$tmp/eval.out"
got_loss=$(sed -nE 's/.*loss ([0-9.]+), top1 ([0-9.]+).*/\1/p' "$tmp/eval.out")
got_acc=$(sed -nE 's/.*loss ([0-9.]+), top1 ([0-9.]+).*/\2/p' "$tmp/eval.out")
echo "fleet-train: val_loss $val_loss val_acc1 $val_acc; fleet-eval: loss $got_loss top1 $got_acc"
# fleet-train prints 4 decimals; its 2 ranks sum in another order than fleet-eval's one pass
awk -v a="$val_loss" -v b="$got_loss" -v c="$val_acc" -v d="$got_acc" \
  'BEGIN { exit !((a - b < 6e-5 && b - a < 6e-5) && (c - d < 6e-5 && d - c < 6e-5)) }' ||
  { echo "FAIL: fleet-eval's loss/top1 differ from fleet-train's evaluation"; fail=1; }
grep -q "1000 samples, 2 classes" "$tmp/eval.out" || { echo "FAIL: sample count"; fail=1; }
# the training checkpoint evaluates to the same bytes
if native_section "the checkpoint's logits"; then
  "$bin/fleet-eval" -m "$tmp/ck" --out "$tmp/logits_ck.npy" >/dev/null 2>&1 &&
    cmp -s "$tmp/logits.npy" "$tmp/logits_ck.npy" ||
    { echo "FAIL: the checkpoint's logits differ from the inference model's"; fail=1; }
fi

# another data section (-c): its samples, the model's network (a model.* key there is
# overridden by the model's own), from the inference model and from the checkpoint alike
if native_section "another data section (-c)"; then
  cat >"$tmp/data.yaml" <<'EOF'
model: {type: mlp, hidden: [8]}
data: {type: teacher, features: 32, classes: 2, train_size: 64, val_size: 300, seed: 9}
EOF
  for m in "$tmp/model.safetensors" "$tmp/ck"; do
    "$bin/fleet-eval" -m "$m" -c "$tmp/data.yaml" --out "$tmp/l300.npy" >"$tmp/e300.out" 2>&1 &&
      grep -q "300 samples, 2 classes" "$tmp/e300.out" &&
      [ "$(stat -c %s "$tmp/l300.npy")" -eq $((128 + 300 * 2 * 4)) ] ||
      { echo "FAIL: fleet-eval -m $m -c data.yaml"; cat "$tmp/e300.out"; fail=1; }
  done
fi

# damage: a flipped byte in the last tensor, a truncated file
if native_section "the damaged models"; then
  cp "$tmp/model.safetensors" "$tmp/flip.safetensors"
  size=$(stat -c %s "$tmp/flip.safetensors")
  printf '\x55' | dd of="$tmp/flip.safetensors" bs=1 seek=$((size - 3)) conv=notrunc 2>/dev/null
  if "$bin/fleet-eval" -m "$tmp/flip.safetensors" >"$tmp/flip.out" 2>&1 ||
     ! grep -q "flip.safetensors: tensor 'fc3.bias': checksum mismatch" "$tmp/flip.out"; then
    echo "FAIL: flipped byte not refused by name"; cat "$tmp/flip.out"; fail=1
  fi
  head -c $((size - 4)) "$tmp/model.safetensors" >"$tmp/cut.safetensors"
  if "$bin/fleet-eval" -m "$tmp/cut.safetensors" >"$tmp/cut.out" 2>&1 ||
     ! grep -q "cut.safetensors: tensor 'fc3.bias': data_offsets .* run past the end of the file" "$tmp/cut.out"; then
    echo "FAIL: truncated file not refused by name"; cat "$tmp/cut.out"; fail=1
  fi
  grep -h "error" "$tmp/flip.out" "$tmp/cut.out"
fi

py=/usr/bin/python3
if [ ! -x "$py" ]; then
  echo "SKIPPED: the Python half ($py missing)"
  numeric_only_report
  [ $fail -eq 0 ] && exit 77
  exit $fail
fi
if native_section "the files read in Python"; then
  latest="$tmp/ck/$(cat "$tmp/ck/latest")/model.safetensors"
  for f in "$latest" "$tmp/model.safetensors"; do
    out=$("$py" "$reader" check "$f" 2>&1) || { echo "FAIL: Python cannot read $f: $out"; fail=1; }
    echo "python: $(tail -1 <<<"$out")"
  done
  # the same values as fleet sees: fc1.bias printed by Python (struct) vs the bytes fleet wrote
  "$py" "$reader" values "$tmp/model.safetensors" fc3.bias >"$tmp/b.txt" &&
    [ "$(wc -l <"$tmp/b.txt")" -eq 2 ] || { echo "FAIL: values of fc3.bias"; fail=1; }
fi
if "$py" -c 'import numpy' 2>/dev/null; then
  if native_section "the .npy in NumPy"; then
    "$py" "$reader" npy "$tmp/logits.npy" | grep -q "(1000, 2) float32" ||
      { echo "FAIL: logits.npy in NumPy"; fail=1; }
  fi
  out=$("$py" "$reader" logits "$tmp/model.safetensors" "$tmp/logits.npy" "$tmp/inputs.npy" 2>&1) ||
    { echo "FAIL: logits differ from NumPy/PyTorch's forward: $out"; fail=1; }
  echo "$out"
else
  echo "note: NumPy not importable under $py: the NumPy checks skipped"
fi
numeric_only_report
exit $fail
