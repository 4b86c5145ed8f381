#!/usr/bin/env bash
# test_pplcnetv2_fuse.sh - fleet-eval runs PP-LCNetV2 in its re-parameterised (fused) inference
# form (nn.h's fl_model_pplcnetv2_fused, fl_pplcnetv2_fuse) and says so. fleet-train trains
# PP-LCNetV2 (small-input stem) 40 steps on 3 x 16 x 16 synthetic shapes of 5 classes (small,
# for time: a step at 32 x 32 takes seconds on this shared machine) and saves an inference
# model; fleet-eval runs its 256 validation images both ways: by default the fused form (its
# parameter count printed: the training form's less the branches' batch norms and the smaller
# kernels), and with --form train the training form, which gives fleet-train's own validation
# loss (to the 4 decimals it prints). Both give the same top-1 (the same images right), losses within 1e-5 relative and
# logits within 1e-4 of the largest (the f32 sums of the fused kernel against three branch
# sums: 5e-7 seen). After 40 steps the running statistics are young and top-1 is near chance:
# what is compared is that both forms pick the same class for each image. On fleet-eval-devsim (a device the host cannot touch) the fused form gives
# the cpu's logits bit for bit. --form fused on PP-LCNet (no fused form) and an unknown --form
# are refused.
set -u
bin="${FLEET_BIN:?}"
build="${FLEET_BUILD:?}"
src="${FLEET_SRC:?}"
deval="$build/tests/support/fleet-eval-devsim"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
for b in fleet-train fleet-eval; do
  [ -x "$bin/$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done
cd "$tmp" || exit 1

args=(-c "$src/configs/shapes_resnet.yaml" -o model.type=pplcnetv2 -o train.batch_size=16
  -o train.max_steps=40 -o train.epochs=10 -o data.num_workers=0 -o data.train_size=640
  -o data.val_size=256 -o data.image_size=16 -o data.classes=5 -o optimizer.lr.base=0.05 -o optimizer.lr.warmup_steps=0
  -o optimizer.lr.schedule=constant -o train.log_interval=8 -o train.threads=1
  -o train.backend=cpu)
timeout 500 "$bin/fleet-train" "${args[@]}" -o checkpoint.inference_model="$tmp/v2.safetensors" \
  >"$tmp/train.out" 2>&1
check "fleet-train: PP-LCNetV2, 40 steps, inference model saved" test $? -eq 0 -a -s "$tmp/v2.safetensors"
val_loss=$(grep 'val_loss' "$tmp/train.out" | tail -1 | sed -E 's/.*val_loss ([0-9.]+).*/\1/')

"$bin/fleet-eval" -m "$tmp/v2.safetensors" --out "$tmp/fused.npy" >"$tmp/fused.out" 2>&1
check "fleet-eval (default form) runs" test $? -eq 0
"$bin/fleet-eval" -m "$tmp/v2.safetensors" --form train --out "$tmp/train.npy" >"$tmp/train_form.out" 2>&1
check "fleet-eval --form train runs" test $? -eq 0
cat "$tmp/fused.out" "$tmp/train_form.out"

# the forms and their counts: 5 classes; the fused form lacks the branches' batch norms
# (2 x C each) and has one k x k kernel with bias instead of the 3 x 3 (and 1 x 1) kernels
pf=$(sed -nE 's/.*fused\) inference form, ([0-9]+) parameters \(training form ([0-9]+)\).*/\1/p' "$tmp/fused.out")
pt=$(sed -nE 's/.*fused\) inference form, ([0-9]+) parameters \(training form ([0-9]+)\).*/\2/p' "$tmp/fused.out")
pt2=$(sed -nE 's/.*network: training form, ([0-9]+) parameters.*/\1/p' "$tmp/train_form.out")
echo "parameters: fused $pf, training form $pt ($pt2)"
check "the default form for pplcnetv2 is the fused one, which says so" test -n "$pf"
check "--form train says so, with the training form's count" test -n "$pt2" -a "$pt2" = "$pt"
check "fused count = training count - 62976 (the branches folded)" \
  test -n "$pf" -a -n "$pt" -a "$((pt - pf))" = 62976

top1() { sed -nE 's/.*top1 ([0-9.]+).*/\1/p' "$1"; }
loss() { sed -nE 's/.*loss ([0-9.]+), top1.*/\1/p' "$1"; }
echo "fleet-train val_loss $val_loss; training form: loss $(loss "$tmp/train_form.out") top1 $(top1 "$tmp/train_form.out"); fused: loss $(loss "$tmp/fused.out") top1 $(top1 "$tmp/fused.out")"
check "the training form gives fleet-train's validation loss (printed to 4 decimals)" \
  awk -v a="$val_loss" -v b="$(loss "$tmp/train_form.out")" \
  'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 5e-5) }'
check "the same top-1 both ways" \
  awk -v a="$(top1 "$tmp/fused.out")" -v b="$(top1 "$tmp/train_form.out")" 'BEGIN { exit !(a != "" && a == b) }'
check "losses within 1e-5 relative" \
  awk -v a="$(loss "$tmp/fused.out")" -v b="$(loss "$tmp/train_form.out")" \
  'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * b) }'
# logits: 128-byte .npy header, then (256, 5) float32
same_logits() { # same_logits A.npy B.npy TOL: |a - b| <= TOL max|b|
  paste <(od -An -v -f -w4 -j 128 "$1") <(od -An -v -f -w4 -j 128 "$2") |
    awk -v tol="$3" '{ d = $1 - $2; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2
      if (d > w) w = d; if (m > big) big = m; n++ }
      END { printf "  %d logits, largest %.4g, largest difference %.3g\n", n, big, w
            exit !(n == 1280 && w <= tol * big) }'
}
check "logits within 1e-4 of the largest" same_logits "$tmp/fused.npy" "$tmp/train.npy" 1e-4

if [ -x "$deval" ]; then
  OMP_WAIT_POLICY=passive "$deval" -m "$tmp/v2.safetensors" -o train.device=gpu -o train.backend=auto \
    --out "$tmp/dev.npy" >"$tmp/dev.out" 2>&1
  check "fleet-eval-devsim: the fused form on a device" grep -q "fused) inference form" "$tmp/dev.out"
  check "fleet-eval-devsim: the cpu's fused logits bit for bit" cmp -s "$tmp/dev.npy" "$tmp/fused.npy"
else
  echo "(fleet-eval-devsim not built: the device half is not run)"
fi

# refusals
timeout 300 "$bin/fleet-train" "${args[@]}" -o model.type=pplcnet -o model.scale=0.25 \
  -o train.max_steps=1 -o checkpoint.inference_model="$tmp/v1.safetensors" >"$tmp/v1.out" 2>&1
"$bin/fleet-eval" -m "$tmp/v1.safetensors" --form fused >"$tmp/v1e.out" 2>&1
rc=$?
check "--form fused on pplcnet: exit 1 naming pplcnetv2" \
  test $rc -eq 1 -a -n "$(grep 'error:.*only pplcnetv2' "$tmp/v1e.out")"
"$bin/fleet-eval" -m "$tmp/v1.safetensors" >"$tmp/v1a.out" 2>&1
check "pplcnet runs in its training form by default, saying so" grep -q "network: training form" "$tmp/v1a.out"
"$bin/fleet-eval" -m "$tmp/v2.safetensors" --form rep >"$tmp/bad.out" 2>&1
rc=$?
check "--form rep: exit 2 listing the forms" test $rc -eq 2 -a -n "$(grep "auto, fused or train" "$tmp/bad.out")"
if [ $fail -ne 0 ]; then
  for f in "$tmp"/*.out; do echo "== $f"; tail -5 "$f"; done
fi
exit $fail
