#!/usr/bin/env bash
# dgc_accuracy.sh - Deep Gradient Compression against dense Momentum on a learnable task (issue
# 5): the same model, data, steps and seeds, 2 workers under fleetrun on this machine; final
# validation accuracy and what a rank sends per step once the warm-up is over (rank 0's
# metrics.jsonl, comm_mb per log interval). Goal: DGC at 0.999 within 0.5 points of dense while
# sending <= 1/100 of dense's bytes per step. With ABLATIONS=1 each of DGC's techniques is also
# switched off alone (docs/dgc.md, "Ablations").
#
# Usage: bench/dgc_accuracy.sh [BUILD_DIR]
#   CONFIG=configs/mlp_dgc.yaml   NPROC=2   EXTRA="-o key=value ..." (more overrides, every run)
#   ABLATIONS=0|1 (0)   CLIP=0 (optimizer.clip_norm of every run; > 0 makes local clipping count)
#   SEEDS="1"     train.seed of each repetition (initialisation and shuffling); the table shows
#                 the mean over seeds and each seed's accuracy
#   KEEP=DIR      keep every run's log and metrics.jsonl there
# Timings here mean nothing (loopback, shared CPU); bench/dgc_netlab.sh measures step times.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
config=${CONFIG:-$here/../configs/mlp_dgc.yaml}
nproc=${NPROC:-2}
ablations=${ABLATIONS:-0}
read -r -a seeds <<<"${SEEDS:-1}"
clip=${CLIP:-0}
read -r -a extra <<<"${EXTRA:-}"
fleetrun=$build/tools/fleetrun
fleet_train=$build/tools/fleet-train
for f in "$fleetrun" "$fleet_train"; do
  [[ -x $f ]] || { echo "dgc_accuracy.sh: $f not built (make build)" >&2; exit 1; }
done
[[ -r $config ]] || { echo "dgc_accuracy.sh: cannot read $config" >&2; exit 1; }
work=${KEEP:-$(mktemp -d /tmp/dgc_accuracy.XXXXXX)}
mkdir -p "$work"
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# the warm-up's end (rampup_begin_step + rampup_step) and the log interval, as fleet-train
# resolves them (the config plus EXTRA)
resolved=$("$fleet_train" -c "$config" "${extra[@]}" --print-config 2>/dev/null || true)
key() { sed -nE "s/^ *\"?$1\"?[:=] *\"?([^\",]*)\"?,?$/\1/p" <<<"$resolved" | head -1; }
warm_end=$(( $(key 'strategy.dgc_configs.rampup_begin_step' || echo 0) + $(key 'strategy.dgc_configs.rampup_step' || echo 0) ))
interval=$(key 'train.log_interval')
[[ -n $interval ]] || interval=32

runs=("dense:-o strategy.dgc=false" "dgc:-o strategy.dgc=true")
if [[ $ablations == 1 ]]; then
  runs+=("no-warmup:-o strategy.dgc=true -o strategy.dgc_configs.warmup=false"
    "no-correction:-o strategy.dgc=true -o strategy.dgc_configs.momentum_correction=false"
    "no-masking:-o strategy.dgc=true -o strategy.dgc_configs.momentum_masking=false"
    "no-wd-correction:-o strategy.dgc=true -o strategy.dgc_configs.weight_decay_correction=false")
  if awk -v c="$clip" 'BEGIN { exit !(c > 0) }'; then
    runs+=("no-local-clip:-o strategy.dgc=true -o strategy.dgc_configs.local_clipping=false")
  fi
fi

echo "# dgc_accuracy: $(basename "$config") ${extra[*]}, $nproc workers (fleetrun, loopback)," \
  "clip_norm $clip, seeds ${seeds[*]}, warm-up ends at step $warm_end, $(date -u +%Y-%m-%dT%H:%MZ)"
for seed in "${seeds[@]}"; do
  for r in "${runs[@]}"; do
    name=${r%%:*}.s$seed
    read -r -a args <<<"${r#*:}"
    echo "# running $name" >&2
    if ! FLEET_JOB_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n') \
      "$fleetrun" --nproc_per_node "$nproc" --log_dir "$work/$name.log" \
      "$fleet_train" -c "$config" -o "train.log_dir=$work/$name" -o "optimizer.clip_norm=$clip" \
      "${extra[@]}" -o "train.seed=$seed" "${args[@]}" >"$work/$name.out" 2>&1; then
      echo "dgc_accuracy.sh: $name failed:" >&2
      tail -20 "$work/$name.out" >&2
      exit 1
    fi
  done
done

# summary NAME -> "val_acc train_loss MB_per_step_after_warmup"
summary() {
  awk -v we="$warm_end" -v iv="$interval" '
    /"phase":"eval"/ { if (match($0, /"val_acc1":[-0-9.eE+]*/)) acc = substr($0, RSTART + 11, RLENGTH - 11)
                       if (match($0, /"train_loss":[-0-9.eE+]*/)) loss = substr($0, RSTART + 13, RLENGTH - 13) }
    /"phase":"train"/ { match($0, /"step":[0-9]*/); step = substr($0, RSTART + 7, RLENGTH - 7) + 0
                        match($0, /"comm_mb":[-0-9.eE+]*/); mb = substr($0, RSTART + 10, RLENGTH - 10) + 0
                        if (step - iv >= we) { sum += mb; n += iv } }
    END { printf "%s %s %.6f\n", acc, loss, n ? sum / n : -1 }' "$work/$1/metrics.jsonl"
}

# mean NAME -> "val_acc train_loss MB per_seed_accs" over the seeds
mean() {
  local seed
  for seed in "${seeds[@]}"; do summary "$1.s$seed"; done |
    awk '{ a += $1; l += $2; m += $3; n++; each = each sprintf("%s%.2f", n > 1 ? " " : "", 100 * $1) }
         END { printf "%.6f %.6f %.6f %s\n", a / n, l / n, m / n, each }'
}

read -r dense_acc _ dense_mb _ <<<"$(mean dense)"
echo
printf '%-18s %9s %10s %11s %14s %10s  %s\n' config val_acc1 "vs dense" train_loss \
  "MB/step/rank" "vs dense" "val_acc1 per seed"
for r in "${runs[@]}"; do
  name=${r%%:*}
  read -r acc loss mb each <<<"$(mean "$name")"
  awk -v n="$name" -v a="$acc" -v l="$loss" -v m="$mb" -v da="$dense_acc" -v dm="$dense_mb" \
    -v e="$each" 'BEGIN {
    printf "%-18s %8.2f%% %+9.2f %11.4f %14.4f %10.4f  %s\n", n, 100 * a, 100 * (a - da), l, m,
      (dm > 0 ? m / dm : 0), e }'
done
echo "# means over ${#seeds[@]} seed(s); MB/step/rank: bytes rank 0 sent per step in the log" \
  "windows after step $warm_end (after the warm-up); vs dense: points of accuracy, and the" \
  "ratio of bytes (goal <= 0.01)"
