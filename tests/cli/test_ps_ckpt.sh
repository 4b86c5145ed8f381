#!/usr/bin/env bash
# test_ps_ckpt.sh - fleet-ckpt merge-ps: a parameter-server job's checkpoint (the servers' shards
# on the workers' checkpoint) in one file that fleet-eval reads. 2 servers, 2 workers, the MLP
# with hidden [512, 256] (148,738 trainable values: 3 dense blocks, server 0 holding blocks 0
# and 2, server 1 block 1). An async job: fleet-eval on the merged final step prints the final
# evaluation line's val_acc1 exactly (a count over the same 2048 samples, printed to 4
# decimals) and its val_loss to 6e-5 (the job sums 2 ranks' halves, fleet-eval one pass). A
# sync job: the merged step 16 holds the network tensors of the workers' checkpoint bit for
# bit (in sync mode both are the servers' values). A geo job saved between exchanges (step 6,
# k 4): the merged model is the servers', not worker 0's local copy. Refused, naming the file:
# a server's missing shard, a damaged one, one of another step, a workers' checkpoint of
# another network.
set -u
bin="${FLEET_BIN:?}"
cfg="${FLEET_SRC:?}/configs/mlp_ps.yaml"
tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
for b in fleet-train fleet-eval fleet-ckpt fleetrun; do
  [ -x "$bin/$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD TRAINING_ROLE FLEET_RESTART_COUNT
export FLEET_COMM_TIMEOUT=30
big=(-o train.epochs=2 -o optimizer.lr.warmup_steps=8 -o "model.hidden=[512, 256]")
ps_job() { # ps_job NAME ARGS...: 2 servers + 2 workers; rank 0's output in $tmp/NAME.out
  local name=$1; shift
  timeout 120 "$bin/fleetrun" --server_num 2 --worker_num 2 --log_dir "$tmp/log_$name" \
    "$bin/fleet-train" -c "$cfg" "$@" >"$tmp/$name.out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { echo "$name failed:"; grep -h "error" "$tmp/$name.out" "$tmp/log_$name"/* | head -5; }
  return $rc
}
merge() { # merge OUTNAME ARGS...: fleet-ckpt merge-ps ARGS --out $tmp/OUTNAME; output in .mout
  local name=$1; shift
  "$bin/fleet-ckpt" merge-ps "$@" --out "$tmp/$name" >"$tmp/$name.mout" 2>&1
}

# 1. async: the merged final step evaluates to the job's final line
ps_job async "${big[@]}" -o strategy.a_sync=true -o strategy.a_sync_configs.k_steps=-1 \
  -o optimizer.momentum=0.5 -o checkpoint.dir="$tmp/a" -o checkpoint.save_interval=16 -o checkpoint.keep=0
check "async: exit 0" test $? -eq 0
merge a.safetensors "$tmp/a"
check "async: merge-ps exit 0" test $? -eq 0
cat "$tmp/a.safetensors.mout"
check "async: merged step 64 of 2 servers, 148738 values" \
  grep -q "step 64 of 2 server(s): 148738 trainable values" "$tmp/a.safetensors.mout"
"$bin/fleet-eval" -m "$tmp/a.safetensors" >"$tmp/a.eval" 2>&1
check "async: fleet-eval exit 0" test $? -eq 0
line=$(grep '^worker_index: 0, .*step 64, eval' "$tmp/async.out" | tail -1)
val_loss=$(sed -E 's/.*val_loss ([0-9.]+).*/\1/' <<<"$line")
val_acc=$(sed -E 's/.*val_acc1 ([0-9.]+).*/\1/' <<<"$line")
got_loss=$(sed -nE 's/.*loss ([0-9.]+), top1 ([0-9.]+).*/\1/p' "$tmp/a.eval")
got_acc=$(sed -nE 's/.*loss ([0-9.]+), top1 ([0-9.]+).*/\2/p' "$tmp/a.eval")
echo "job: val_loss ${val_loss:-?} val_acc1 ${val_acc:-?}; merged: loss ${got_loss:-?} top1 ${got_acc:-?}"
check "async: merged top1 is the job's val_acc1" \
  test "$(printf '%.4f' "${got_acc:-9}")" = "${val_acc:-none}"
check "async: merged loss is the job's val_loss (6e-5)" \
  awk -v a="${val_loss:-9}" -v b="${got_loss:-0}" 'BEGIN { d = a - b; exit !(d < 6e-5 && d > -6e-5) }'

# 2. sync: step 16 merged is the workers' checkpoint of step 16, bit for bit
ps_job sync "${big[@]}" -o checkpoint.dir="$tmp/s" -o checkpoint.save_interval=16 -o checkpoint.keep=0
check "sync: exit 0" test $? -eq 0
merge s16.safetensors "$tmp/s" --step 16
check "sync: merge-ps --step 16 exit 0" test $? -eq 0
"$bin/fleet-ckpt" diff "$tmp/s16.safetensors" "$tmp/s/step_00000016" >"$tmp/s16.diff"
grep -v "^only in .*step_00000016.*: \(opt\|dist\|train\)\." "$tmp/s16.diff"
check "sync: the 6 network tensors are the checkpoint's" grep -q "^6 tensors identical" "$tmp/s16.diff"
check "sync: nothing differs, nothing only in the merged file" \
  bash -c "! grep -q '^differs\|^only in $tmp/s16' '$tmp/s16.diff'"

# 3. geo between exchanges: the servers' values, not worker 0's local copy
ps_job geo -o train.max_steps=16 -o strategy.a_sync=true -o strategy.a_sync_configs.k_steps=4 \
  -o checkpoint.dir="$tmp/g" -o checkpoint.save_interval=6
check "geo: exit 0" test $? -eq 0
merge g6.safetensors "$tmp/g" --step 6
check "geo: merge-ps --step 6 exit 0" test $? -eq 0
"$bin/fleet-ckpt" diff "$tmp/g6.safetensors" "$tmp/g/step_00000006" >"$tmp/g6.diff"
check "geo: the merged weights are not worker 0's local copy" grep -q "^differs: fc1.weight" "$tmp/g6.diff"

# 4. refusals, each naming the file (exit 2, nothing written)
bad() { # bad NAME PATTERN ARGS...: merge-ps fails, says PATTERN, writes nothing
  local name=$1 pattern=$2; shift 2
  merge "$name.safetensors" "$@"
  local rc=$?
  cat "$tmp/$name.safetensors.mout"
  check "$name: exit 2 (got $rc)" test $rc -eq 2
  check "$name: names it" grep -q -- "$pattern" "$tmp/$name.safetensors.mout"
  check "$name: nothing written" test ! -e "$tmp/$name.safetensors"
}
cp -r "$tmp/s" "$tmp/missing"
rm "$tmp/missing/ps.server1.16.safetensors"
bad missing "server 1 has no shards of step 16: $tmp/missing/ps.server1.16.safetensors is missing" \
  "$tmp/missing" --step 16
cp -r "$tmp/s" "$tmp/flip"
f="$tmp/flip/ps.server0.16.safetensors"
printf '\x55' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 3)) conv=notrunc 2>/dev/null
bad flip "$f: tensor '.*': checksum mismatch" "$tmp/flip" --step 16
cp -r "$tmp/s" "$tmp/step"
cp "$tmp/s/ps.server1.32.safetensors" "$tmp/step/ps.server1.16.safetensors"
bad step "$tmp/step/ps.server1.16.safetensors holds step 32, but the step merged is 16" \
  "$tmp/step" --step 16
cp -r "$tmp/s" "$tmp/shape"
rm -r "$tmp/shape/step_00000016"
cp -r "$tmp/g/step_00000016" "$tmp/shape/"
bad shape "dense table 0 holds 148738 values, but the network of $tmp/shape/step_00000016/.*safetensors has 20994" \
  "$tmp/shape" --step 16

exit $fail
