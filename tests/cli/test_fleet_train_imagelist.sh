#!/usr/bin/env bash
# test_fleet_train_imagelist.sh - fleet-train and fleet-eval end to end on an ImageNet-style
# folder of JPEGs with seed 002's train.txt / val.txt lists, written by tests/data/
# make_image_tree (640 training and 200 validation images of 6 stripe classes, 40-90 px wide,
# aspect ratios 0.6-1.6; chance is 1/6):
#  a. 2 workers (fleetrun, a loader thread each) train a CIFAR ResNet-8 on 32 x 32 crops
#     (random resized crops and flips; evaluation: short side 36, centre crop 32) for 3 epochs
#     of 20 steps and reach >= 60% validation accuracy (measured: 93.5-94% here; 81.5-99.5% over
#     other tree and training seeds). The ranks' batch-norm statistics differ mid-epoch (one
#     checkpoint file per rank at step 25) and are averaged before each evaluation (the final
#     checkpoint is one file for both ranks); resumed from step 25 the run ends with the
#     uninterrupted run's bytes.
#  b. a training list with a missing image (line 7) and a truncated JPEG (line 12): under
#     data.bad_images=skip the epoch completes and the ranks report them, 1 missing + 1 corrupt
#     in all (640 = 20 x 32: every sample is in exactly one rank's shard of the epoch); under
#     data.bad_images=fail the job fails naming the list line and the file. fleet-eval over
#     that list writes a row per image loaded (638) and warns that 2 of 640 were skipped.
#  c. a malformed list line stops the job before training, naming list:line.
#  d. fleet-eval on the inference model of run a over val.txt prints top-1 and top-5; top-1 and
#     the loss are what fleet-train printed for the validation set at the end; the checkpoint
#     gives the same logits; the .npy loads in NumPy (Debian's /usr/bin/python3) as (200, 6)
#     float32 whose argmax against val.txt's labels gives the same top-1. Without
#     /usr/bin/python3 + NumPy that last part is skipped (exit 77 after the rest passed).
# Under FLEET_TEST_NUMERIC_ONLY=1 (numeric_only_lib.sh) only a's run and its accuracy and d's
# fleet-eval against fleet-train's numbers: a's resumed run, b, c, and d's checkpoint and NumPy
# parts are left to the native pass.
set -u
bin="${FLEET_BIN:?}"
maker="${FLEET_BUILD:?}/tests/data/make_image_tree"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
source "${FLEET_SRC:?}/tests/cli/numeric_only_lib.sh"
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}
for b in "$bin/fleet-train" "$bin/fleet-eval" "$bin/fleetrun" "$bin/fleet-ckpt" "$maker"; do
  [ -x "$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done
cd "$tmp" || exit 1
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD
export FLEET_COMM_TIMEOUT=60

"$maker" tree --train 640 --val 200 --classes 6 --seed 1 --bad >"$tmp/tree.out" 2>&1 ||
  { echo "FAIL: make_image_tree"; cat "$tmp/tree.out"; exit 1; }
cat >"$tmp/cfg.yaml" <<'EOF'
model: {type: resnet_cifar, depth: 8}
data:
  type: imagelist
  classes: 6
  root: tree
  train_list: tree/train.txt
  val_list: tree/val.txt
  crop_size: 32
  resize_short_size: 36
  lower_scale: 0.25
  augment: true
  bad_images: skip
  num_workers: 1
  prefetch: 2
optimizer:
  type: momentum
  momentum: 0.9
  weight_decay: 0.0001
  lr: {base: 0.1, schedule: cosine}
train: {batch_size: 16, epochs: 3, log_interval: 10, seed: 5, threads: 1}
EOF
train() { # train NAME OVERRIDES...: 2 workers; output in $tmp/NAME.out, logs in $tmp/NAME.log/
  local name=$1; shift
  local o=()
  for kv in "$@"; do o+=(-o "$kv"); done
  timeout 180 "$bin/fleetrun" --nproc_per_node 2 --log_dir "$tmp/$name.log" \
    "$bin/fleet-train" -c "$tmp/cfg.yaml" "${o[@]}" >"$tmp/$name.out" 2>&1
}

# a. learns, 2 workers; saves checkpoints (steps 25 and 50 mid-epoch, 60 at the end) and the
# inference model
train a checkpoint.dir=ck checkpoint.save_interval=25 checkpoint.keep=0 \
  checkpoint.inference_model=model.safetensors
check "a: exit 0" test $? -eq 0
line=$(grep '^worker_index: 0, epoch 2, step 60, eval ' "$tmp/a.out" | tail -1)
val_loss=$(sed -nE 's/.*val_loss ([0-9.]+).*/\1/p' <<<"$line")
val_acc=$(sed -nE 's/.*val_acc1 ([0-9.]+).*/\1/p' <<<"$line")
echo "a: ResNet-8, 3 epochs of 20 steps of 2 x 16 JPEG crops: val_loss ${val_loss:-none}," \
  "val_acc1 ${val_acc:-none}"
check "a: validation accuracy ${val_acc:-none} >= 0.60 (chance 0.17)" \
  awk -v a="${val_acc:-0}" 'BEGIN { exit !(a >= 0.60) }'
check "a: mid-epoch, the ranks' running statistics differ: one checkpoint file per rank" \
  test -s ck/step_00000025/rank_1.safetensors
check "a: the ranks agree after averaging their running statistics: one checkpoint file" \
  test -s ck/step_00000060/model.safetensors -a ! -e ck/step_00000060/rank_1.safetensors
# resumed mid-epoch 1 (image-list data position, per-rank statistics, two averagings to go):
# the uninterrupted run's final state, bit for bit, and its last eval line
if native_section "a (the resumed run)"; then
  train r checkpoint.dir=ck_r checkpoint.resume=ck/step_00000025
  check "a: resume from step 25: exit 0" test $? -eq 0
  check "a: resume from step 25: the final checkpoint is the uninterrupted run's" \
    "$bin/fleet-ckpt" diff ck/step_00000060 ck_r/step_00000060
  check "a: resume from step 25: the same final eval line" \
    grep -qxF "${line:-no eval line in a.out}" "$tmp/r.out"
fi
check "a: no image skipped" bash -c "! grep -q skipped '$tmp/a.out'"

# d. fleet-eval on the inference model over val.txt: fleet-train's validation numbers
if "$bin/fleet-eval" -m model.safetensors --out logits.npy >"$tmp/eval.out" 2>&1; then
  cat "$tmp/eval.out"
  num='([0-9.]+)'
  got=$(sed -nE "s/.*200 samples, 6 classes, loss $num, top1 $num, top5 $num.*/\\1 \\2 \\3/p" \
    "$tmp/eval.out")
  read -r got_loss got_acc got_top5 <<<"$got"
  check "d: fleet-eval prints 200 samples, 6 classes, loss, top1, top5" test -n "${got_top5:-}"
  # fleet-train prints 4 decimals; accuracies are counts / 200, exact at 4 decimals
  near() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { exit !(a - b < tol && b - a < tol) }'; }
  check "d: fleet-eval top1 ${got_acc:-none} = fleet-train val_acc1 ${val_acc:-none}" \
    near "${val_acc:--1}" "${got_acc:-9}" 5e-5
  check "d: fleet-eval loss ${got_loss:-none} = fleet-train val_loss ${val_loss:-none}" \
    near "${val_loss:--1}" "${got_loss:-9}" 6e-5
  if native_section "d (the checkpoint's logits)"; then
    "$bin/fleet-eval" -m ck --out logits_ck.npy >/dev/null 2>&1
    check "d: the checkpoint's logits are the inference model's" cmp -s logits.npy logits_ck.npy
  fi
else
  echo "FAIL: fleet-eval"; cat "$tmp/eval.out"; fail=1
fi

# b. bad images: skipped and reported under skip, the job's failure under fail
if native_section "b (bad images)"; then
  train skip data.train_list=tree/train_bad.txt train.epochs=1 train.eval_train=false
  check "b: skip: exit 0" test $? -eq 0
  check "b: skip: the epoch completes" \
    grep -q '^worker_index: 0, epoch 0, step 20, eval' "$tmp/skip.out"
  grep -h 'train_bad.txt: skipped' "$tmp"/skip.log/workerlog.* | tee "$tmp/skipped.txt"
  pat='.*epoch 0, tree/train_bad.txt: skipped ([0-9]+) images? .([0-9]+) missing, ([0-9]+) corrupt.'
  sums=$(sed -nE "s|$pat|\\1 \\2 \\3|p" "$tmp/skipped.txt" |
    awk '{ n += $1; m += $2; c += $3 } END { print n + 0, m + 0, c + 0 }')
  check "b: skip: the ranks report 2 skipped (1 missing, 1 corrupt) in all, not '$sums'" \
    test "$sums" = "2 1 1"
  # fleet-eval over that list: a row per image loaded, and a warning that says how many are not
  "$bin/fleet-eval" -m model.safetensors -o data.val_list=tree/train_bad.txt --out skip.npy \
    >"$tmp/evalskip.out" 2>&1
  check "b: fleet-eval over the bad list: exit 0" test $? -eq 0
  check "b: fleet-eval over the bad list: 638 rows" \
    test "$(stat -c %s skip.npy 2>/dev/null)" = $((128 + 638 * 6 * 4))
  check "b: fleet-eval over the bad list: 638 samples" \
    grep -q '638 samples, 6 classes' "$tmp/evalskip.out"
  check "b: fleet-eval over the bad list: says 2 of 640 skipped" \
    grep -q '2 of 640 images skipped as missing or corrupt' "$tmp/evalskip.out"
  train badfail data.train_list=tree/train_bad.txt data.bad_images=fail
  rc=$?
  check "b: fail: the job fails (exit $rc)" test $rc -ne 0 -a $rc -ne 124
  cat "$tmp/badfail.out" "$tmp"/badfail.log/workerlog.* >"$tmp/badfail.all" 2>/dev/null
  grep -m1 'error: loader' "$tmp/badfail.all"
  missing='7: tree/train/missing/absent.jpeg: cannot open'
  corrupt='12: tree/train/truncated.jpeg: corrupt JPEG'
  check "b: fail: the message names the list line and the file" \
    grep -qE "tree/train_bad.txt:($missing|$corrupt)" "$tmp/badfail.all"
fi

# c. a malformed line stops the job before training, naming list:line
if native_section "c (a malformed list)"; then
  { head -2 tree/train.txt; echo "train/n00000002/00002.jpeg"; tail -n +4 tree/train.txt; } \
    >tree/malformed.txt
  train malformed data.train_list=tree/malformed.txt
  rc=$?
  check "c: malformed list: the job fails (exit $rc)" test $rc -ne 0 -a $rc -ne 124
  grep -m1 'error' "$tmp/malformed.out"
  check "c: the message names tree/malformed.txt:3" \
    grep -q "tree/malformed.txt:3: 'train/n00000002/00002.jpeg' has no label" "$tmp/malformed.out"
  check "c: no training started" bash -c "! grep -q 'training [0-9]* epochs' '$tmp/malformed.out'"
fi

# d, the NumPy half: the .npy's shape, dtype and top-1
if native_section "d (the .npy in NumPy)"; then
  py=/usr/bin/python3
  if [ ! -x "$py" ] || ! "$py" -c 'import numpy' 2>/dev/null; then
    echo "SKIPPED: /usr/bin/python3 with numpy not found; the .npy was not read"
    [ $fail -eq 0 ] && exit 77
    exit $fail
  fi
  check "d: numpy loads the logits as (200, 6) float32 with top-1 ${got_acc:-none}" \
    "$py" - logits.npy tree/val.txt "${got_acc:-none}" <<'EOF'
import sys
import numpy as np
logits = np.load(sys.argv[1])
labels = np.array([int(line.split()[1]) for line in open(sys.argv[2]) if line.strip()])
top1 = float((logits.argmax(axis=1) == labels).mean())
print(f"numpy: logits {logits.shape} {logits.dtype}, top1 {top1:.6f}")
ok = logits.shape == (200, 6) and logits.dtype == np.float32 and np.isfinite(logits).all()
sys.exit(0 if ok and abs(top1 - float(sys.argv[3])) < 1e-9 else 1)
EOF
fi
numeric_only_report
exit $fail
