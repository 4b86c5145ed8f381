#!/usr/bin/env bash
# test_localsgd.sh - Local SGD through fleetrun on loopback (tests/dist/dist_train, the teacher
# MLP, 30 updates of 16 samples per worker):
# - with k_steps = 1 it is dense synchronous training: N = 2 and 4 workers end with the
#   parameters of the dense strategy (max |a-b| / max |b| <= 1e-5), for plain SGD and for
#   Momentum with weight decay (velocities stay local, but averaging them every step commutes
#   with the linear update);
# - the calls that send bytes are exactly the averaging steps (step 1, then every k: for 30
#   updates 1 + 29 div k of them) and the bytes per update fall as 1/k;
# - post-local SGD (begin_step 10, k 8) averages at steps 1..10, 18, 26; adaptive runs on the
#   real loss and averages at steps 1..begin_step and fewer than every step after;
# - configs/mlp_localsgd.yaml and mlp_adaptive_localsgd.yaml train on 2 workers (fleet-train);
#   adaptive with a warm-up from 0 synchronises fewer steps than it takes (lr0 is the running
#   maximum of the rate, not step 1's);
# - refusals: fp16_allreduce with localsgd, a bad FLEET_BENCH_SLOW; adaptive without a loss is
#   covered by the unit test.
set -u
run="${FLEET_BIN:?}/fleetrun"
prog="${FLEET_BUILD:?}/tests/dist/dist_train"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
source "${FLEET_SRC:?}/tests/cli/dist_train_lib.sh"

field() { # field NAME KEY: the value after KEY on dist_train's summary line
  sed -n "s/.*dist_train: world .* $2 \([0-9.]*\).*/\1/p" "$tmp/$1.log"
}
expect() { # expect WHAT GOT WANT
  if [ "$2" = "$3" ]; then echo "$1: $2"; else echo "FAIL: $1: $2, want $3"; fail=1; fi
}

for n in 2 4; do
  for opt in sgd momentum; do
    args=(--optimizer "$opt")
    [ "$opt" = momentum ] && args+=(--momentum 0.9 --weight-decay 1e-3)
    train "dense_${opt}_$n" "$n" "${args[@]}" || continue
    train "local_${opt}_$n" "$n" "${args[@]}" -o strategy.localsgd=true || continue
    compare "$opt, $n workers: Local SGD k=1 vs dense" 1e-5 "local_${opt}_$n" "dense_${opt}_$n"
  done
done

# bytes per update: 4 workers, SGD, k = 1, 2, 4, 8, 16
per_sync=""
for k in 1 2 4 8 16; do
  name="bytes_$k"
  train "$name" 4 -o strategy.localsgd=true -o "strategy.localsgd_configs.k_steps=$k" || continue
  syncs=$((1 + 29 / k))
  expect "k $k: calls that sent" "$(field "$name" sending_calls)" "$syncs"
  bytes=$(field "$name" bytes_sent)
  [ -z "$per_sync" ] && per_sync=$((bytes / 30))
  expect "k $k: bytes sent ($(field "$name" bytes_per_update) per update)" "$bytes" \
    "$((per_sync * syncs))"
done
dense_bytes=$(field dense_sgd_4 bytes_sent)
expect "k 1 sends what dense sends" "$(field bytes_1 bytes_sent)" "$dense_bytes"

# post-local SGD: synchronous through step 10, then every 8 (steps 18, 26)
train postlocal 2 --optimizer momentum -o strategy.localsgd=true \
  -o strategy.localsgd_configs.begin_step=10 -o strategy.localsgd_configs.k_steps=8 &&
  expect "post-local (begin 10, k 8): calls that sent" "$(field postlocal sending_calls)" 12

# adaptive on the real loss: averages every step through begin_step, fewer after
if train adaptive 2 --optimizer momentum -o strategy.adaptive_localsgd=true \
  -o strategy.adaptive_localsgd_configs.init_k_steps=4 \
  -o strategy.adaptive_localsgd_configs.begin_step=5; then
  sent=$(field adaptive sending_calls)
  if [ -n "$sent" ] && [ "$sent" -ge 6 ] && [ "$sent" -lt 30 ]; then
    echo "adaptive (init 4, begin 5): $sent of 30 calls sent"
  else
    echo "FAIL: adaptive: $sent of 30 calls sent, want 6 .. 29"; fail=1
  fi
fi

# the same in Wang & Joshi's form (init_k outside the root): the first interval after
# begin_step is about init_k, so it averages less often than Paddle's form with the same init_k
if train adacomm 2 --optimizer momentum -o strategy.adaptive_localsgd=true \
  -o strategy.adaptive_localsgd_configs.rule=adacomm \
  -o strategy.adaptive_localsgd_configs.init_k_steps=4 \
  -o strategy.adaptive_localsgd_configs.begin_step=5; then
  sent_ac=$(field adacomm sending_calls)
  if [ -n "$sent_ac" ] && [ -n "$sent" ] && [ "$sent_ac" -ge 6 ] && [ "$sent_ac" -lt "$sent" ]; then
    echo "adaptive, rule adacomm (init 4, begin 5): $sent_ac of 30 calls sent"
  else
    echo "FAIL: adaptive, rule adacomm: $sent_ac of 30 calls sent, want 6 .. $((sent - 1))"; fail=1
  fi
fi

# refused with the reason
"$prog" -o strategy.localsgd=true --fp16-allreduce >"$tmp/fp16.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -qF "strategy.fp16_allreduce cannot be combined with strategy.localsgd" "$tmp/fp16.log"; then
  echo "fp16_allreduce with localsgd: refused"
else
  echo "FAIL: fp16_allreduce with localsgd: exit $rc"; cat "$tmp/fp16.log"; fail=1
fi
# the example configs through fleet-train on 2 workers: post-local (average every step through
# step 64, then every 4) sends a quarter of the bytes after step 64; adaptive trains
train_cfg() { # train_cfg NAME CONFIG: 128 steps, rank 0's output to $tmp/NAME.log
  FLEET_COMM_TIMEOUT=60 timeout 300 "$run" --nproc_per_node 2 --log_dir "$tmp/log_$1" \
    "${FLEET_BIN}/fleet-train" -c "${FLEET_SRC:?}/configs/$2" -o train.max_steps=128 \
    -o 'train.log_dir=""' >"$tmp/$1.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] || ! grep -q 'eval .*val_acc1' "$tmp/$1.log"; then
    echo "FAIL: configs/$2 on 2 workers exited $rc"; tail -5 "$tmp/$1.log"; fail=1; return 1
  fi
  echo "configs/$2 on 2 workers: $(grep 'eval .*val_acc1' "$tmp/$1.log" | tail -1)"
}
if train_cfg postlocal_cfg mlp_localsgd.yaml; then
  mb=$(sed -n 's/^worker_index: 0, .* comm \([0-9.]*\) MB.*/\1/p' "$tmp/postlocal_cfg.log" | tr '\n' ' ')
  if awk -v l="$mb" 'BEGIN { n = split(l, m, " "); exit !(n == 4 && m[4] > 0 && m[4] < 0.3 * m[1]) }'; then
    echo "configs/mlp_localsgd.yaml: MB per window of 32 steps: $mb (after step 64: about 1/4)"
  else
    echo "FAIL: configs/mlp_localsgd.yaml: MB per window $mb, want the 4th < 0.3 x the 1st"; fail=1
  fi
fi
train_cfg adaptive_cfg mlp_adaptive_localsgd.yaml

# adaptive under a warm-up from 0 (lr0 is the largest rate so far, not step 1's): after the
# warm-up of 64 steps the interval leaves 1, so fewer than the 128 updates synchronise, and
# metrics.jsonl reports the interval (localsgd_k) and the synchronised steps
FLEET_COMM_TIMEOUT=60 timeout 300 "$run" --nproc_per_node 2 --log_dir "$tmp/log_ada0" \
  "${FLEET_BIN}/fleet-train" -c "${FLEET_SRC}/configs/mlp_adaptive_localsgd.yaml" \
  -o train.max_steps=128 -o optimizer.lr.warmup_start=0 \
  -o strategy.adaptive_localsgd_configs.begin_step=1 -o "train.log_dir=$tmp/ada0" \
  >"$tmp/ada0.log" 2>&1
rc=$?
last=$(grep '"phase":"train"' "$tmp/ada0/metrics.jsonl" 2>/dev/null | tail -1)
synced=$(sed -n 's/.*"synced_steps":\([0-9]*\).*/\1/p' <<<"$last")
k=$(sed -n 's/.*"localsgd_k":\([0-9]*\).*/\1/p' <<<"$last")
step=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' <<<"$last")
if [ $rc -eq 0 ] && [ "$step" = 128 ] && [ -n "$synced" ] && [ "$synced" -lt 100 ] &&
  [ -n "$k" ] && [ "$k" -ge 2 ]; then
  echo "adaptive, warm-up from 0: $synced of 128 updates synchronised, interval now $k"
else
  echo "FAIL: adaptive, warm-up from 0: exit $rc, step '$step', synced '$synced' (want < 100), k '$k' (want >= 2)"
  tail -5 "$tmp/ada0.log"; fail=1
fi

# the benchmark's straggler option refuses a bad value, naming the variable
FLEET_BENCH_SLOW=2:5 "${FLEET_BIN}/fleet-train" -c "${FLEET_SRC}/configs/quickstart.yaml" \
  -o train.max_steps=1 -o 'train.log_dir=""' >"$tmp/slow.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -qF "FLEET_BENCH_SLOW=2:5: expected PROB:MS[:RANK]" "$tmp/slow.log"; then
  echo "FLEET_BENCH_SLOW=2:5: refused"
else
  echo "FAIL: FLEET_BENCH_SLOW=2:5: exit $rc"; cat "$tmp/slow.log"; fail=1
fi
exit $fail
