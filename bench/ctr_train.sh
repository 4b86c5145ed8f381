#!/usr/bin/env bash
# ctr_train.sh - one process training wide&deep on ctr_synth: fleet (bench/ctr_train) beside
# PyTorch 1.13 (Debian's python3-torch; bench/ctr_train_torch.py), the same model, samples,
# batch, optimizers and thread count, alternating the two in one run.
# ctr_train writes the samples once (DUMP_DIR) for the PyTorch side; each run then generates /
# loads them in memory before timing. A run: PASSES passes of STEPS distinct batches, pass 0
# warms up, the median examples/s of the others; AUC on 8192 validation samples after all
# passes (the same examples on both sides). Each cell: the median over ROUNDS runs; ratio =
# fleet / torch examples/s (> 1: fleet faster), by wall time and by the process's CPU time (all
# threads; on a loaded machine the wall rate measures the neighbours as much as the program).
# Usage: bench/ctr_train.sh [BUILD_DIR]   (ROUNDS=3 BATCH=512 STEPS=40 PASSES=4 VOCAB=1000000)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
fleet="$build/bench/ctr_train"
torch_py="$here/ctr_train_torch.py"
rounds=${ROUNDS:-3} batch=${BATCH:-512} steps=${STEPS:-40} passes=${PASSES:-4}
vocab=${VOCAB:-1000000}
[[ -x "$fleet" ]] || { echo "ctr_train.sh: $fleet not built (make build)" >&2; exit 1; }
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null || {
  echo "ctr_train.sh: PyTorch and numpy not importable by /usr/bin/python3 (scripts/install-deps.sh --bench)" >&2; exit 1; }
dump=$(mktemp -d)
trap 'rm -rf "$dump"' EXIT
"$fleet" wide_deep "$batch" "$steps" "$passes" "$vocab" "$dump"
read -r _ _ _ _ rows best <"$dump/meta.txt"

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# field: the line's examples/s (1) or its last AUC (after "auc", PASSES values)
rate_of() { awk '{ print $1 }'; }
auc_of() { awk -v p="$passes" '{ for (i = 1; i <= NF; i++) if ($i == "auc") print $(i + p) }'; }
cpu_of() { awk '{ for (i = 1; i <= NF; i++) if ($i == "cpu") print $(i + 1) }'; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $rows distinct ids; teacher's best AUC $best"
printf '%7s %12s %12s %7s %14s %14s %7s %10s %10s\n' threads "fleet ex/s" "torch ex/s" ratio \
  "fleet ex/cpu-s" "torch ex/cpu-s" ratio "fleet AUC" "torch AUC"
for threads in 1 2; do
  # passive waits: on a machine shared with other jobs a spinning thread waits for one that is
  # not running (tests/CMakeLists.txt says why); it changes no result, only the waiting
  export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads OMP_WAIT_POLICY=passive
  fr=() tr=() fa=() ta=() fc=() tc=()
  for ((r = 0; r < rounds; r++)); do
    f=$("$fleet" wide_deep "$batch" "$steps" "$passes" "$vocab")
    t=$(/usr/bin/python3 "$torch_py" "$dump" "$batch" "$steps" "$passes" "$threads")
    echo "  round $r: fleet $f" >&2
    echo "  round $r: torch $t" >&2
    fr+=("$(rate_of <<<"$f")") tr+=("$(rate_of <<<"$t")")
    fa+=("$(auc_of <<<"$f")") ta+=("$(auc_of <<<"$t")")
    fc+=("$(cpu_of <<<"$f")") tc+=("$(cpu_of <<<"$t")")
  done
  fm=$(printf '%s\n' "${fr[@]}" | median)
  tm=$(printf '%s\n' "${tr[@]}" | median)
  fcm=$(printf '%s\n' "${fc[@]}" | median)
  tcm=$(printf '%s\n' "${tc[@]}" | median)
  printf '%7s %12.0f %12.0f %7.2f %14.0f %14.0f %7.2f %10.4f %10.4f\n' "$threads" "$fm" "$tm" \
    "$(awk -v a="$fm" -v b="$tm" 'BEGIN { print a / b }')" "$fcm" "$tcm" \
    "$(awk -v a="$fcm" -v b="$tcm" 'BEGIN { print a / b }')" \
    "$(printf '%s\n' "${fa[@]}" | median)" "$(printf '%s\n' "${ta[@]}" | median)"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
