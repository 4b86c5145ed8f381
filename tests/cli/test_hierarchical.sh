#!/usr/bin/env bash
# test_hierarchical.sh - strategy.use_hierarchical_allreduce over fleetrun on loopback, nodes
# emulated with hierarchical_allreduce_inter_nranks (ranks per node) on this one machine:
# - dense: layouts 2x2 and 3x2 (ranks per node x nodes) end with the parameters of the flat
#   allreduce within rounding (30 Momentum steps, rtol 1e-5);
# - hierarchical DGC's math: with 2 nodes of 2 workers at batch b, each node's gradient is the
#   average over its 2b samples and the nodes are DGC's workers, so the run must equal flat DGC
#   with 2 workers at batch 2b (dist_train gives node j's ranks exactly worker j's samples),
#   within rounding, at sparsity 0.999 (exact selection); and it must differ from flat DGC with
#   4 workers at batch b (a different algorithm, not a silent fallback to flat);
# - the same with the dense fallback's steps in the warm-up (sparsity 0.75 with 2 nodes);
# - the ranks talk through shared memory, or unix sockets with FLEET_COMM_SHM=0 (same bits);
# - the log says which exchange runs; a layout that cannot be (4 ranks in nodes of 3) is
#   refused before training, naming the key.
set -u
run="${FLEET_BIN:?}/fleetrun"
prog="${FLEET_BUILD:?}/tests/dist/dist_train"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
train_env=(FLEET_LOG_LEVEL=info FLEET_COMM_TIMEOUT=60)
source "${FLEET_SRC:?}/tests/cli/dist_train_lib.sh"
b=16
mom=(--optimizer momentum --momentum 0.9 --weight-decay 1e-3 --steps 30)
hier() { echo -o strategy.use_hierarchical_allreduce=true \
  -o strategy.hierarchical_allreduce_inter_nranks="$1"; }

# 1. dense: hierarchical == flat within rounding
train flat4 4 "${mom[@]}" --batch $b &&
  train hier2x2 4 "${mom[@]}" --batch $b $(hier 2) &&
  compare "dense, 2 ranks per node x 2 nodes vs flat" 1e-5 hier2x2 flat4
# ranks of one host talk through shared memory, unless FLEET_COMM_SHM=0 (the same bits)
check "4 ranks of this host: shared memory" \
  grep -q "tcp: 4 ranks of this host talk through shared memory" "$tmp/flat4.log"
train_env=(FLEET_LOG_LEVEL=info FLEET_COMM_TIMEOUT=60 FLEET_COMM_SHM=0)
if train flat4_unix 4 "${mom[@]}" --batch $b; then
  check "FLEET_COMM_SHM=0: no shared memory" \
    bash -c "! grep -q 'through shared memory' '$tmp/flat4_unix.log'"
  compare "dense over unix sockets vs over shared memory" 0 flat4_unix flat4
fi
train_env=(FLEET_LOG_LEVEL=info FLEET_COMM_TIMEOUT=60)
train flat6 6 "${mom[@]}" --batch $b &&
  train hier3x2 6 "${mom[@]}" --batch $b $(hier 3) &&
  compare "dense, 3 ranks per node x 2 nodes vs flat" 1e-5 hier3x2 flat6

# 2. hierarchical DGC 2x2 at batch b == flat DGC of 2 workers at batch 2b
dgc=(--dgc -o strategy.dgc_configs.min_compress_numel=1000 -o strategy.dgc_configs.selection=exact)
if train dgc2 2 "${mom[@]}" --batch $((2 * b)) "${dgc[@]}" &&
   train hdgc2x2 4 "${mom[@]}" --batch $b "${dgc[@]}" $(hier 2) &&
   train dgc4 4 "${mom[@]}" --batch $b "${dgc[@]}"; then
  compare "hierarchical DGC 2x2 at batch $b vs flat DGC, 2 workers at batch $((2 * b))" 1e-4 \
    hdgc2x2 dgc2
  check "hierarchical DGC is not flat DGC of 4 workers" \
    bash -c "! '$prog' --compare '$tmp/hdgc2x2.bin' '$tmp/dgc4.bin' --rtol 1e-2 >/dev/null"
  check "the log says the exchange is between nodes" \
    grep -q "pairs per node, hierarchical: 2 nodes of 2 workers" "$tmp/hdgc2x2.log"
fi
# the warm-up's first sparsity falls back to a dense allreduce of v with 2 parties
warm=(-o "strategy.dgc_configs.sparsity=[0.75, 0.999]" -o strategy.dgc_configs.rampup_step=10)
train wdgc2 2 "${mom[@]}" --batch $((2 * b)) "${dgc[@]}" "${warm[@]}" &&
  train whdgc2x2 4 "${mom[@]}" --batch $b "${dgc[@]}" "${warm[@]}" $(hier 2) &&
  compare "hierarchical DGC 2x2 with the dense fallback's warm-up vs flat DGC of 2" 1e-4 \
    whdgc2x2 wdgc2

# 3. a layout that cannot be
env FLEET_COMM_TIMEOUT=20 timeout 60 "$run" --nproc_per_node 4 --log_dir "$tmp/log_bad" \
  "$prog" "${mom[@]}" $(hier 3) >"$tmp/bad.log" 2>&1
rc=$?
check "4 ranks in nodes of 3: refused (exit $rc)" test $rc -ne 0
check "4 ranks in nodes of 3: the key and the reason named" \
  grep -q "strategy.use_hierarchical_allreduce: comm: 4 ranks cannot form nodes of 3" "$tmp/bad.log"

[ $fail -eq 0 ] && echo "all hierarchical checks passed"
exit $fail
