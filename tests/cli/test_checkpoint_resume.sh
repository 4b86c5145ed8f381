#!/usr/bin/env bash
# test_checkpoint_resume.sh - resume is exact: a run stopped at step 21 (mid-epoch, between
# Local SGD synchronisations) by train.max_steps and resumed with --resume ends with the same
# tensors, bit for bit (parameters, velocities, strategy state, counters), as the uninterrupted
# run, for one worker (Momentum with warm-up and cosine decay; gradient merge) and for N = 2
# under fleetrun: dense with rank 0's file, dense with one file per rank, DGC and Local SGD
# (whose state differs by rank, so the save goes per rank by itself). Also: resuming from a
# periodic checkpoint of the uninterrupted run gives its end too; a checkpoint of 2 workers is
# refused by a job of 1 naming both counts; a changed key is warned about by name. Under
# strategy.amp the loss scale and its counters resume exactly too.
set -u
bin="${FLEET_BIN:?}/fleet-train"
run="${FLEET_BIN:?}/fleetrun"
ckpt="${FLEET_BIN:?}/fleet-ckpt"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for b in "$bin" "$run" "$ckpt"; do
  [ -x "$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done

cat >"$tmp/cfg.yaml" <<'EOF'
model: {type: mlp, hidden: [64, 64], activation: tanh}
data: {type: teacher, features: 32, classes: 2, train_size: 2048, val_size: 256, teacher_hidden: 16, seed: 3}
optimizer:
  type: momentum
  momentum: 0.9
  weight_decay: 0.0001
  lr: {base: 0.1, schedule: cosine, decay_steps: 100, warmup_steps: 8, warmup_start: 0.01}
train: {batch_size: 32, epochs: 2, log_interval: 8, seed: 7}
checkpoint: {save_interval: 10, keep: 0}
EOF

launch() { # launch N NAME ARGS...: fleet-train on N workers (N = 1: a plain process)
  local n=$1 name=$2
  shift 2
  if [ "$n" = 1 ]; then
    timeout 120 "$bin" -c "$tmp/cfg.yaml" -o train.log_dir="$tmp/log_$name" "$@" \
      >"$tmp/$name.out" 2>"$tmp/$name.err"
  else
    FLEET_COMM_TIMEOUT=60 timeout 180 "$run" --nproc_per_node "$n" --log_dir "$tmp/wlog_$name" \
      "$bin" -c "$tmp/cfg.yaml" -o train.log_dir="$tmp/log_$name" "$@" \
      >"$tmp/$name.out" 2>"$tmp/$name.err"
  fi
  local rc=$?
  [ $rc -eq 0 ] || { echo "FAIL: $name exited $rc"; tail -5 "$tmp/$name.out" "$tmp/$name.err"; fail=1; }
  return $rc
}

same_end() { # same_end WHAT DIR_A DIR_B NFILES: the latest checkpoints hold identical tensors
  local what=$1 a=$2 b=$3 n=$4 la lb f
  la=$(cat "$a/latest" 2>/dev/null); lb=$(cat "$b/latest" 2>/dev/null)
  if [ -z "$la" ] || [ "$la" != "$lb" ]; then
    echo "FAIL: $what: latest '$la' vs '$lb'"; fail=1; return
  fi
  if [ "$n" = 1 ]; then files=(model.safetensors); else files=(); for ((r = 0; r < n; r++)); do files+=("rank_$r.safetensors"); done; fi
  for f in "${files[@]}"; do
    if [ ! -f "$a/$la/$f" ] || [ ! -f "$b/$lb/$f" ]; then
      echo "FAIL: $what: $la/$f missing"; ls "$a/$la" "$b/$lb"; fail=1; return
    fi
    if ! out=$("$ckpt" diff "$a/$la/$f" "$b/$lb/$f"); then
      echo "FAIL: $what: $f differs: $out"; fail=1; return
    fi
  done
  echo "ok: $what: $la, ${files[*]}: $(echo "$out" | tail -1)"
}

case_resume() { # case_resume NAME N NFILES ARGS...: uninterrupted vs stopped at 21 + resumed
  local name=$1 n=$2 nf=$3
  shift 3
  launch "$n" "${name}_full" -o checkpoint.dir="$tmp/$name/full" "$@" || return
  launch "$n" "${name}_stop" -o checkpoint.dir="$tmp/$name/part" -o train.max_steps=21 "$@" || return
  if [ "$(cat "$tmp/$name/part/latest")" != step_00000021 ]; then
    echo "FAIL: $name: the stopped run's final checkpoint is not step 21"; fail=1; return
  fi
  launch "$n" "${name}_resume" -o checkpoint.dir="$tmp/$name/part" --resume "$tmp/$name/part" "$@" || return
  grep -q "resumed from .*step 21, epoch 0, batch" "$tmp/${name}_resume.err" "$tmp/wlog_${name}_resume/workerlog.0" 2>/dev/null ||
    { echo "FAIL: $name: no 'resumed from' line"; fail=1; }
  same_end "$name: stopped at 21 and resumed = uninterrupted" "$tmp/$name/full" "$tmp/$name/part" "$nf"
}

# 1. one worker: Momentum, warm-up + cosine
case_resume single 1 1
# a periodic checkpoint of the uninterrupted run, resumed, ends where it ended
launch 1 single_from20 -o checkpoint.dir="$tmp/single/from20" --resume "$tmp/single/full/step_00000020" &&
  same_end "single: resumed from the uninterrupted run's step 20" "$tmp/single/full" "$tmp/single/from20" 1
# 2. gradient merge (k = 2: the loader position is in micro-batches, 2 per step)
case_resume merge 1 1 -o strategy.gradient_merge=true -o strategy.gradient_merge_configs.k_steps=2
# 3. two workers, dense: rank 0 saves for both
case_resume dense2 2 1
# 4. two workers, one file per rank
case_resume perrank2 2 2 -o checkpoint.per_rank=true
# 5. DGC: residuals differ by rank -> per-rank files without being asked
case_resume dgc2 2 2 -o strategy.dgc=true -o strategy.dgc_configs.rampup_begin_step=4 \
  -o strategy.dgc_configs.rampup_step=8 -o strategy.dgc_configs.min_compress_numel=1000
grep -q "the state differs between ranks" "$tmp/dgc2_stop.out" "$tmp/dgc2_stop.err" 2>/dev/null ||
  { echo "FAIL: dgc2: no per-rank warning"; fail=1; }
# 6. Local SGD, every 4 steps: step 21 falls between synchronisations
case_resume localsgd2 2 2 -o strategy.localsgd=true -o strategy.localsgd_configs.k_steps=4

# 6b. mixed precision: the loss scale and its counters (amp.state) resume exactly; an inf on
# rank 1 at step 7 (skipped) and growth every 5 finite steps leave them mid-count at step 21
FLEET_AMP_INJECT_INF=7,1 case_resume amp2 2 1 -o strategy.amp=true \
  -o strategy.amp_configs.incr_every_n_steps=5 -o strategy.amp_configs.init_loss_scaling=1024
grep -q '^worker_index: 0, epoch 0, step 32, .*, loss_scale 65536, skipped 1$' "$tmp/amp2_full.out" ||
  { echo "FAIL: amp2: the uninterrupted run's scale is not 1024 x 2^6 after 32 steps, 1 skipped"; fail=1; }

# 7. a 2-worker checkpoint resumed by a job of 1: rescaled, and said (test_elastic_resume.sh
# checks how)
if ! "$bin" -c "$tmp/cfg.yaml" -o train.log_dir="$tmp/log_w" --resume "$tmp/dense2/part" >"$tmp/w.out" 2>&1; then
  echo "FAIL: a 2-worker checkpoint not resumed on 1 worker"; cat "$tmp/w.out"; fail=1
elif grep -q "written by 2 worker(s), this job has 1: batch size per worker kept, learning rate x 0.5" "$tmp/w.out"; then
  echo "ok: world-size change said: $(grep 'this job has 1' "$tmp/w.out" | head -1 | cut -c1-120)"
else
  echo "FAIL: world-size change not said"; cat "$tmp/w.out"; fail=1
fi
# 8. a changed key is named in a warning
launch 1 warn -o checkpoint.dir="$tmp/warn" -o optimizer.lr.base=0.05 --resume "$tmp/single/full/step_00000020" &&
  if grep -q "resume: 1 key(s) differ .*: optimizer.lr.base;" "$tmp/warn.err"; then
    echo "ok: changed key warned about"
  else
    echo "FAIL: no warning naming optimizer.lr.base"; cat "$tmp/warn.err"; fail=1
  fi
# 9. --resume of something that is not a checkpoint
if "$bin" -c "$tmp/cfg.yaml" --resume "$tmp" >"$tmp/n.out" 2>&1 || ! grep -q "not a checkpoint" "$tmp/n.out"; then
  echo "FAIL: --resume of a plain directory"; cat "$tmp/n.out"; fail=1
fi
exit $fail
