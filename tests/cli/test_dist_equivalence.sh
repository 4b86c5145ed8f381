#!/usr/bin/env bash
# test_dist_equivalence.sh - data-parallel training is the big-batch training it stands for:
# N = 2, 3 and 4 workers (fleetrun) with local batch b end 30 steps with the parameters of one
# worker with batch N*b on the same samples (max |a-b| / max |b| <= 1e-5, f32), for SGD and for
# Momentum with weight decay, with gradient fusion (32 MiB: one bucket; 0.02 MiB: several) and
# without (0: one bucket per parameter), overlap on and off; and overlap on and off give
# bit-identical parameters (same buckets, same collectives, same reduction order). The model's
# buckets are small enough for recursive doubling, whose per-element order depends only on the
# rank count: there fusion on and off are bit-identical too. "4r" runs 4 workers on the ring
# (FLEET_TCP_RD_MAX_BYTES=0), where an element's order depends on its segment of the bucket, so
# other bucket sizes agree only to rounding (the 1e-5 check). "3h" and "4h" force Rabenseifner's
# allreduce on every bucket (FLEET_TCP_RH_MIN_RANKS=1, _MIN_BYTES=0; 3 workers fold, 4 halve
# twice), which combines in recursive doubling's order: every rank must end with the bits of the
# recursive-doubling run (fuse 0.02 MiB, overlap on). The bucket
# plan is checked from rank 0's debug log: fc1 (4224 values), fc2 (16512), fc3 (516) make 1
# bucket at 32 MiB, 3 at 0.02 MiB (fc2.weight alone), 6 at 0. The 6 jobs of a case (fusion x
# overlap) run side by side.
set -u
run="${FLEET_BIN:?}/fleetrun"
prog="${FLEET_BUILD:?}/tests/dist/dist_train"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
source "${FLEET_SRC:?}/tests/cli/dist_train_lib.sh"
train_case() { # train_case NAME CASE ARGS...: CASE is the worker count, "4r" 4 on the ring
  local name=$1 case=$2 n=${2%r}
  shift 2
  local train_env=(FLEET_LOG_LEVEL=debug FLEET_COMM_TIMEOUT=60)
  [ "$case" != "$n" ] && train_env+=(FLEET_TCP_RD_MAX_BYTES=0) # the ring, whatever the size
  train "$name" "$n" "$@"
}
b=16


for opt in sgd momentum; do
  args=(--optimizer "$opt")
  [ "$opt" = momentum ] && args+=(--momentum 0.9 --weight-decay 1e-3)
  for case in 2 3 4 4r; do
    n=${case%r}
    ref="ref_${opt}_$n"
    [ -s "$tmp/$ref.bin" ] ||
    "$prog" "${args[@]}" --batch $((n * b)) --out "$tmp/$ref.bin" >"$tmp/$ref.log" 2>&1 ||
      { echo "FAIL: 1 worker, batch $((n * b)) ($opt)"; tail -5 "$tmp/$ref.log"; fail=1; continue; }
    # the 6 jobs of this case side by side (each a few seconds, mostly starting up and
    # meeting), then their checks in order; a job's own FAIL lines are in NAME.train
    for fuse in 32 0.02 0; do
      for overlap in on off; do
        name="${opt}_${case}_${fuse}_$overlap"
        train_case "$name" "$case" "${args[@]}" --batch $b --fuse "$fuse" --overlap "$overlap" \
          >"$tmp/$name.train" 2>&1 &
      done
    done
    wait
    for fuse in 32 0.02 0; do
      for overlap in on off; do
        name="${opt}_${case}_${fuse}_$overlap"
        cat "$tmp/$name.train"
        if grep -q '^FAIL' "$tmp/$name.train"; then
          fail=1
        else
          compare "$opt, $case workers x batch $b, fuse $fuse MiB, overlap $overlap vs 1 x $((n * b))" \
            1e-5 "$name" "$ref"
        fi
        want=$(case $fuse in 32) echo 1;; 0.02) echo 3;; 0) echo 6;; esac)
        grep -q "strategy dense: $want buckets of at most $fuse MiB" "$tmp/$name.log" ||
          { echo "FAIL: $name: not $want buckets"; grep 'strategy dense' "$tmp/$name.log"; fail=1; }
      done
      if cmp -s "$tmp/${opt}_${case}_${fuse}_on.bin" "$tmp/${opt}_${case}_${fuse}_off.bin"; then
        echo "$opt, $case workers, fuse $fuse MiB: overlap on and off bit-identical"
      else
        echo "FAIL: $opt, $case workers, fuse $fuse MiB: overlap on and off differ"; fail=1
      fi
    done
    if [ "$case" = "$n" ]; then
      if cmp -s "$tmp/${opt}_${case}_32_on.bin" "$tmp/${opt}_${case}_0_on.bin" &&
         cmp -s "$tmp/${opt}_${case}_32_on.bin" "$tmp/${opt}_${case}_0.02_on.bin"; then
        echo "$opt, $case workers: fuse 32, 0.02 and 0 MiB bit-identical"
      else
        echo "FAIL: $opt, $case workers: fuse 32, 0.02 and 0 MiB differ"; fail=1
      fi
    fi
  done
done

for opt in sgd momentum; do
  args=(--optimizer "$opt")
  [ "$opt" = momentum ] && args+=(--momentum 0.9 --weight-decay 1e-3)
  for n in 3 4; do
    name="${opt}_${n}h" want="${opt}_${n}_0.02_on"
    train_env=(FLEET_COMM_TIMEOUT=60 FLEET_TCP_RH_MIN_RANKS=1 FLEET_TCP_RH_MIN_BYTES=0)
    train "$name" "$n" "${args[@]}" --batch $b --fuse 0.02 --overlap on --out-every-rank ||
      continue
    same=1
    for ((r = 0; r < n; r++)); do
      cmp -s "$tmp/$name.bin.$r" "$tmp/$want.bin" || same=0
    done
    if [ $same = 1 ]; then
      echo "$opt, $n workers, Rabenseifner's allreduce: every rank bit-identical to recursive doubling"
    else
      echo "FAIL: $opt, $n workers, Rabenseifner's allreduce: differs from recursive doubling"; fail=1
    fi
  done
done
exit $fail
