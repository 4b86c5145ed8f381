#!/usr/bin/env bash
# test_elastic_resume.sh - fleet-train resuming a checkpoint with another number of workers
# than wrote it (what fleetrun --nnodes MIN:MAX does after losing a node; docs/elastic.md):
# the old workers' state combined as documented (parameters and optimizer state averaged, DGC's
# residuals summed so that the update still owed is kept whole; checked from the files by
# tests/python/check_rescale.py), the learning rate scaled by the linear rule, the data
# position carried over, a rescaled run's own checkpoints resuming exactly, a larger world's
# leftover rank files removed by a save, and damaged sets of rank files refused by name.
# Under FLEET_TEST_NUMERIC_ONLY=1 (numeric_only_lib.sh) only the 4-worker DGC run and the 3-worker
# run resumed from it with their final accuracies: the combined state (fleet's own arithmetic,
# no library kernel), the 3-worker run resumed again, the stale and damaged rank files are left
# to the native pass.
set -u
bin="${FLEET_BIN:?}/fleet-train"
run="${FLEET_BIN:?}/fleetrun"
ckpt="${FLEET_BIN:?}/fleet-ckpt"
src="${FLEET_SRC:?}"
py=/usr/bin/python3
[ -x "$bin" ] && [ -x "$run" ] && [ -x "$ckpt" ] || { echo "SKIPPED: tools not built"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD FLEET_RESTART_COUNT
export OMP_NUM_THREADS=1 FLEET_COMM_TIMEOUT=60
fail=0
. "$src/tests/cli/dist_train_lib.sh" # check
. "$src/tests/cli/numeric_only_lib.sh"
job() { # job NPROC NAME ARGS...: fleet-train under fleetrun, output to NAME.out
  local n=$1 name=$2; shift 2
  timeout 120 "$run" --nproc_per_node "$n" --log_dir "log_$name" "$bin" \
    -c "$src/configs/quickstart.yaml" -o train.epochs=2 -o train.log_interval=4 "$@" \
    >"$name.out" 2>&1
}
final_eval() { grep "^worker_index: 0, epoch 1, step [0-9]*, eval" "$1"; }
dgc=(-o strategy.dgc=true -o strategy.dgc_configs.rampup_begin_step=2)
lsgd=(-o strategy.localsgd=true -o strategy.localsgd_configs.k_steps=4)

# 4 workers write checkpoints every 6 steps (16 steps an epoch)
job 4 dgc4 "${dgc[@]}" -o checkpoint.dir=dgc4 -o checkpoint.save_interval=6 -o checkpoint.keep=0
check "DGC, 4 workers: ran" test $? -eq 0
if native_section "the combined state"; then
  job 4 lsgd4 "${lsgd[@]}" -o checkpoint.dir=lsgd4 -o checkpoint.save_interval=6 -o checkpoint.keep=0
  check "Local SGD, 4 workers: ran" test $? -eq 0
fi

# 4 -> 3 and 4 -> 5 at step 18 (epoch 1, between Local SGD's averages): the state each new
# worker starts from, saved at once (train.max_steps 18) into a fresh directory
if native_section "the combined state"; then
  for case in "dgc 3" "dgc 5" "lsgd 3"; do
    set -- $case
    s=$1 n=$2 opts=()
    [ "$s" = dgc ] && opts=("${dgc[@]}") || opts=("${lsgd[@]}")
    job "$n" "${s}_to$n" "${opts[@]}" -o checkpoint.resume="${s}4/step_00000018" \
      -o checkpoint.dir="${s}_to$n" -o train.max_steps=18
    check "$s 4 -> $n: ran" test $? -eq 0
    check "$s 4 -> $n: says what it did" grep -q "written by 4 worker(s), this job has $n: .*learning rate x $(awk -v n=$n 'BEGIN{print n/4}')" "${s}_to$n.out"
    check "$s 4 -> $n: state combined as documented" \
      "$py" "$src/tests/python/check_rescale.py" "${s}4/step_00000018" "${s}_to$n/step_00000018"
  done
  check "4 -> 3: data from the global batch holding the first sample not trained on (2 of 16 -> 2 * 4 / 3 = 2 of 21)" \
    grep -q "data from batch 2 of 21 in epoch 1 (was 2 of the old world's)" dgc_to3.out
fi

# a rescaled run's own checkpoints resume exactly: 4 -> 3 at step 6, run to the end saving
# every 4 steps; again from its step 16 (3 workers, the run began with 4): the same end
job 3 whole "${dgc[@]}" -o checkpoint.resume=dgc4/step_00000006 -o checkpoint.dir=whole \
  -o checkpoint.save_interval=4 -o checkpoint.keep=0
check "4 -> 3 to the end: ran" test $? -eq 0
final_eval whole.out >whole.eval
if native_section "the 3-worker world resumed"; then
  job 3 again "${dgc[@]}" -o checkpoint.resume=whole/step_00000016 -o checkpoint.dir=again \
    -o checkpoint.save_interval=4
  check "resumed in the 3-worker world: ran" test $? -eq 0
  check "resumed in the 3-worker world: no second rescale" bash -c "! grep -q 'this job has 3' again.out"
  final_eval again.out >again.eval
  check "resumed in the 3-worker world: the same final evaluation" cmp -s whole.eval again.eval
  check "resumed in the 3-worker world: final checkpoints bit-identical" "$ckpt" diff whole again
fi
a3=$(sed -E 's/.*val_acc1 ([0-9.]+).*/\1/' whole.eval)
a4=$(final_eval dgc4.out | sed -E 's/.*val_acc1 ([0-9.]+).*/\1/')
echo "final val_acc1: 4 -> 3 workers ${a3:-none}, 4 workers ${a4:-none}"
check "4 -> 3 trained on: the final accuracy of the 4-worker run within 2 pt (${a3:-none}, ${a4:-none})" \
  awk -v a="${a3:-0}" -v b="${a4:-0}" 'BEGIN{exit !(a > 0.8 && a - b > -0.02 && b - a > -0.02)}'

# a save of the 3-worker world into a step directory that 4 workers had begun (killed before
# `latest` moved): rank_3 of the old world goes
if native_section "the stale rank files"; then
  cp -r dgc4 stale && echo step_00000012 >stale/latest
  job 3 stale "${dgc[@]}" -o checkpoint.dir=stale -o checkpoint.resume=auto \
    -o checkpoint.save_interval=6 -o train.max_steps=18
  check "stale: ran" test $? -eq 0
  check "stale: step 18 holds 3 rank files" test "$(ls stale/step_00000018 | wc -l)" -eq 3
  check "stale: loads" bash -c "'$ckpt' ls stale >/dev/null"
  job 3 stale2 "${dgc[@]}" -o checkpoint.dir=stale -o checkpoint.resume=auto -o train.max_steps=24
  check "stale: resumes in the 3-worker world" test $? -eq 0
fi

# damaged sets of rank files: one missing, one of another step
if native_section "the damaged rank files"; then
  cp -r dgc4/step_00000012 holes && rm holes/rank_2.safetensors
  job 3 holes -o checkpoint.resume=holes "${dgc[@]}"
  check "a rank file missing: refused" test $? -ne 0
  check "a rank file missing: named" grep -q "holes: written by 4 workers, but rank_2.safetensors is missing" holes.out
  cp -r dgc4/step_00000012 mixed && cp dgc4/step_00000018/rank_2.safetensors mixed/
  job 3 mixed -o checkpoint.resume=mixed "${dgc[@]}"
  check "a rank file of another step: refused" test $? -ne 0
  check "a rank file of another step: named" grep -q "mixed/rank_2.safetensors: tensor '.*' differs from rank 0's" mixed.out
fi

numeric_only_report
[ $fail -eq 0 ] && echo "test_elastic_resume: all checks passed"
exit $fail
