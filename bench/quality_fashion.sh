#!/usr/bin/env bash
# quality_fashion.sh - what each strategy costs in accuracy on real data (issue 16): Fashion-MNIST
# (Debian's dataset-fashion-mnist), 4 workers under fleetrun on this machine, the same recipe,
# steps and seeds for every strategy: dense, DGC (sparsity 0.999 after seed 000's warm-up),
# Local SGD k = 4 and 16, post-local SGD (synchronous first epoch, then k = 16) and adaptive
# Local SGD (Paddle's rule with init_k_steps 16, and `adacomm`: Wang & Joshi's rule with
# tau_0 = ADACOMM_K, default 8), for an MLP (configs/fashion_mlp.yaml) and a small CIFAR-style
# ResNet (configs/fashion_resnet.yaml); an optional row dgc_small is DGC that also compresses
# the tensors of 2048..16383 values that Paddle's min_compress_numel keeps dense; optional rows
# dgc_allgather and dgc_sparse are DGC with its pairs exchanged by allgather or by the sparse
# allreduce (dgc_configs.exchange; the dgc row's auto picks allgather for these models at 4
# workers). Prints one table row per (model, strategy): final test accuracy
# (mean over seeds, and min..max), bytes each worker sent, updates that communicated, and for
# adaptive Local SGD the interval it chose per epoch (rank 0's metrics.jsonl, seed 1).
#
# Usage: bench/quality_fashion.sh [BUILD_DIR]
#   MODELS="mlp resnet"   ROWS="dense dgc k4 k16 postlocal adaptive adacomm"   SEEDS="1 2 3"
#   NPROC=4   EXTRA="-o key=value ..." (every run)   KEEP=DIR (keep logs and metrics there; a
#   run whose metrics.jsonl is already complete in DIR is not run again, one interrupted goes
#   on from its last checkpoint (every log_interval steps), so an interrupted table resumes,
#   and ROWS can be run in batches)   SUMMARY_ONLY=1 (with KEEP: only the table)
# Accuracy does not depend on the link, so the workers talk over loopback; timings mean nothing
# here (bench/dgc_netlab.sh and bench/localsgd_netlab.sh measure those).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
read -r -a models <<<"${MODELS:-mlp resnet}"
read -r -a rows <<<"${ROWS:-dense dgc k4 k16 postlocal adaptive adacomm}"
read -r -a seeds <<<"${SEEDS:-1 2 3}"
read -r -a extra <<<"${EXTRA:-}"
nproc=${NPROC:-4}
work=${KEEP:-$(mktemp -d /tmp/quality_fashion.XXXXXX)}
mkdir -p "$work"
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$work"' EXIT
[[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] ||
  { echo "quality_fashion.sh: Fashion-MNIST is not installed (scripts/install-deps.sh)" >&2; exit 1; }

# private copies of the binaries: a rebuild during the table does not change a later run
bin=$work/bin
mkdir -p "$bin"
if [[ -z ${SUMMARY_ONLY:-} ]]; then
  for t in fleetrun fleet-train; do
    [[ -x $build/tools/$t ]] || { echo "quality_fashion.sh: $build/tools/$t not built (make build)" >&2; exit 1; }
    cp "$build/tools/$t" "$bin/$t"
  done
fi
export OMP_NUM_THREADS=1

config_of() { echo "$here/../configs/fashion_$1.yaml"; }
# global batches per epoch: 60000 / (NPROC x batch_size)
epoch_steps() {
  local b
  b=$("$bin/fleet-train" -c "$(config_of "$1")" "${extra[@]}" --print-config |
    sed -nE 's/^train\.batch_size: *([0-9]+)$/\1/p')
  echo $((60000 / (nproc * b)))
}

# the strategy overrides of a row; DGC's warm-up (seed 000: dense first, then 0.75, 0.9375,
# 0.984375, 0.996, 0.999) spans the first three epochs of the MLP's 12 and 1.5 of the ResNet's 3
row_args() { # ROW MODEL EPOCH_STEPS
  local s=$3 begin ramp
  if [[ $2 == mlp ]]; then begin=$s ramp=$((2 * s)); else begin=$((s / 2)) ramp=$s; fi
  case $1 in
    dense) echo "" ;;
    dgc) echo "-o strategy.dgc=true -o strategy.dgc_configs.rampup_begin_step=$begin" \
      "-o strategy.dgc_configs.rampup_step=$ramp" \
      "-o strategy.dgc_configs.sparsity=[0.75,0.9375,0.984375,0.996,0.999]" ;;
    dgc_small) echo "$(row_args dgc "$2" "$3") -o strategy.dgc_configs.min_compress_numel=2048" ;;
    dgc_allgather) echo "$(row_args dgc "$2" "$3") -o strategy.dgc_configs.exchange=allgather" ;;
    dgc_sparse) echo "$(row_args dgc "$2" "$3") -o strategy.dgc_configs.exchange=sparse" ;;
    k4) echo "-o strategy.localsgd=true -o strategy.localsgd_configs.k_steps=4" ;;
    k16) echo "-o strategy.localsgd=true -o strategy.localsgd_configs.k_steps=16" ;;
    postlocal) echo "-o strategy.localsgd=true -o strategy.localsgd_configs.k_steps=16" \
      "-o strategy.localsgd_configs.begin_step=$s" ;;
    adaptive) echo "-o strategy.adaptive_localsgd=true" \
      "-o strategy.adaptive_localsgd_configs.init_k_steps=16" ;;
    adacomm) echo "-o strategy.adaptive_localsgd=true -o strategy.adaptive_localsgd_configs.rule=adacomm" \
      "-o strategy.adaptive_localsgd_configs.init_k_steps=${ADACOMM_K:-8}" ;;
    *) echo "quality_fashion.sh: unknown row '$1'" >&2; exit 2 ;;
  esac
}

# field NAME of the last record of phase PHASE in a metrics file
last() { grep "\"phase\":\"$2\"" "$1" | tail -1 | sed -nE "s/.*\"$3\":(null|[-0-9.eE+]*).*/\1/p"; }
# field NAME of RUN's last train records, summed over its segments
seg_sum() {
  local m t=0
  for m in "$1"/metrics.part*.jsonl "$1/metrics.jsonl"; do
    [[ -s $m ]] && t=$(awk -v a="$t" -v b="$(last "$m" train "$2")" 'BEGIN { printf "%.0f", a + b }')
  done
  echo "$t"
}
complete() { [[ -s $1/metrics.jsonl ]] && grep -q '"phase":"eval"' "$1/metrics.jsonl" && [[ -e $1/done ]]; }

# Runs save a checkpoint every log_interval steps (keeping the newest) and start with
# checkpoint.resume=auto, so that a run interrupted (the machine needed, the session over) goes
# on from its last checkpoint when the table is run again, to the same bytes as an uninterrupted
# run (docs/checkpoint.md). The interrupted segment's records up to that checkpoint are kept as
# metrics.part<NN>.jsonl; a run's bytes, synchronised updates and seconds are summed over its
# segments (each process counts from its own start).
log_interval() {
  "$bin/fleet-train" -c "$(config_of "$1")" "${extra[@]}" --print-config |
    sed -nE 's/^train\.log_interval: *([0-9]+)$/\1/p'
}
# set RUN's interrupted segment aside; false when there is nothing to resume from
keep_segment() {
  local run=$1 s n
  s=$(sed -nE 's/^step_0*([0-9]+)$/\1/p' "$run/ckpt/latest" 2>/dev/null)
  [[ -n $s && -s $run/metrics.jsonl ]] || return 1
  n=$(find "$run" -maxdepth 1 -name 'metrics.part*.jsonl' | wc -l)
  awk -v s="$s" 'match($0, /"step":[0-9]+/) && substr($0, RSTART + 7, RLENGTH - 7) + 0 <= s' \
    "$run/metrics.jsonl" >"$(printf '%s/metrics.part%02d.jsonl' "$run" "$n")"
  rm -f "$run/metrics.jsonl"
  echo "# resuming $(basename "$run") from step $s" >&2
}
# a run's metrics, its segments in order
metrics_of() { cat "$1"/metrics.part*.jsonl "$1/metrics.jsonl" 2>/dev/null; }

if [[ -z ${SUMMARY_ONLY:-} ]]; then
  for model in "${models[@]}"; do
    s=$(epoch_steps "$model")
    for row in "${rows[@]}"; do
      read -r -a args <<<"$(row_args "$row" "$model" "$s")"
      for seed in "${seeds[@]}"; do
        run=$work/$model.$row.s$seed
        complete "$run" && continue
        keep_segment "$run" || { rm -rf "$run"; : >"$run.out"; }
        echo "# running $model $row seed $seed" >&2
        start=$(date +%s)
        if ! FLEET_JOB_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n') \
          "$bin/fleetrun" --nproc_per_node "$nproc" --log_dir "$run/log" \
          "$bin/fleet-train" -c "$(config_of "$model")" "${extra[@]}" "${args[@]}" \
          -o "train.seed=$seed" -o "data.seed=$seed" -o "train.log_dir=$run" \
          -o "checkpoint.dir=$run/ckpt" -o "checkpoint.save_interval=$(log_interval "$model")" \
          -o checkpoint.keep=1 -o checkpoint.resume=auto >>"$run.out" 2>&1; then
          echo "quality_fashion.sh: $model $row seed $seed failed:" >&2
          tail -20 "$run.out" >&2
          exit 1
        fi
        # seconds: this segment's, and the earlier segments' up to their checkpoints
        for part in "$run"/metrics.part*.jsonl; do
          [[ -e $part ]] && start=$(awk -v s="$start" -v t="$(last "$part" train time)" \
            'BEGIN { printf "%d", s - t }')
        done
        echo "$(($(date +%s) - start))" >"$run/done"
        rm -rf "$run/ckpt"
      done
    done
  done
fi

# "epoch:k" of the last train record of each epoch
intervals() {
  awk '/"phase":"train"/ { match($0, /"epoch":[0-9]*/); e = substr($0, RSTART + 8, RLENGTH - 8) + 0
                           if (match($0, /"localsgd_k":[0-9]*/)) k[e] = substr($0, RSTART + 13, RLENGTH - 13)
                           if (e > m) m = e }
       END { for (i = 0; i <= m; i++) printf "%s%s", (i ? " " : ""), (i in k ? k[i] : "-"); print "" }' "$1"
}

echo "# quality_fashion: Fashion-MNIST, $nproc workers (fleetrun, loopback), seeds ${seeds[*]}," \
  "${extra[*]:-default recipes}, $(date -u +%Y-%m-%dT%H:%MZ)"
for model in "${models[@]}"; do
  echo
  echo "$model ($(basename "$(config_of "$model")")):"
  echo
  echo "| strategy | test acc % (mean) | min .. max | vs dense (pt) | MB sent per worker | bytes / dense | updates that synchronised | run s |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  dense_acc="" dense_bytes=""
  for row in "${rows[@]}"; do
    accs=() bytes=() synced="" steps="" secs=()
    for seed in "${seeds[@]}"; do
      m=$work/$model.$row.s$seed/metrics.jsonl
      complete "$work/$model.$row.s$seed" || continue
      accs+=("$(last "$m" eval val_acc1)")
      bytes+=("$(seg_sum "$work/$model.$row.s$seed" bytes_sent)")
      secs+=("$(cat "$work/$model.$row.s$seed/done")")
      [[ -n $synced ]] || { synced=$(seg_sum "$work/$model.$row.s$seed" synced_steps); steps=$(last "$m" train step); }
    done
    [[ ${#accs[@]} -gt 0 ]] || { echo "| $row | - | | | | | | |"; continue; }
    read -r mean lo hi mb sec < <(printf '%s\n' "${accs[@]}" | paste -sd' ' |
      awk -v b="${bytes[*]}" -v t="${secs[*]}" '{ lo = 1e9; hi = -1e9
        for (i = 1; i <= NF; i++) { s += $i; if ($i < lo) lo = $i; if ($i > hi) hi = $i }
        nb = split(b, B, " "); for (i = 1; i <= nb; i++) sb += B[i]
        nt = split(t, T, " "); for (i = 1; i <= nt; i++) st += T[i]
        printf "%.2f %.2f %.2f %.2f %.0f\n", 100 * s / NF, 100 * lo, 100 * hi, sb / nb / 1e6, st / nt }')
    if [[ $row == dense ]]; then dense_acc=$mean dense_bytes=$mb; fi
    delta=$([[ -n $dense_acc ]] && awk -v a="$mean" -v d="$dense_acc" 'BEGIN { printf "%+.2f", a - d }' || echo "")
    ratio=$([[ -n $dense_bytes ]] && awk -v a="$mb" -v d="$dense_bytes" 'BEGIN { printf "%.3f", a / d }' || echo "")
    echo "| $row | $mean | $lo .. $hi | $delta | $mb | $ratio | $synced of $steps | $sec |"
  done
  for row in "${rows[@]}"; do
    r=$work/$model.$row.s${seeds[0]}
    [[ ($row == adaptive || $row == adacomm) && -s $r/metrics.jsonl ]] || continue
    echo
    echo "$row, seed ${seeds[0]}: the interval k at the end of each epoch: $(metrics_of "$r" | intervals /dev/stdin)"
  done
done
