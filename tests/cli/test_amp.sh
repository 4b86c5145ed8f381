#!/usr/bin/env bash
# test_amp.sh - strategy.amp on 2 workers under fleetrun (tests/dist/dist_train's MLP, whose fc
# layers compute in f16), for the dense strategy, DGC and Local SGD:
# - FLEET_AMP_INJECT_INF=6,1 puts an inf into a gradient of rank 1 at step 6: both ranks count
#   the step skipped, the scale follows Paddle's rule (incr_every_n_steps 4, ratio 2;
#   decr_every_n_nan_or_inf 1, ratio 0.5: 32768 -> 65536 at step 4, 32768 at 6, 65536 at 10),
#   and the two ranks end with bit-identical parameters (Local SGD: step 6 was due to average,
#   step 7 does, then every 2nd: 13 steps); without the inf the scale only grows;
# - a skipped step changes nothing: an inf at the last step (12; Local SGD 11) ends where one
#   step less ends, bit for bit;
# - gradient merge: an inf in the merged gradient skips the update on both ranks alike;
# - a real f16 overflow: init_loss_scaling 2^30 overflows f16 (65504) in the loss gradient, so
#   the first steps are skipped while the scale shrinks, then training goes on; bf16 does not
#   overflow at that scale;
# - a static scale where nothing overflows follows the f32 run: 30 losses within 2e-3, the
#   parameters within 1e-2 (relative to the largest);
# - bad FLEET_AMP_INJECT_INF is refused naming the variable.
# Under FLEET_TEST_NUMERIC_ONLY=1 (numeric_only_lib.sh) the inf at the last step (two runs on the
# same kernels, bit for bit) and the refused variable are left to the native pass; the scale's
# course stays: it holds only while no gradient overflows of itself, which the kernels' values
# decide.
set -u
run="${FLEET_BIN:?}/fleetrun"
prog="${FLEET_BUILD:?}/tests/dist/dist_train"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
if [ ! -x "$run" ] || [ ! -x "$prog" ]; then
  echo "SKIPPED: fleetrun or dist_train not built"; exit 77
fi
source "${FLEET_SRC:?}/tests/cli/dist_train_lib.sh"
source "${FLEET_SRC:?}/tests/cli/numeric_only_lib.sh"
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD FLEET_AMP_INJECT_INF

amp=(--optimizer momentum --steps 12 -o strategy.amp=true
  -o strategy.amp_configs.incr_every_n_steps=4 -o strategy.amp_configs.decr_every_n_nan_or_inf=1
  -o strategy.amp_configs.decr_ratio=0.5)
declare -A strat=([dense]="" [dgc]="--dgc"
  [localsgd]="-o strategy.localsgd=true -o strategy.localsgd_configs.k_steps=2 -o strategy.localsgd_configs.begin_step=2")
# the last step of the skip-changes-nothing runs: one whose replicas are averaged before it
# (Local SGD above averages at steps 1, 2, 4, 6, ...: 11 is a local step after the average at 10)
declare -A last=([dense]=12 [dgc]=12 [localsgd]=11)
# the inf-at-6 runs: Local SGD's average due at 6 moves to 7, then 9, 11, 13
declare -A steps6=([dense]=12 [dgc]=12 [localsgd]=13)

scale_of() { # scale_of NAME RANK: "loss_scale S skipped K" as rank RANK printed it
  local log="$tmp/$1.log"
  [ "$2" = 0 ] || log="$tmp/log_$1/workerlog.$2"
  sed -nE "s/^dist_train: rank $2 (loss_scale [0-9.e+]+ skipped [0-9]+)$/\1/p" "$log"
}
same_bits() { # same_bits WHAT A B: two parameter files, byte for byte
  if cmp -s "$2" "$3"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi
}

for s in dense dgc localsgd; do
  # shellcheck disable=SC2206
  extra=(${strat[$s]})
  # 1. an inf on rank 1 at step 6: skipped on both ranks, the scale down and up again
  train_env=(FLEET_COMM_TIMEOUT=60 FLEET_AMP_INJECT_INF=6,1)
  if train "inf6_$s" 2 "${amp[@]}" "${extra[@]}" --steps "${steps6[$s]}" --out-every-rank; then
    for r in 0 1; do
      got=$(scale_of "inf6_$s" $r)
      check "$s: inf at step 6 on rank 1: rank $r says '$got' (loss_scale 65536 skipped 1)" \
        test "$got" = "loss_scale 65536 skipped 1"
    done
    same_bits "$s: inf at step 6: both ranks' parameters bit-identical" \
      "$tmp/inf6_$s.bin.0" "$tmp/inf6_$s.bin.1"
  fi
  train_env=(FLEET_COMM_TIMEOUT=60)
  if train "clean_$s" 2 "${amp[@]}" "${extra[@]}" --out-every-rank; then
    got=$(scale_of "clean_$s" 1)
    check "$s: no inf: rank 1 says '$got' (loss_scale 262144 skipped 0: x2 at steps 4, 8, 12)" \
      test "$got" = "loss_scale 262144 skipped 0"
    same_bits "$s: no inf: both ranks' parameters bit-identical" \
      "$tmp/clean_$s.bin.0" "$tmp/clean_$s.bin.1"
  fi
  # 2. a skipped step changes nothing: an inf (on rank 0 only) at the last step vs one step less
  native_section "2 (a skipped step changes nothing)" || continue
  L=${last[$s]}
  train_env=(FLEET_COMM_TIMEOUT=60 FLEET_AMP_INJECT_INF=$L,0)
  train "infL_$s" 2 "${amp[@]}" "${extra[@]}" --steps "$L" --out-every-rank; ok=$?
  train_env=(FLEET_COMM_TIMEOUT=60)
  if [ $ok -eq 0 ] && train "stepsL_$s" 2 "${amp[@]}" "${extra[@]}" --steps $((L - 1)); then
    same_bits "$s: inf at the last step ($L) ends as $((L - 1)) steps do" \
      "$tmp/infL_$s.bin" "$tmp/stepsL_$s.bin"
    same_bits "$s: inf at the last step: both ranks' parameters bit-identical" \
      "$tmp/infL_$s.bin.0" "$tmp/infL_$s.bin.1"
  fi
done
train_env=(FLEET_COMM_TIMEOUT=60)

# 3. gradient merge (2 micro-batches): the merged gradient carries the inf of either micro-batch
train_env=(FLEET_COMM_TIMEOUT=60 FLEET_AMP_INJECT_INF=3,1)
if train merge_inf 2 "${amp[@]}" --merge 2 --out-every-rank; then
  got=$(scale_of merge_inf 0)
  check "gradient merge: inf at step 3 on rank 1: rank 0 says '$got' (loss_scale 65536 skipped 1)" \
    test "$got" = "loss_scale 65536 skipped 1"
  same_bits "gradient merge: both ranks' parameters bit-identical" \
    "$tmp/merge_inf.bin.0" "$tmp/merge_inf.bin.1"
fi
train_env=(FLEET_COMM_TIMEOUT=60)

# 4. a real overflow: 2^30 times the loss gradient is beyond f16's 65504, not bf16's range
big=(--optimizer momentum --steps 30 -o strategy.amp=true
  -o strategy.amp_configs.init_loss_scaling=1073741824
  -o strategy.amp_configs.decr_every_n_nan_or_inf=1 -o strategy.amp_configs.decr_ratio=0.5)
if train big_f16 2 "${big[@]}" && train big_bf16 2 "${big[@]}" -o strategy.amp_configs.dtype=bfloat16; then
  got=$(scale_of big_f16 0)
  k=$(sed -nE 's/.* skipped ([0-9]+)$/\1/p' <<<"$got")
  check "f16, scale 2^30: overflow skips the first steps ($got), then trains (5 .. 20 skipped)" \
    test "${k:-0}" -ge 5 -a "${k:-0}" -le 20
  check "f16, scale 2^30: the loss decreases after the skips" \
    awk '/^step/ { if (!n++) first = $4; last = $4 } END { exit !(last < first - 0.05) }' \
    "$tmp/big_f16.log"
  got=$(scale_of big_bf16 0)
  check "bf16, scale 2^30: nothing overflows ($got)" test "$got" = "loss_scale 1.07374e+09 skipped 0"
fi

# 5. a static scale where nothing overflows follows the f32 run
if train f32 2 --optimizer momentum && train static 2 --optimizer momentum -o strategy.amp=true \
     -o strategy.amp_configs.use_dynamic_loss_scaling=false -o strategy.amp_configs.init_loss_scaling=1024; then
  check "static scale 1024: stays, nothing skipped ($(scale_of static 1))" \
    test "$(scale_of static 1)" = "loss_scale 1024 skipped 0"
  grep '^step' "$tmp/f32.log" >"$tmp/l32" && grep '^step' "$tmp/static.log" >"$tmp/l16"
  check "static scale: 30 losses within 2e-3 of f32's" \
    awk 'NR == FNR { a[$2] = $4; next } { n++; d = $4 - a[$2]; if (d < -2e-3 || d > 2e-3) exit 1 }
         END { exit n != 30 }' "$tmp/l32" "$tmp/l16"
  compare "static scale: parameters vs f32" 1e-2 static f32
fi

# 6. the test hook refuses what does not parse
if native_section "6 (the refused variable)"; then
  FLEET_AMP_INJECT_INF=x,1 "$prog" -o strategy.amp=true --steps 1 >"$tmp/bad.log" 2>&1
  check "FLEET_AMP_INJECT_INF=x,1 is refused naming the variable" \
    grep -q "FLEET_AMP_INJECT_INF: 'x,1' is not STEP\[,RANK\]" "$tmp/bad.log"
fi
numeric_only_report
exit $fail
