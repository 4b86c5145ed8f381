#!/usr/bin/env bash
# test_dgc_sparse.sh - DGC with its pairs exchanged by the sparse allreduce
# (strategy.dgc_configs.exchange: sparse; docs/dgc.md "Beyond 128 workers"), over fleetrun on
# loopback, against what it must keep:
# - at sparsity 0 with masking off every entry is a pair and the budget (7 k by default)
#   holds the whole union: the step is dense Momentum's, N = 2, 3, 4 (3: not a power of two);
# - with 2 workers the budget holds the union of both top-k sets: nothing is dropped and the
#   parameters follow allgather-DGC's to rounding (pairs summed before, not after, scaling);
# - with 5 and 6 workers at sparsity 0.99 and a budget of 4 k (more than 4 k distinct indices
#   can come together) the global threshold drops pairs, and on every rank
#   every update balances: what left the accumulators, summed over ranks, is what moved the
#   parameters (dist_train --check-dgc, tests/dist/dgc_ledger.h), so a dropped pair went back
#   into the accumulator, not lost;
# - dgc_configs.sparse_budget 5 with 5 workers drops nothing and follows allgather-DGC; 1
#   drops more than 4 and still balances; the default (7) drops nothing with 6 workers;
# - exchange auto picks allgather for this small model (a few hundred pairs: latency-bound) and
#   says which in the log; a wrong value is refused naming the key.
set -u
run="${FLEET_BIN:?}/fleetrun"
prog="${FLEET_BUILD:?}/tests/dist/dist_train"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
train_env=(FLEET_LOG_LEVEL=info FLEET_COMM_TIMEOUT=60)
source "${FLEET_SRC:?}/tests/cli/dist_train_lib.sh"
mom=(--optimizer momentum --momentum 0.9 --weight-decay 1e-3 --batch 16)
dgc=(--dgc -o strategy.dgc_configs.min_compress_numel=1000)
sparse=(-o strategy.dgc_configs.exchange=sparse)
nomask=(-o strategy.dgc_configs.momentum_masking=false)
b4=(-o strategy.dgc_configs.sparse_budget=4) # below the 5 and 6 workers of section 3
# rank_lines NAME: every rank's "dgc pairs P dropped D ledger E" line
rank_lines() { cat "$tmp/log_$1"/workerlog.* | grep -h '^dist_train: rank .* dgc pairs'; }

# 1. sparsity 0: the sparse allreduce of every entry is the dense sum
for n in 2 3 4; do
  train "dense_$n" "$n" "${mom[@]}" || continue
  train "sparse0_$n" "$n" "${mom[@]}" "${dgc[@]}" "${sparse[@]}" "${nomask[@]}" \
    -o "strategy.dgc_configs.sparsity=[0]" -o strategy.dgc_configs.dense_fallback=false \
    --check-dgc || continue
  compare "sparse allreduce at sparsity 0, $n workers, vs dense Momentum" 1e-5 "sparse0_$n" \
    "dense_$n"
  check "$n workers: the log says the sparse allreduce carries the pairs" \
    grep -q 'exchange by sparse allreduce' "$tmp/sparse0_$n.log"
  check "$n workers at sparsity 0: no pair dropped on any rank" \
    bash -c "[ \$(cat '$tmp/log_sparse0_$n'/workerlog.* | grep -c 'dgc pairs [1-9][0-9]* dropped 0 ') = $n ]"
done

# 2. two workers at 0.999: nothing dropped, allgather-DGC's parameters to rounding
if train ag999 2 "${mom[@]}" "${dgc[@]}" -o strategy.dgc_configs.exchange=allgather &&
  train sp999 2 "${mom[@]}" "${dgc[@]}" "${sparse[@]}" --check-dgc; then
  compare "sparsity 0.999, 2 workers: sparse allreduce vs allgather" 1e-4 sp999 ag999
  check "2 workers at 0.999: no pair dropped" \
    bash -c "[ \$(cat '$tmp/log_sp999'/workerlog.* | grep -c 'dropped 0 ') = 2 ]"
  check "2 workers at 0.999: parameters differ from dense's (compression did something)" \
    bash -c "! '$prog' --compare '$tmp/sp999.bin' '$tmp/dense_2.bin' --rtol 1e-3 >/dev/null"
fi

# 3. five and six workers at 0.99: pairs dropped, every update balanced on every rank
for n in 5 6; do
  train "drop_$n" "$n" "${mom[@]}" "${dgc[@]}" "${sparse[@]}" "${b4[@]}" "${nomask[@]}" \
    -o "strategy.dgc_configs.sparsity=[0.99]" --check-dgc || continue
  lines=$(rank_lines "drop_$n")
  echo "$lines"
  check "$n workers at 0.99: every rank reports" test "$(echo "$lines" | wc -l)" = "$n"
  check "$n workers at 0.99: the threshold dropped pairs" \
    awk '{ if ($8 > 0) d++ } END { exit !(d > 0) }' <<<"$lines"
  check "$n workers at 0.99: every update balances (ledger < 1e-4)" \
    awk '{ if (!($10 < 1e-4)) bad++ } END { exit bad > 0 }' <<<"$lines"
  check "$n workers at 0.99: the loss is finite" \
    bash -c "grep '^step 29 ' '$tmp/drop_$n.log' | grep -qvi nan"
done
# with masking on (the default) it trains too, and the masked run differs from the unmasked one
train mask_5 5 "${mom[@]}" "${dgc[@]}" "${sparse[@]}" "${b4[@]}" \
  -o "strategy.dgc_configs.sparsity=[0.99]" &&
  check "5 workers, masking on: differs from masking off" \
    bash -c "! cmp -s '$tmp/mask_5.bin' '$tmp/drop_5.bin'"

# 3b. dgc_configs.sparse_budget: with a budget of 5 k the union of 5 workers' top-k sets always
# fits: nothing dropped, allgather-DGC's parameters to rounding; a budget of 1 k drops more
# pairs than 4 k in the same setting (drop_5), and still balances
bud=(-o "strategy.dgc_configs.sparsity=[0.99]" "${nomask[@]}")
if train ag_5 5 "${mom[@]}" "${dgc[@]}" "${bud[@]}" -o strategy.dgc_configs.exchange=allgather &&
  train bud5_5 5 "${mom[@]}" "${dgc[@]}" "${sparse[@]}" "${bud[@]}" \
    -o strategy.dgc_configs.sparse_budget=5 --check-dgc; then
  compare "5 workers at 0.99, budget 5 k: sparse allreduce vs allgather" 1e-4 bud5_5 ag_5
  check "5 workers, budget 5 k: no pair dropped on any rank" \
    bash -c "[ \$(cat '$tmp/log_bud5_5'/workerlog.* | grep -c 'dgc pairs [1-9][0-9]* dropped 0 ') = 5 ]"
  check "5 workers, budget 5 k: the log names the budget" \
    grep -q 'sparse allreduce keeps up to 5 k' "$tmp/bud5_5.log"
fi
# the default budget (7 k) holds the union of 6 workers' top-k sets where 4 k dropped (drop_6)
train def_6 6 "${mom[@]}" "${dgc[@]}" "${sparse[@]}" "${bud[@]}" --check-dgc &&
  check "6 workers at 0.99, the default budget: no pair dropped on any rank" \
    bash -c "[ \$(cat '$tmp/log_def_6'/workerlog.* | grep -c 'dgc pairs [1-9][0-9]* dropped 0 ') = 6 ]"
if train bud1_5 5 "${mom[@]}" "${dgc[@]}" "${sparse[@]}" "${bud[@]}" \
  -o strategy.dgc_configs.sparse_budget=1 --check-dgc && [ -d "$tmp/log_drop_5" ]; then
  d1=$(rank_lines bud1_5 | awk '{ s += $8 } END { print s }')
  d4=$(rank_lines drop_5 | awk '{ s += $8 } END { print s }')
  echo "pairs dropped by 5 workers: budget 1 k $d1, budget 4 k $d4"
  check "budget 1 k drops more than 4 k ($d1 > $d4)" awk -v a="$d1" -v b="$d4" 'BEGIN { exit !(a > b) }'
  check "budget 1 k: every update balances (ledger < 1e-4)" \
    awk '{ if (!($10 < 1e-4)) bad++ } END { exit bad > 0 }' <<<"$(rank_lines bud1_5)"
fi

# 4. auto on this small model: allgather (latency-bound), said in the log
train auto_4 4 "${mom[@]}" "${dgc[@]}" &&
  check "exchange auto, 4 workers, a few hundred pairs: allgather, said" \
    grep -q 'pairs per worker, 4 workers: exchange by allgather' "$tmp/auto_4.log"

# 5. a wrong value names the key
out=$("$prog" --dgc -o strategy.dgc_configs.exchange=gossip 2>&1)
rc=$?
check "exchange gossip is refused (exit $rc) naming the key" \
  bash -c "[ $rc -ne 0 ] && grep -q 'dgc_configs.exchange' <<<'$out'"
out=$("$prog" --dgc -o strategy.dgc_configs.sparse_budget=0 2>&1)
rc=$?
check "sparse_budget 0 is refused (exit $rc) naming the key and the range" \
  bash -c "[ $rc -ne 0 ] && grep -q 'sparse_budget: 0 is out of range \[1, 64\]' <<<'$out'"
exit $fail
