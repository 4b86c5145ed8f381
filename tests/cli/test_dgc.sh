#!/usr/bin/env bash
# test_dgc.sh - Deep Gradient Compression over fleetrun on loopback, against what it must keep:
# - at sparsity 0 with momentum masking off, DGC is dense Momentum (weight decay 1e-3): the
#   parameters after 30 steps within 1e-5 of the dense strategy's, N = 2 and 4, through the
#   sparse path (dense_fallback off: every entry goes through the allgather as (index, value)
#   pairs) and through the dense fallback; Nesterov too; and with gradient merge (k = 4 of
#   batch b against batch 4b), and with momentum correction off (weight-decay correction on and
#   off);
# - at sparsity 0.999 a rank sends under a tenth of dense's bytes per step on this small model
#   (its biases and output layer stay dense), the parameters differ from dense's, and sampled
#   and exact selection choose the same entries (bit-identical parameters), and so do sending
#   from the gradient-ready hooks and after backward (also with local clipping and merge);
# - the fallback (N * (1 - s) * 2 >= 1) is said once in the log, not every step;
# - configs/mlp_dgc.yaml trains on 2 workers with fleet-train;
# - what cannot work is refused before training with the reason: DGC with fp16_allreduce, with
#   SGD, with an empty sparsity list.
# dist_train's MLP: fc1 (32 x 128 = 4096), fc2 (128 x 128 = 16384), fc3 (128 x 4); with
# min_compress_numel 1000 fc1 and fc2 are compressed (20480 values), 772 values stay dense.
set -u
run="${FLEET_BIN:?}/fleetrun"
train_bin="${FLEET_BIN:?}/fleet-train"
prog="${FLEET_BUILD:?}/tests/dist/dist_train"
config="${FLEET_SRC:?}/configs/mlp_dgc.yaml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
train_env=(FLEET_LOG_LEVEL=info FLEET_COMM_TIMEOUT=60)
source "${FLEET_SRC:?}/tests/cli/dist_train_lib.sh"
b=16
field() { # field NAME KEY: the value after KEY on dist_train's summary line
  sed -nE "s/^dist_train: .* $2 ([0-9.]+).*/\1/p" "$tmp/$1.log" | tail -1
}
mom=(--optimizer momentum --momentum 0.9 --weight-decay 1e-3 --batch "$b")
dgc0=(--dgc -o "strategy.dgc_configs.sparsity=[0]" -o strategy.dgc_configs.momentum_masking=false
  -o strategy.dgc_configs.min_compress_numel=1000)

# 1. sparsity 0, masking off == dense Momentum
for n in 2 4; do
  train "dense_$n" "$n" "${mom[@]}" || continue
  if train "sparse0_$n" "$n" "${mom[@]}" "${dgc0[@]}" -o strategy.dgc_configs.dense_fallback=false; then
    compare "DGC sparsity 0 (the allgather of every entry), $n workers, vs dense Momentum" 1e-5 \
      "sparse0_$n" "dense_$n"
    check "$n workers: 2 tensors (20480 values) compressed, 772 values dense" \
      grep -q 'strategy dgc: 2 tensors (20480 values) compressed, 4 (772 values) dense' \
      "$tmp/sparse0_$n.log"
    check "$n workers: no fallback with dense_fallback off" \
      bash -c "! grep -q 'use dense allreduce' '$tmp/sparse0_$n.log'"
  fi
  train "fallback0_$n" "$n" "${mom[@]}" "${dgc0[@]}" &&
    compare "DGC sparsity 0 (dense fallback), $n workers, vs dense Momentum" 1e-5 \
      "fallback0_$n" "dense_$n"
done
train nesterov_dense 2 "${mom[@]}" --nesterov &&
  train nesterov_dgc0 2 "${mom[@]}" --nesterov "${dgc0[@]}" \
    -o strategy.dgc_configs.dense_fallback=false &&
  compare "DGC sparsity 0, Nesterov, 2 workers, vs dense Nesterov" 1e-5 nesterov_dgc0 \
    nesterov_dense
# without momentum correction, Momentum runs on the aggregate (the paper's eq. 6): at sparsity 0
# that is dense Momentum too, with the decay in the local gradient (weight-decay correction on)
# or added after aggregation (off); with correction on, decay after aggregation is not inside
# the momentum, so it must differ
for wdc in true false; do
  train "nocorr_wdc_$wdc" 2 "${mom[@]}" "${dgc0[@]}" -o strategy.dgc_configs.dense_fallback=false \
    -o strategy.dgc_configs.momentum_correction=false \
    -o "strategy.dgc_configs.weight_decay_correction=$wdc" &&
    compare "DGC sparsity 0, momentum correction off, weight-decay correction $wdc, vs dense" \
      1e-5 "nocorr_wdc_$wdc" dense_2
done
train wdc_off 2 "${mom[@]}" "${dgc0[@]}" -o strategy.dgc_configs.weight_decay_correction=false &&
  check "DGC sparsity 0 with only weight-decay correction off differs from dense (decay outside momentum)" \
    bash -c "! '$prog' --compare '$tmp/wdc_off.bin' '$tmp/dense_2.bin' --rtol 1e-4 >/dev/null"
mom4=(--optimizer momentum --momentum 0.9 --weight-decay 1e-3 --batch $((4 * b)))
train merge_big 2 "${mom4[@]}" "${dgc0[@]}" -o strategy.dgc_configs.dense_fallback=false &&
  train merge_4 2 "${mom[@]}" --merge 4 "${dgc0[@]}" -o strategy.dgc_configs.dense_fallback=false &&
  compare "DGC sparsity 0 with gradient_merge 4 x batch $b vs batch $((4 * b))" 1e-5 merge_4 \
    merge_big

# 2. sparsity 0.999: bytes and a different trajectory
if train sparse999 2 "${mom[@]}" --dgc -o strategy.dgc_configs.min_compress_numel=1000; then
  ratio=$(awk -v a="$(field sparse999 bytes_per_update)" -v b="$(field dense_2 bytes_per_update)" \
    'BEGIN { printf "%.4f", (b > 0 ? a / b : 1) }')
  check "sparsity 0.999, 2 workers: bytes per step $ratio of dense's (< 0.1)" \
    awk -v r="$ratio" 'BEGIN { exit !(r < 0.1) }'
  check "sparsity 0.999: every call sends" \
    grep -q 'calls 30 updates 30 sending_calls 30 mismatched 0' "$tmp/sparse999.log"
  check "sparsity 0.999: parameters differ from dense's (compression did something)" \
    bash -c "! '$prog' --compare '$tmp/sparse999.bin' '$tmp/dense_2.bin' --rtol 1e-3 >/dev/null"
  check "sparsity 0.999: the loss is finite" \
    bash -c "grep '^step 29 ' '$tmp/sparse999.log' | grep -qvi nan"
  # the sampled threshold is refined to the exact top k: the same entries as quickselect's
  train exact999 2 "${mom[@]}" --dgc -o strategy.dgc_configs.min_compress_numel=1000 \
    -o strategy.dgc_configs.selection=exact &&
    check "sparsity 0.999: sampled and exact selection give bit-identical parameters" \
      cmp -s "$tmp/sparse999.bin" "$tmp/exact999.bin"
  # tensors are sent from the gradient-ready hooks during backward (overlap, the default) or
  # all after backward: the same pairs in the same order, so the same parameters
  train nooverlap999 2 "${mom[@]}" --dgc -o strategy.dgc_configs.min_compress_numel=1000 \
    --overlap off &&
    check "sparsity 0.999: sent during backward or after it: bit-identical parameters" \
      cmp -s "$tmp/sparse999.bin" "$tmp/nooverlap999.bin"
  # local clipping needs every gradient's norm first: the hooks leave the tensors to the update
  train clip_ov 2 "${mom[@]}" --clip 0.05 --dgc -o strategy.dgc_configs.min_compress_numel=1000 &&
    train clip_noov 2 "${mom[@]}" --clip 0.05 --dgc \
      -o strategy.dgc_configs.min_compress_numel=1000 --overlap off &&
    check "sparsity 0.999 with local clipping: overlap on and off bit-identical" \
      cmp -s "$tmp/clip_ov.bin" "$tmp/clip_noov.bin" &&
    check "sparsity 0.999: local clipping changed the result" \
      bash -c "! cmp -s '$tmp/clip_ov.bin' '$tmp/sparse999.bin'"
  # gradient merge: the hooks scale each compressed gradient by 1/k inside the accumulation
  train merge999 2 "${mom[@]}" --merge 2 --dgc -o strategy.dgc_configs.min_compress_numel=1000 &&
    train merge999_noov 2 "${mom[@]}" --merge 2 --dgc \
      -o strategy.dgc_configs.min_compress_numel=1000 --overlap off &&
    check "sparsity 0.999 with gradient merge: overlap on and off bit-identical" \
      cmp -s "$tmp/merge999.bin" "$tmp/merge999_noov.bin"
fi

# 3. the fallback is said once: 10 steps at 0.75 (2 * 0.25 * 2 = 1), then 0.999
if train ramp 2 "${mom[@]}" --dgc -o strategy.dgc_configs.min_compress_numel=1000 \
     -o "strategy.dgc_configs.sparsity=[0.75, 0.999]" -o strategy.dgc_configs.rampup_step=20; then
  said=$(grep -c 'sparsity 0.75 with 2 workers: N \* (1 - s) \* 2 = 1 >= 1' "$tmp/ramp.log")
  check "the fallback at sparsity 0.75 is said once on rank 0 ($said times)" test "$said" = 1
fi

# 4. configs/mlp_dgc.yaml on 2 workers (warm-up moved early to reach sparse steps quickly)
FLEET_COMM_TIMEOUT=60 timeout 300 "$run" --nproc_per_node 2 --log_dir "$tmp/log_cfg" \
  "$train_bin" -c "$config" -o train.max_steps=24 -o train.log_interval=8 \
  -o "train.log_dir=$tmp/cfg" -o strategy.dgc_configs.rampup_begin_step=4 \
  -o strategy.dgc_configs.rampup_step=8 >"$tmp/cfg.log" 2>&1
rc=$?
check "configs/mlp_dgc.yaml trains on 2 workers (exit $rc)" test $rc -eq 0
check "configs/mlp_dgc.yaml: metrics.jsonl written with comm_mb" grep -q '"comm_mb"' \
  "$tmp/cfg/metrics.jsonl"
last=$(sed -nE 's/.*step 24, loss ([0-9.]+).*comm ([0-9.]+) MB.*/\2/p' "$tmp/cfg.log")
check "configs/mlp_dgc.yaml: the last 8 steps (sparsity 0.999) sent ${last:-?} MB (< 1)" \
  awk -v m="${last:-9}" 'BEGIN { exit !(m < 1) }'

# 5. refusals, before training, naming the key
refuse() { # refuse WHAT MESSAGE OVERRIDES...
  local what=$1 msg=$2 out; shift 2
  out=$("$train_bin" -c "$config" -o train.max_steps=1 "$@" 2>&1)
  local rc=$?
  if [ $rc -ne 0 ] && grep -qF "$msg" <<<"$out"; then echo "ok: refused: $what"
  else echo "FAIL: $what (exit $rc): $out"; fail=1; fi
}
refuse "dgc with fp16_allreduce" \
  "strategy.dgc cannot be combined with strategy.fp16_allreduce" -o strategy.fp16_allreduce=true
refuse "dgc with SGD" "strategy.dgc needs optimizer.type momentum" -o optimizer.type=sgd \
  -o optimizer.momentum=0
refuse "an empty sparsity list" "strategy.dgc_configs.sparsity: the list is empty" \
  -o "strategy.dgc_configs.sparsity=[]"
exit $fail
