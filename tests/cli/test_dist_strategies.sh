#!/usr/bin/env bash
# test_dist_strategies.sh - the dense strategy's options over fleetrun, each against what it
# must preserve:
# - fp16_allreduce: the average to f16 precision (one SGD step's parameter delta within 2e-3,
#   two f16 ulps, of the f32 run's; parameters after 30 steps within 1e-2 and the same losses
#   to 1e-3) at half the bytes per step (0.4 to 0.6 of f32's);
# - gradient_merge k=4, local batch b: the parameters of local batch 4b without merge on the
#   same samples (<= 1e-5), for SGD and Momentum with weight decay; bytes only on every 4th
#   call; avg=false is k times the gradient (SGD: the same run as avg=true with k times the
#   learning rate; one step's parameter delta is 4 times avg=true's);
# - the seed's example, examples/mlp_dist, runs on 2 workers;
# - a strategy that cannot work, or is misconfigured (amp's lists), fails before training with the reason.
# Under FLEET_TEST_NUMERIC_ONLY=1 (numeric_only_lib.sh) the example and the refused strategies are
# left to the native pass.
set -u
run="${FLEET_BIN:?}/fleetrun"
prog="${FLEET_BUILD:?}/tests/dist/dist_train"
example="${FLEET_BUILD:?}/examples/mlp_dist"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
source "${FLEET_SRC:?}/tests/cli/dist_train_lib.sh"
source "${FLEET_SRC:?}/tests/cli/numeric_only_lib.sh"
b=16
field() { # field NAME KEY: the value after KEY on dist_train's summary line
  sed -nE "s/^dist_train: .* $2 ([0-9.]+).*/\1/p" "$tmp/$1.log" | tail -1
}

# 1. fp16_allreduce, 2 and 4 workers
for n in 2 4; do
  if train "f32_1step_$n" "$n" --batch $b --steps 1 --out-init "$tmp/init_$n.bin" &&
     train "f16_1step_$n" "$n" --batch $b --steps 1 --fp16-allreduce; then
    compare "fp16_allreduce, $n workers: one step's delta vs f32's" 2e-3 "f16_1step_$n" \
      "f32_1step_$n" --base "$tmp/init_$n.bin" --factor 1
  fi
  train "f32_$n" "$n" --batch $b && train "f16_$n" "$n" --batch $b --fp16-allreduce || continue
  compare "fp16_allreduce, $n workers: parameters vs f32" 1e-2 "f16_$n" "f32_$n"
  ratio=$(awk -v a="$(field "f16_$n" bytes_per_update)" -v b="$(field "f32_$n" bytes_per_update)" \
    'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }')
  check "fp16_allreduce, $n workers: bytes per step $ratio of f32's (0.4 .. 0.6)" \
    awk -v r="$ratio" 'BEGIN { exit !(r >= 0.4 && r <= 0.6) }'
  grep '^step' "$tmp/f32_$n.log" >"$tmp/l32" && grep '^step' "$tmp/f16_$n.log" >"$tmp/l16"
  check "fp16_allreduce, $n workers: 30 losses within 1e-3 of f32's" \
    awk 'NR == FNR { a[$2] = $4; next } { n++; d = $4 - a[$2]; if (d < -1e-3 || d > 1e-3) exit 1 }
         END { exit n != 30 }' "$tmp/l32" "$tmp/l16"
  check "fp16_allreduce, $n workers: loss decreases ($(head -1 "$tmp/l16" | cut -d' ' -f4) -> $(tail -1 "$tmp/l16" | cut -d' ' -f4))" \
    awk 'NR == 1 { first = $4 } { last = $4 } END { exit !(last < first - 0.1) }' "$tmp/l16"
done

# 2. gradient_merge k=4 with local batch b against local batch 4b, on the same samples
for opt in sgd momentum; do
  args=(--optimizer "$opt")
  [ "$opt" = momentum ] && args+=(--momentum 0.9 --weight-decay 1e-3)
  for overlap in on off; do
    name="merge_${opt}_$overlap"
    train "big_${opt}_$overlap" 2 "${args[@]}" --overlap $overlap --batch $((4 * b)) &&
      train "$name" 2 "${args[@]}" --overlap $overlap --batch $b --merge 4 || continue
    compare "gradient_merge 4 x batch $b vs batch $((4 * b)), $opt, overlap $overlap" 1e-5 \
      "$name" "big_${opt}_$overlap"
    summary=$(grep '^dist_train:' "$tmp/$name.log")
    check "gradient_merge, $opt, overlap $overlap: 30 of 120 calls send, exactly the updating ones" \
      grep -q 'calls 120 updates 30 sending_calls 30 mismatched 0' <<<"$summary"
    bm=$(field "$name" bytes_per_update) bb=$(field "big_${opt}_$overlap" bytes_per_update)
    check "gradient_merge, $opt, overlap $overlap: bytes per update $bm, as without merge ($bb)" \
      test -n "$bm" -a "$bm" = "$bb"
  done
done
# avg=false sums the micro-batch gradients: for SGD, k times the gradient is k times the rate
if train sum_lr 2 --batch $b --merge 4 --merge-avg off --lr 0.05 &&
   train avg_4lr 2 --batch $b --merge 4 --lr 0.2; then
  compare "gradient_merge avg=false vs avg=true at 4x the learning rate (SGD)" 1e-5 sum_lr avg_4lr
fi
if train sum_1 2 --batch $b --merge 4 --merge-avg off --steps 1 --out-init "$tmp/init.bin" &&
   train avg_1 2 --batch $b --merge 4 --steps 1; then
  compare "gradient_merge avg=false: one SGD step's delta = 4 x avg=true's" 1e-4 sum_1 avg_1 \
    --base "$tmp/init.bin" --factor 4
fi

# 3. the seed's example on 2 workers: exits 0, both workers print the seed's lines
if native_section "3 (examples/mlp_dist)"; then
  FLEET_COMM_TIMEOUT=60 timeout 120 "$run" --nproc_per_node 2 --log_dir "$tmp/log_example" \
    "$example" 30 >"$tmp/example.log" 2>&1
  check "examples/mlp_dist on 2 workers exits 0 (got $?)" test $? -eq 0
  check "examples/mlp_dist: rank 0 prints worker_index lines" \
    grep -qE '^worker_index: 0, step20 cost = [0-9.]+$' "$tmp/example.log"
  check "examples/mlp_dist: rank 1 prints worker_index lines" \
    grep -qE '^worker_index: 1, step20 cost = [0-9.]+$' "$tmp/log_example/workerlog.1"
  check "examples/mlp_dist: rank 0 saves" grep -q '^worker_index: 0, saved' "$tmp/example.log"
  check "examples/mlp_dist: rank 1 does not save" \
    bash -c "! grep -q saved '$tmp/log_example/workerlog.1'"
fi

# 4. refused strategies: before training (no step lines), exit 2, with the reason
if native_section "4 (refused strategies)"; then
  refused() { # refused NAME PATTERN NPROC ARGS...
    local name=$1 pattern=$2 n=$3; shift 3
    if [ "$n" = 1 ]; then
      "$prog" "$@" >"$tmp/$name.log" 2>&1
    else
      FLEET_COMM_TIMEOUT=60 timeout 120 "$run" --nproc_per_node "$n" --log_dir "$tmp/log_$name" \
        "$prog" "$@" >"$tmp/$name.log" 2>&1
    fi
    local rc=$?
    check "$name: exit code 2 (got $rc)" test $rc -eq 2
    check "$name: says '$pattern'" grep -qF -e "$pattern" "$tmp/$name.log"
    check "$name: nothing trained" bash -c "! grep -q '^step' '$tmp/$name.log'"
  }
  refused dgc_sgd "dist_train: error: strategy.dgc needs optimizer.type momentum (Deep Gradient Compression corrects momentum)" 1 --dgc
  refused dgc_fp16 "dist_train: error: strategy.dgc cannot be combined with strategy.fp16_allreduce" 1 --dgc --optimizer momentum --fp16-allreduce
  refused dgc_fp16_fleetrun "dist_train: error: strategy.dgc cannot be combined with strategy.fp16_allreduce" 2 --dgc --optimizer momentum --fp16-allreduce
  refused amp "dist_train: error: strategy.amp_configs.custom_white_list: 'fc2' is not a layer type" 1 -o strategy.amp=true -o strategy.amp_configs.custom_white_list=fc2 --optimizer momentum
  refused localsgd_fp16 "strategy.fp16_allreduce cannot be combined with strategy.localsgd" 1 -o strategy.localsgd=true --fp16-allreduce
  refused amp_configs "strategy.amp_configs.custom_white_list: 'add' is also in strategy.amp_configs.custom_black_list" 1 -o 'strategy.amp_configs.custom_white_list=add' -o 'strategy.amp_configs.custom_black_list=add'
  refused bad_key "unknown key 'strategy.fuse_grad_size_in_mb'" 1 -o strategy.fuse_grad_size_in_mb=4
fi
numeric_only_report
exit $fail
