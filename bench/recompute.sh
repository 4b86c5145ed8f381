#!/usr/bin/env bash
# recompute.sh - what strategy.recompute (auto checkpoints) buys and costs, measured with
# bench/cnn_step on the onednn backend (the default), each model with and without recompute in
# the same run, alternating:
#   ResNet-50 (3x224x224, 1000 classes) at batch 8, and a deep MLP (mlp24: 24 hidden ReLU
#   layers of 1024, batch 256).
# Table 1: median step time over ROUNDS (each the median of REPEATS steps), time ratio
# recompute / plain (the ideal is about 4/3: one more forward pass per step), the network's
# activation memory (outputs kept + recompute arena + output gradients, fl_net_activation_bytes)
# and the process's peak resident memory (max RSS).
# Table 2: the largest batch whose training (build + 2 steps) stays within a memory budget
# (peak resident memory: 3 GiB for ResNet-50, 768 MiB for the MLP, whose parameters, gradients
# and momentum take 300 MB), with and without recompute, found by doubling and bisection to
# 1/32. (An address-space limit, ulimit -v, is no fair judge: near it oneDNN falls back to
# slower kernels instead of failing.)
# Usage: bench/recompute.sh [BUILD_DIR]
#   ROUNDS=3 REPEATS=3 THREADS=2 MODELS="resnet50 mlp24" SEARCH=1 (ROUNDS=0: table 2 only)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
step="$build/bench/cnn_step"
rounds=${ROUNDS:-3}
repeats=${REPEATS:-3}
threads=${THREADS:-2}
models_wanted=${MODELS:-"resnet50 mlp24"}
[[ -x "$step" ]] || { echo "recompute.sh: $step not built (make build)" >&2; exit 1; }
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
err=$(mktemp)
trap 'rm -f "$err"' EXIT
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
field() { grep -o "$1 [0-9.]*" "$err" | head -1 | awk '{ print $2 }'; }

# model | batch | iters per timing | largest batch searched | memory budget (MiB)
models=(
  "resnet50|8|1|256|3072"
  "mlp24|256|2|65536|768"
)
printf '# %s, %s cores, %s threads, load %s\n' "$(date -u +%FT%TZ)" "$(nproc)" "$threads" \
  "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-9s %6s %11s %11s %7s %9s %9s %9s %9s %8s\n' model batch "plain ms" "recomp ms" \
  ratio "plain act" "recomp act" "act saved" "plain rss" "recomp rss"
for m in "${models[@]}"; do
  IFS='|' read -r name batch iters _ <<<"$m"
  [[ " $models_wanted " == *" $name "* ]] && ((rounds > 0)) || continue
  declare -A ms=() act=() rss=()
  for ((r = 0; r < rounds; r++)); do
    for c in none auto; do
      ms[$c]+="$("$step" "$name" "$batch" "$iters" "$repeats" onednn "$c" 2>"$err") "
      act[$c]=$(field act)
      rss[$c]+="$(field maxrss) "
    done
  done
  p=$(printf '%s\n' ${ms[none]} | median) q=$(printf '%s\n' ${ms[auto]} | median)
  pr=$(printf '%s\n' ${rss[none]} | median) qr=$(printf '%s\n' ${rss[auto]} | median)
  awk -v n="$name" -v b="$batch" -v p="$p" -v q="$q" -v pa="${act[none]}" -v qa="${act[auto]}" \
    -v pr="$pr" -v qr="$qr" 'BEGIN {
      printf "%-9s %6d %11.1f %11.1f %7.3f %8.1fM %8.1fM %8.1f%% %8.0fM %8.0fM\n",
        n, b, p, q, q / p, pa, qa, 100 * (1 - qa / pa), pr, qr }'
done
echo "# ratio = recompute / plain step time (median of $rounds rounds x $repeats steps); act ="
echo "# planned activation memory; rss = peak resident memory of the process"

[[ ${SEARCH:-1} == 1 ]] || exit 0
# fits MODEL BATCH CHECKPOINTS MIB: builds and trains 2 steps with a peak RSS within MIB
fits() {
  "$step" "$1" "$2" 1 1 onednn "$3" >/dev/null 2>"$err" || return 1
  awk -v r="$(field maxrss)" -v m="$4" 'BEGIN { exit !(r > 0 && r <= m) }'
}
# largest MODEL CHECKPOINTS MAX MIB: the largest batch <= MAX that fits, to 1/32 (0: none)
largest() {
  local lo=0 hi=1
  while ((hi <= $3)) && fits "$1" "$hi" "$2" "$4"; do lo=$hi; hi=$((hi * 2)); done
  ((hi > $3)) && hi=$(($3 + 1))
  while ((hi - lo > 1 && (hi - lo) * 32 > lo)); do
    local mid=$(((lo + hi) / 2))
    if fits "$1" "$mid" "$2" "$4"; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}
echo
printf '%-9s %9s %12s %12s %7s\n' model budget "plain batch" "recomp batch" ratio
for m in "${models[@]}"; do
  IFS='|' read -r name _ _ max gib <<<"$m"
  [[ " $models_wanted " == *" $name "* ]] || continue
  p=$(largest "$name" none "$max" "$gib") q=$(largest "$name" auto "$max" "$gib")
  awk -v n="$name" -v l="$gib" -v p="$p" -v q="$q" \
    'BEGIN { printf "%-9s %6d MiB %12d %12d %7.2f\n", n, l, p, q, (p > 0 ? q / p : 0) }'
done
echo "# the largest batch (to 1/32) that builds and trains 2 steps within the budget of peak RSS"
