#!/usr/bin/env bash
# test_checkpoint_kill.sh - a writer killed in the middle of saving leaves the previous
# checkpoint loadable: fleet-train saves after every step (a 2.2 MB file: mlp [512, 512] and its
# velocities, fsync'd) and is SIGKILLed at a random moment after its first save, 30 to 60 times (until 3 kills have
# landed inside a save), each run resuming from
# where `latest` points; after every kill `latest` must name a checkpoint that opens whole
# (fleet-ckpt ls verifies every checksum and byte range) and training must resume from it.
# A kill that landed inside a save shows as a temporary file left beside the checkpoint; the
# test reports how many did, and fails if none did (the kills would then prove nothing).
set -u
bin="${FLEET_BIN:?}/fleet-train"
ckpt="${FLEET_BIN:?}/fleet-ckpt"
[ -x "$bin" ] && [ -x "$ckpt" ] || { echo "SKIPPED: fleet-train or fleet-ckpt not built"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
dir="$tmp/ck"

cat >"$tmp/cfg.yaml" <<'EOF'
model: {type: mlp, hidden: [512, 512], activation: tanh}
data: {type: teacher, features: 32, classes: 2, train_size: 4096, val_size: 0, seed: 5}
optimizer: {type: momentum, momentum: 0.9, lr: {base: 0.02}}
train: {batch_size: 32, epochs: 1000, log_interval: 100000, seed: 1}
checkpoint: {save_interval: 1, keep: 2}
EOF

kills=0 midsave=0 loadable=0 with_latest=0
# 30 kills, more (up to 60) until 3 of them have landed inside a save
for i in $(seq 1 60); do
  [ "$i" -gt 30 ] && [ "$midsave" -ge 3 ] && break
  args=(-c "$tmp/cfg.yaml" -o train.log_dir="$tmp/log" -o checkpoint.dir="$dir")
  [ -f "$dir/latest" ] && args+=(--resume "$dir")
  before=$(cat "$dir/latest" 2>/dev/null)
  "$bin" "${args[@]}" >"$tmp/run.out" 2>"$tmp/run.err" &
  pid=$!
  # once this run has saved a checkpoint of its own, a random moment within the next 0.3 s
  for _ in $(seq 1 1000); do
    [ "$(cat "$dir/latest" 2>/dev/null)" != "$before" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  sleep "0.$(printf '%03d' $((RANDOM % 300)))"
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    kills=$((kills + 1))
  else
    echo "FAIL: run $i ended before it was killed:"; tail -3 "$tmp/run.err"; fail=1
  fi
  wait "$pid" 2>/dev/null
  # its unfinished file: a checkpoint, or the `latest` pointer
  compgen -G "$dir/step_*/*.tmp-$pid" >/dev/null || compgen -G "$dir/latest.tmp-$pid" >/dev/null &&
    midsave=$((midsave + 1))
  [ -f "$dir/latest" ] || continue
  with_latest=$((with_latest + 1))
  if out=$("$ckpt" ls "$dir" 2>&1); then
    loadable=$((loadable + 1))
  else
    echo "FAIL: after kill $i, latest ($(cat "$dir/latest")) does not load: $out"; fail=1
  fi
done
echo "$kills kills, $midsave left a save half-written, latest loadable after $loadable of $with_latest"
[ "$with_latest" -ge 20 ] || { echo "FAIL: only $with_latest runs got as far as a checkpoint"; fail=1; }
[ "$midsave" -ge 1 ] || { echo "FAIL: no kill landed inside a save"; fail=1; }

# training goes on from the last one: two more steps, then a clean end with a final save
step=$(sed -E 's/step_0*//' "$dir/latest")
step=${step:-0}
if "$bin" -c "$tmp/cfg.yaml" -o train.log_dir="$tmp/log" -o checkpoint.dir="$dir" \
     -o train.max_steps=$((step + 2)) --resume "$dir" >"$tmp/end.out" 2>"$tmp/end.err" &&
   grep -q "resumed from .*step $step," "$tmp/end.err" &&
   [ "$(cat "$dir/latest")" = "$(printf 'step_%08d' $((step + 2)))" ]; then
  echo "resumed from step $step and finished at step $((step + 2))"
else
  echo "FAIL: resuming after the kills"; tail -3 "$tmp/end.err"; fail=1
fi
# keep: 2 -> exactly two step directories remain, the newest
n=$(ls -d "$dir"/step_* | wc -l)
[ "$n" -eq 2 ] || { echo "FAIL: $n step directories kept, want 2"; ls "$dir"; fail=1; }
exit $fail
