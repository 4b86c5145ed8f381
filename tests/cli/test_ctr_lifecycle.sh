#!/usr/bin/env bash
# test_ctr_lifecycle.sh - the sparse tables' life cycle in fleet-train's CTR trainer
# (sparse_table.* keys, docs/ctr.md "Table life cycle"): wide&deep on ctr_synth with a
# vocabulary of 5000 (many rare ids), entry count 3, show/click decay 0.5 and delete threshold
# 0.3 (a row shown once without a click scores 0.1 * 0.5 after a pass and goes).
#  1. one process: entry count keeps unadmitted ids out of the tables (fewer rows in the first
#     progress line than the same run with entry none); the end of each epoch runs a pass that removes rows, said on a log line and in
#     metrics.jsonl ("table_pass"), and the progress line's rows drop after it;
#  2. 2 collective workers (replicas) and a sync PS job (2 servers) print the same losses
#     (2e-4) and remove the same rows at each pass (the counts are sums of whole numbers: the
#     same in both); the PS job's worker 0 prints the servers' rows and bytes;
#  3. save at step 48, resume to 96 across the pass at the end of epoch 0 (step 64): the
#     resumed losses at 64, 80, 96 and the pass's removals equal the straight run's, exactly,
#     collective (counters, candidates and passes in the checkpoint) and sync PS (the servers'
#     shards);
#  4. refusals: the life cycle in geo mode, a decay of 0: exit 2 naming the key.
set -u
bin="${FLEET_BIN:?}/fleet-train"
run="${FLEET_BIN:?}/fleetrun"
cfg="${FLEET_SRC:?}/configs/ctr_wide_deep.yaml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
for b in "$run" "$bin"; do
  [ -x "$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD TRAINING_ROLE
export FLEET_COMM_TIMEOUT=30
. "$(dirname "$0")/ctr_lib.sh"
small=(-o data.vocab=5000 -o model.hidden=[32,32] -o model.embed_dim=4 -o data.val_size=2048
       -o train.log_interval=16 -o sparse_optimizer.lr=1.0 -o train.threads=1
       -o data.train_size=8192 -o train.epochs=2)
life=(-o sparse_table.entry=count -o sparse_table.entry_count=3
      -o sparse_table.show_click_decay_rate=0.5 -o sparse_table.delete_threshold=0.3)

losses_at() { # losses_at FILE STEP...: worker 0's loss at those steps
  local f=$1; shift
  for s in "$@"; do
    grep "^worker_index: 0, epoch [0-9]*, step $s, loss" "$f" | sed -E 's/.*, loss ([0-9.]+),.*/\1/'
  done
}
rows_at() { # worker 0's table rows at step S
  grep "^worker_index: 0, epoch [0-9]*, step $2, loss" "$1" | sed -nE 's/.*, rows ([0-9]+),.*/\1/p'
}
removed() { # the passes' removals: "EMB WIDE" a line
  sed -nE "s/.*sparse tables: pass at the end of epoch ([0-9]+) .*: ([0-9]+) rows of 'embedding' and ([0-9]+) of 'wide' removed.*/\1 \2 \3/p" "$1"
}
close_lists() { # close_lists A B TOL: as many losses, each within TOL
  paste <(losses "$1") <(losses "$2") |
    awk -v t="$3" 'NF != 2 { bad = 1 } { d = $1 - $2; if (d < 0) d = -d; if (d > t) bad = 1; n++ }
                   END { exit (bad || n == 0) }'
}
less() { awk -v a="${1:-x}" -v b="${2:-x}" 'BEGIN { exit !(a + 0 < b + 0 && a != "x" && b != "x") }'; }

# 1. one process: entry and passes
one none -o train.batch_size=128
check "entry none: exit 0" test $? -eq 0
one life -o train.batch_size=128 "${life[@]}" -o train.log_dir="$tmp/m_life"
check "life cycle: exit 0" test $? -eq 0
rn=$(rows_at "$tmp/none.out" 16) rl=$(rows_at "$tmp/life.out" 16)
echo "rows at step 16: entry none ${rn:-none}, entry count 3 ${rl:-none}"
check "entry count keeps unadmitted ids out ($rl < $rn)" less "$rl" "$rn"
echo "passes (epoch, embedding, wide): $(removed "$tmp/life.out" | tr '\n' ';')"
check "a pass at the end of each epoch" test "$(removed "$tmp/life.out" | wc -l)" -eq 2
check "passes remove rows" awk '$2 == 0 || $3 == 0 { exit 1 }' <(removed "$tmp/life.out")
check "metrics.jsonl records the passes" \
  test "$(grep -c '"phase":"table_pass".*"removed_embedding":[1-9]' "$tmp/m_life/metrics.jsonl")" -eq 2
r64=$(rows_at "$tmp/life.out" 64)
left=$(sed -nE "s/.*end of epoch 0 .* removed; ([0-9]+) rows.*/\1/p" "$tmp/life.out")
check "rows drop at the pass (${r64:-none} -> ${left:-none})" less "$left" "$r64"

# 2. collective = sync PS, with the same removals
coll coll -o train.batch_size=64 "${life[@]}"
check "collective: exit 0" test $? -eq 0
ps_job sync -o train.batch_size=64 "${life[@]}"
check "sync PS: exit 0" test $? -eq 0
echo "collective: $(losses "$tmp/coll.out" | tr '\n' ' ') passes $(removed "$tmp/coll.out" | tr '\n' ';')"
echo "sync PS:    $(losses "$tmp/sync.out" | tr '\n' ' ') passes $(removed "$tmp/sync.out" | tr '\n' ';')"
check "sync PS = collective losses (2e-4)" close_lists "$tmp/sync.out" "$tmp/coll.out" 0.0002
check "sync PS removes what collective removes" \
  test -n "$(removed "$tmp/coll.out")" -a "$(removed "$tmp/sync.out")" = "$(removed "$tmp/coll.out")"
check "sync PS: worker 0 prints the servers' rows and bytes" \
  grep -qE '^worker_index: 0, epoch 0, step 16, .*, rows [1-9][0-9]*, table [0-9.]+ MB, comm' "$tmp/sync.out"

# 3. save at 48 and resume to 96, across the pass at 64
coll cpart1 -o train.batch_size=64 "${life[@]}" -o train.max_steps=48 -o checkpoint.dir="$tmp/cck"
coll cpart2 -o train.batch_size=64 "${life[@]}" -o train.max_steps=96 -o checkpoint.dir="$tmp/cck" \
  -o checkpoint.resume=auto
check "collective resume: exit 0" test $? -eq 0
check "collective: the checkpoint holds the counters" \
  grep -qa 'sparse.embedding.counts' "$tmp/cck/step_00000048/model.safetensors"
echo "collective straight: $(losses_at "$tmp/coll.out" 64 80 96 | tr '\n' ' ') resumed: $(losses_at "$tmp/cpart2.out" 64 80 96 | tr '\n' ' ')"
check "collective: resumed losses = the straight run's (exactly)" \
  test -n "$(losses_at "$tmp/cpart2.out" 64 80 96)" -a \
  "$(losses_at "$tmp/cpart2.out" 64 80 96)" = "$(losses_at "$tmp/coll.out" 64 80 96)"
check "collective: the resumed pass removes what the straight one did" \
  test -n "$(removed "$tmp/cpart2.out")" -a "$(removed "$tmp/cpart2.out")" = "$(removed "$tmp/coll.out" | head -1)"
ps_job part1 -o train.batch_size=64 "${life[@]}" -o train.max_steps=48 -o checkpoint.dir="$tmp/ck"
ps_job part2 -o train.batch_size=64 "${life[@]}" -o train.max_steps=96 -o checkpoint.dir="$tmp/ck" \
  -o checkpoint.resume=auto
check "sync PS resume: exit 0" test $? -eq 0
echo "sync PS straight: $(losses_at "$tmp/sync.out" 64 80 96 | tr '\n' ' ') resumed: $(losses_at "$tmp/part2.out" 64 80 96 | tr '\n' ' ')"
check "sync PS: resumed losses = the straight run's (exactly)" \
  test -n "$(losses_at "$tmp/part2.out" 64 80 96)" -a \
  "$(losses_at "$tmp/part2.out" 64 80 96)" = "$(losses_at "$tmp/sync.out" 64 80 96)"
check "sync PS: the resumed pass removes what the straight one did" \
  test -n "$(removed "$tmp/part2.out")" -a "$(removed "$tmp/part2.out")" = "$(removed "$tmp/sync.out" | head -1)"

# 4. refusals
ps_job geo -o train.batch_size=64 "${life[@]}" -o strategy.a_sync=true \
  -o strategy.a_sync_configs.k_steps=4
rc=$?
check "geo with a life cycle: refused (rc $rc)" test $rc -ne 0
check "geo with a life cycle: named" grep -q "sparse_table: entry and shrink are not in geo mode" "$tmp/geo.out"
one decay0 -o sparse_table.show_click_decay_rate=0
rc=$?
check "decay 0: exit 2 (rc $rc)" test $rc -eq 2
check "decay 0: named" grep -q "sparse_table.show_click_decay_rate" "$tmp/decay0.out"

exit $fail
