#!/usr/bin/env bash
# test_ctr_train.sh - fleet-train's CTR trainer (docs/ctr.md "Training"): wide&deep on
# ctr_synth (vocab 100, a 32-32 deep part, embeddings of 4) in both architectures.
#  1. one process learns: the final validation AUC above 0.70 (runs reach about 0.75; the
#     teacher's own AUC is about 0.81, the first progress line's about 0.63) and within 0.10 of
#     the teacher's; metrics.jsonl records auc and the eval line; DeepFM learns too (> 0.68);
#  2. 2 collective workers = 1 worker with the double batch: the sparse replicas merge the two
#     workers' row gradients as one worker's sums would be (exact for 2), the dense allreduce
#     averages in its own order: every printed loss within 2e-4;
#  3. the same model in sync PS mode (2 workers, 2 servers) prints the collective losses to
#     2e-4 (the servers merge the rows as the replicas do; dense sums round alike);
#  4. async and geo (k 4) run, say their mode and learn (final AUC above 0.65);
#  5. a sync PS job saved at step 48 and resumed to 96 prints the undisturbed run's losses at
#     steps 64, 80, 96 exactly (2 workers: the servers' merges repeat to the bit), and a
#     collective one exactly;
#  6. Criteo files written by fleet-ctrgen train through the reader (AUC above 0.65); a
#     malformed line fails naming file:line, and data.bad_lines: skip trains past it;
#  7. cross-key refusals (CTR model on image data, CTR data with the mlp) exit 2 naming the key;
#  8. fleet-eval reports AUC and log loss of a collective checkpoint on a held-out file.
set -u
bin="${FLEET_BIN:?}/fleet-train"
run="${FLEET_BIN:?}/fleetrun"
gen="${FLEET_BIN:?}/fleet-ctrgen"
evl="${FLEET_BIN:?}/fleet-eval"
cfg="${FLEET_SRC:?}/configs/ctr_wide_deep.yaml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
for b in "$run" "$bin" "$gen"; do
  [ -x "$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD TRAINING_ROLE
export FLEET_COMM_TIMEOUT=30
. "$(dirname "$0")/ctr_lib.sh"
small=(-o data.vocab=100 -o model.hidden=[32,32] -o model.embed_dim=4 -o data.val_size=4096
       -o train.log_interval=16 -o sparse_optimizer.lr=1.0 -o train.threads=1)

final_auc() { # worker 0's last eval AUC
  grep '^worker_index: 0, .*eval: auc' "$1" | tail -1 | sed -E 's/.*eval: auc ([0-9.]+),.*/\1/'
}
teacher_auc() {
  grep "teacher's auc" "$1" | tail -1 | sed -E "s/.*teacher's auc ([0-9.]+).*/\1/"
}
close_lists() { # close_lists A B TOL [LAST]: same count (or the last LAST), each within TOL
  local n=${4:-0}
  paste <(if [ "$n" -gt 0 ]; then losses "$1" | tail -"$n"; else losses "$1"; fi) \
        <(if [ "$n" -gt 0 ]; then losses "$2" | tail -"$n"; else losses "$2"; fi) |
    awk -v t="$3" 'NF != 2 { bad = 1 } { d = $1 - $2; if (d < 0) d = -d; if (d > t) bad = 1; n++ }
                   END { exit (bad || n == 0) }'
}
above() { awk -v a="${1:-0}" -v b="$2" 'BEGIN { exit !(a > b) }'; }

# 1. one process learns
one single -o data.train_size=16384 -o train.batch_size=128 -o train.epochs=2 \
  -o train.log_dir="$tmp/m_single" -o checkpoint.dir="$tmp/ck_single"
check "single: exit 0" test $? -eq 0
a=$(final_auc "$tmp/single.out"); best=$(teacher_auc "$tmp/single.out")
first=$(grep -m1 '^worker_index: 0, epoch 0, step 16,' "$tmp/single.out" | sed -E 's/.*, auc ([0-9.]+),.*/\1/')
echo "single: first progress AUC ${first:-none}, final AUC ${a:-none}, teacher's ${best:-none}"
check "single: AUC ${a:-none} > 0.70" above "$a" 0.70
check "single: within 0.10 of the teacher's ${best:-none}" above "$a" "$(awk -v b="${best:-9}" 'BEGIN { print b - 0.10 }')"
check "single: metrics.jsonl has auc and an eval record" \
  grep -q '"phase":"eval".*"auc":0\.[0-9]' "$tmp/m_single/metrics.jsonl"
check "single: the progress line carries the CTR fields" \
  grep -qE '^worker_index: 0, epoch 0, step 16, loss [0-9.]+, auc [0-9.]+, logloss [0-9.]+, pred_ctr [0-9.]+, ctr [0-9.]+, lr [0-9.]+, ips [0-9.]+ ex/s, rows [0-9]+, table [0-9.]+ MB, comm' "$tmp/single.out"
one deepfm -o model.type=deepfm -o data.train_size=16384 -o train.batch_size=128 -o train.epochs=2
check "deepfm: exit 0" test $? -eq 0
a=$(final_auc "$tmp/deepfm.out")
check "deepfm: AUC ${a:-none} > 0.68" above "$a" 0.68

# 2. two collective workers = one worker with the double batch
one double -o data.train_size=8192 -o train.batch_size=128 -o train.epochs=1
coll coll -o data.train_size=8192 -o train.batch_size=64 -o train.epochs=1
check "collective: exit 0" test $? -eq 0
echo "1 x 128 losses:  $(losses "$tmp/double.out" | tr '\n' ' ')"
echo "2 x 64 losses:   $(losses "$tmp/coll.out" | tr '\n' ' ')"
check "2 collective workers = 1 worker of the double batch (2e-4)" \
  close_lists "$tmp/coll.out" "$tmp/double.out" 0.0002

# 3. sync PS = collective
ps_job sync -o data.train_size=8192 -o train.batch_size=64 -o train.epochs=1
check "sync PS: exit 0" test $? -eq 0
echo "sync PS losses:  $(losses "$tmp/sync.out" | tr '\n' ' ')"
check "sync PS = collective (2e-4)" close_lists "$tmp/sync.out" "$tmp/coll.out" 0.0002
check "sync PS: the mode is said" grep -q "CTR training (wide_deep, ps sync)" "$tmp/sync.out"

# 4. async and geo learn
ps_job async -o data.train_size=16384 -o train.batch_size=64 -o train.epochs=1 \
  -o strategy.a_sync=true -o strategy.a_sync_configs.k_steps=-1 -o optimizer.momentum=0.5
check "async: exit 0" test $? -eq 0
ps_job geo -o data.train_size=16384 -o train.batch_size=64 -o train.epochs=1 \
  -o strategy.a_sync=true -o strategy.a_sync_configs.k_steps=4
check "geo: exit 0" test $? -eq 0
for m in async geo; do
  a=$(final_auc "$tmp/$m.out")
  check "$m: AUC ${a:-none} > 0.65" above "$a" 0.65
  check "$m: the mode is said" grep -q "CTR training (wide_deep, ps $m)" "$tmp/$m.out"
done

# 5. save at 48 and resume to 96 = 96 straight (sync PS; collective)
res=(-o data.train_size=8192 -o train.batch_size=64 -o train.epochs=2)
ps_job straight "${res[@]}" -o train.max_steps=96
ps_job part1 "${res[@]}" -o train.max_steps=48 -o checkpoint.dir="$tmp/ck"
check "sync PS part 1: exit 0" test $? -eq 0
ps_job part2 "${res[@]}" -o train.max_steps=96 -o checkpoint.dir="$tmp/ck" -o checkpoint.resume=auto
check "sync PS part 2 (resumed): exit 0" test $? -eq 0
check "sync PS: the resumed run says so" grep -q "resumed from .*step_00000048.* step 48" "$tmp/part2.out"
check "sync PS: servers saved their shards" test -s "$tmp/ck/ps.server0.48.safetensors" -a -s "$tmp/ck/ps.server1.48.safetensors"
echo "straight: $(losses "$tmp/straight.out" | tail -3 | tr '\n' ' ')  resumed: $(losses "$tmp/part2.out" | tr '\n' ' ')"
check "sync PS: resumed losses at 64, 80, 96 = the straight run's (exactly)" \
  test "$(losses "$tmp/part2.out" | tail -3)" = "$(losses "$tmp/straight.out" | tail -3)"
coll cstraight "${res[@]}" -o train.max_steps=96
coll cpart1 "${res[@]}" -o train.max_steps=48 -o checkpoint.dir="$tmp/cck"
coll cpart2 "${res[@]}" -o train.max_steps=96 -o checkpoint.dir="$tmp/cck" -o checkpoint.resume=auto
check "collective resume: exit 0" test $? -eq 0
check "collective: the checkpoint holds the replicas" \
  grep -qa 'sparse.embedding.ids' "$tmp/cck/step_00000048/model.safetensors"
check "collective: resumed losses = the straight run's (exactly)" \
  test "$(losses "$tmp/cpart2.out" | tail -3)" = "$(losses "$tmp/cstraight.out" | tail -3)"

# 6. Criteo files through the reader
"$gen" --samples 16384 --vocab 100 --seed 1 --best-auc 0 --out "$tmp/train.txt" >/dev/null 2>&1
"$gen" --samples 4096 --vocab 100 --seed 1 --split 1 --best-auc 0 --out "$tmp/val.txt" >/dev/null 2>&1
echo train.txt >"$tmp/train.list"
echo val.txt >"$tmp/val.list"
crit=(-o data.type=criteo -o data.train_list="$tmp/train.list" -o data.val_list="$tmp/val.list"
      -o train.batch_size=128 -o train.epochs=2)
one criteo "${crit[@]}"
check "criteo: exit 0" test $? -eq 0
a=$(final_auc "$tmp/criteo.out")
check "criteo: AUC ${a:-none} > 0.65" above "$a" 0.65
cp "$tmp/train.txt" "$tmp/bad.txt"
sed -i '700s/^[01]\t/x\t/' "$tmp/bad.txt"
echo bad.txt >"$tmp/bad.list"
one bad -o data.type=criteo -o data.train_list="$tmp/bad.list" -o train.batch_size=128
check "malformed line: fails" test $? -ne 0
check "malformed line: file:line named" grep -q "bad.txt:700: " "$tmp/bad.out"
one skip -o data.type=criteo -o data.train_list="$tmp/bad.list" -o train.batch_size=128 \
  -o data.bad_lines=skip
check "bad_lines skip: exit 0" test $? -eq 0

# 7. refusals
one refuse1 -o data.type=teacher
rc=$?
check "CTR model on teacher data: exit 2 (rc $rc)" test $rc -eq 2
check "CTR model on teacher data: named" grep -q "model.type: wide_deep is a CTR model" "$tmp/refuse1.out"
one refuse2 -o model.type=mlp
rc=$?
check "mlp on ctr_synth: exit 2 (rc $rc)" test $rc -eq 2
check "mlp on ctr_synth: named" grep -q "data.type: ctr_synth is CTR data" "$tmp/refuse2.out"

# 8. fleet-eval on a held-out Criteo file, from the single run's collective checkpoint
if [ -x "$evl" ]; then
  timeout 60 "$evl" -m "$tmp/ck_single" -o data.type=criteo \
    -o data.val_list="$tmp/val.list" -o data.train_list="$tmp/val.list" >"$tmp/eval.out" 2>&1
  check "fleet-eval: exit 0" test $? -eq 0
  check "fleet-eval: AUC above 0.65" above \
    "$(sed -nE 's/.*auc ([0-9.]+).*/\1/p' "$tmp/eval.out" | tail -1)" 0.65
  check "fleet-eval: log loss reported" grep -qE "logloss [0-9.]+" "$tmp/eval.out"
fi

exit $fail
