#!/usr/bin/env bash
# test_cnn_step_amp.sh - bench/cnn_step's CNN_STEP_AMP (what bench/gpu_step.sh's f16 / bf16 rows
# run): strategy.amp's step, native on a table with low dtypes (ref: every layer of the MLP in
# float16), emulated on one without (cpu, bfloat16), f32 when unset; nothing skipped, losses
# finite; an unknown value and CNN_STEP_DGC beside it refused by name.
set -u
step="${FLEET_BUILD:?}/bench/cnn_step"
[ -x "$step" ] || { echo "SKIPPED: bench/cnn_step not built"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "${FLEET_SRC:?}/tests/cli/dist_train_lib.sh" # check
export OMP_NUM_THREADS=1
CNN_STEP_AMP=f16 "$step" mlp2 8 1 1 ref >/dev/null 2>"$tmp/ref.err"
check "ref f16: exit 0" test $? -eq 0
check "ref f16: native, every layer" grep -q '^cnn_step: amp float16 native 5 of 5 layers' "$tmp/ref.err"
check "ref f16: nothing skipped, losses finite" \
  grep -q ' 0 of 2 updates (warm-up included) skipped (inf/NaN gradients), 0 losses not finite' "$tmp/ref.err"
CNN_STEP_AMP=bf16 "$step" mlp2 8 1 1 cpu >/dev/null 2>"$tmp/cpu.err"
check "cpu bf16: exit 0" test $? -eq 0
check "cpu bf16: emulated" grep -q '^cnn_step: amp bfloat16 emulated' "$tmp/cpu.err"
env -u CNN_STEP_AMP "$step" mlp2 8 1 1 cpu >/dev/null 2>"$tmp/f32.err"
check "unset: f32" grep -q 'amp f32) params' "$tmp/f32.err"
CNN_STEP_AMP=f8 "$step" mlp2 8 1 1 cpu >/dev/null 2>"$tmp/bad.err"
check "f8: exit 1 naming CNN_STEP_AMP" test $? -eq 1 -a -n "$(grep 'CNN_STEP_AMP=f8: not f16, bf16 or f32' "$tmp/bad.err")"
CNN_STEP_AMP=f16 CNN_STEP_DGC=0.99 "$step" mlp2 8 1 1 cpu >/dev/null 2>"$tmp/dgc.err"
check "with CNN_STEP_DGC: exit 2 saying so" test $? -eq 2 -a -n "$(grep 'CNN_STEP_DGC with CNN_STEP_AMP' "$tmp/dgc.err")"
[ $fail = 0 ] || for f in "$tmp"/*.err; do echo "== $f"; tail -3 "$f"; done
exit $fail
