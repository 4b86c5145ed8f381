#!/usr/bin/env bash
# test_fleetrun_restart.sh - fleetrun --max_restarts with fleet-train's checkpoint.resume: auto:
# 20 trials SIGKILL a random worker of a 4-worker job at a random step (checkpoints every 4
# steps, kept 2); fleetrun stops the others, starts all 4 again, they resume from the newest
# complete checkpoint, and every job finishes with final parameters, optimizer state and
# evaluation line bit-identical to an undisturbed run's. A bad config is not restarted (exit 2,
# said once); a worker that keeps failing is restarted --max_restarts times, then the job ends
# with its status. The steps are slowed to 25 ms (FLEET_BENCH_SLOW: a sleep, no change in the
# numbers) so that a kill lands in the middle of training; being mostly that sleep, the trials
# run 4 at a time.
set -u
bin="${FLEET_BIN:?}/fleet-train"
run="${FLEET_BIN:?}/fleetrun"
ckpt="${FLEET_BIN:?}/fleet-ckpt"
src="${FLEET_SRC:?}"
[ -x "$bin" ] && [ -x "$run" ] && [ -x "$ckpt" ] || { echo "SKIPPED: tools not built"; exit 77; }
tmp=$(mktemp -d)
marker="fleetrun_restart_$$"
export FLEET_TEST_MARKER=$marker FLEET_BENCH_SLOW=1:25:0
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD FLEET_RESTART_COUNT
pid_of() { # pid_of RANK ROUND MARKER: a trial's fleet-train process of that rank and round
  for p in $(pgrep -f "$bin" || true); do
    env_of=$({ tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null) || continue
    grep -qx "FLEET_TEST_MARKER=$3" <<<"$env_of" || continue
    grep -qx "PADDLE_TRAINER_ID=$1" <<<"$env_of" || continue
    grep -qx "FLEET_RESTART_COUNT=$2" <<<"$env_of" || continue
    echo "$p"
  done
}
cleanup() {
  for p in $(pgrep -f "$bin" || true); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q "^FLEET_TEST_MARKER=$marker\(\.[0-9]*\)\?$" &&
      kill -9 "$p" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}
cd "$tmp" || exit 1
job_args=(-c "$src/configs/quickstart.yaml" -o train.epochs=4 -o train.log_interval=2
          -o checkpoint.save_interval=4 -o checkpoint.keep=2 -o checkpoint.resume=auto)

# the undisturbed run: 4 workers, 64 steps
timeout 300 "$run" --nproc_per_node 4 --max_restarts 3 --log_dir ref/log "$bin" "${job_args[@]}" \
  -o checkpoint.dir=ref/ck >ref.out 2>&1
check "undisturbed: exit 0" test $? -eq 0
check "undisturbed: no restart" bash -c "! grep -q 'restart 1 of' ref.out"
check "undisturbed: fresh start said" grep -q "resume: auto: no checkpoint in ref/ck yet" ref.out
# the last one: a kill that lands after rank 0 printed it (during the final save or exit) makes
# the restarted round, resuming from step 64, print it again
final_eval() { grep "^worker_index: 0, epoch 3, step 64, eval" "$1" | tail -1; }
final_eval ref.out >ref.eval
check "undisturbed: 64 steps" test -s ref.eval

# 20 trials: kill rank R when its log shows step S. The steps are mostly the 25 ms sleep, so
# the trials run 4 at a time (each its own marker, checkpoint and log folders); each writes its
# "ok:"/"FAIL:" lines to t<N>.res, printed in trial order.
RANDOM=$$
trial() { # trial T RANK STEP
  local t=$1 rank=$2 step=$3 d="t$1" fr killed=0 rc p="" from
  ok() { echo "ok: $1"; }
  tcheck() { local what=$1; shift; if "$@"; then ok "$what"; else echo "FAIL: $what"; fi; }
  FLEET_TEST_MARKER="$marker.$t" timeout 300 "$run" --nproc_per_node 4 --max_restarts 3 \
    --log_dir "$d/log" "$bin" "${job_args[@]}" -o checkpoint.dir="$d/ck" >"$d.out" 2>&1 &
  fr=$!
  for _ in $(seq 1 3000); do # up to 60 s
    # the worker's pid found while it starts, so that the kill follows the step's line at once
    [ -n "$p" ] || p=$(pid_of "$rank" 0 "$marker.$t")
    if grep -q "^worker_index: $rank, epoch [0-9]*, step $step," "$d/log/workerlog.$rank" 2>/dev/null; then
      [ -n "$p" ] || p=$(pid_of "$rank" 0 "$marker.$t")
      [ -n "$p" ] && kill -9 "$p" 2>/dev/null && killed=1
      break
    fi
    kill -0 "$fr" 2>/dev/null || break
    sleep 0.02
  done
  wait "$fr"
  rc=$?
  tcheck "trial $t (kill rank $rank at step $step): exit 0 (got $rc)" test $rc -eq 0
  # a SIGKILL that reaches a worker already exiting with status 0 changes nothing: fleetrun
  # reports no failure at all (still bounded below: at least 15 of 20 kills must land)
  if [ $killed = 1 ] && ! grep -q "killed by signal\|SIGKILL\|restart 1 of 3" "$d.out"; then
    killed=0
  fi
  [ $killed = 1 ] || { echo "trial $t: the kill missed (rank $rank had finished)"; return; }
  echo "landed"
  tcheck "trial $t: rank $rank named, killed by SIGKILL" grep -q "worker $rank (rank $rank).*SIGKILL\|rank $rank.*killed by signal 9\|rank $rank.*SIGKILL" "$d.out"
  tcheck "trial $t: restarted once" test "$(grep -c 'restart 1 of 3' "$d.out")" -eq 1
  tcheck "trial $t: no second restart" bash -c "! grep -q 'restart 2 of 3' '$d.out'"
  from=$(sed -nE 's/.*resumed from [^:]*: step ([0-9]+),.*/\1/p' "$d.out" | head -1)
  if [ -n "$from" ]; then
    echo "lost $((step - from))"
    echo "trial $t: killed rank $rank at step $step, resumed from step $from"
  else
    echo "trial $t: killed rank $rank at step $step, restarted from step 0 (no checkpoint yet)"
  fi
  final_eval "$d.out" >"$d.eval"
  tcheck "trial $t: the final evaluation line is the undisturbed run's" cmp -s ref.eval "$d.eval"
  tcheck "trial $t: final parameters and optimizer state bit-identical" \
    "$ckpt" diff ref/ck "$d/ck" >/dev/null
  tcheck "trial $t: latest names a loadable checkpoint" "$ckpt" ls "$d/ck" >/dev/null
}
for t in $(seq 1 20); do
  trial "$t" $((RANDOM % 4)) $((2 * (1 + RANDOM % 30))) >"t$t.res" 2>&1 &
  [ $((t % 4)) -eq 0 ] && wait
done
wait
restarted=0 lost_total=0
for t in $(seq 1 20); do
  grep -v '^landed$\|^lost ' "t$t.res"
  grep -q '^landed$' "t$t.res" && restarted=$((restarted + 1))
  lost=$(sed -n 's/^lost //p' "t$t.res")
  lost_total=$((lost_total + ${lost:-0}))
  grep -q '^FAIL: ' "t$t.res" && fail=1
done
echo "$restarted of 20 kills landed during training; $lost_total steps redone in all"
check "at least 15 of 20 kills landed during training (got $restarted)" test "$restarted" -ge 15

# a bad config is an error in the job: not restarted, said once
"$run" --nproc_per_node 2 --max_restarts 3 --log_dir bad/log "$bin" "${job_args[@]}" \
  -o checkpoint.dir=bad/ck -o model.hiden=[4] >bad.out 2>&1
check "bad config: exit 2" test $? -eq 2
check "bad config: not restarted" grep -q "not restarting: worker [01] (rank [01]) exited with status 2" bad.out
check "bad config: no restart" bash -c "! grep -q 'restart 1 of' bad.out"
# a worker that keeps failing: restarted 2 times, then its status
"$run" --nproc_per_node 2 --max_restarts 2 --log_dir loop/log sh -c 'echo round $FLEET_RESTART_COUNT; exit 3' \
  >loop.out 2>&1
check "keeps failing: exit 3" test $? -eq 3
check "keeps failing: restart 2 of 2" grep -q "restart 2 of 2" loop.out
check "keeps failing: gives up" grep -q "giving up: the job failed again after 2 restart(s)" loop.out
check "keeps failing: 3 rounds in the log" test "$(grep -c '^round [012]$' loop/log/workerlog.1)" -eq 3
# without --max_restarts nothing changes: the failure ends the job
"$run" --nproc_per_node 2 --log_dir once/log sh -c 'exit 3' >once.out 2>&1
check "no --max_restarts: exit 3, no restart" test $? -eq 3
check "no --max_restarts: nothing said about restarts" bash -c "! grep -q 'restart\|giving up' once.out"

[ $fail -eq 0 ] && echo "test_fleetrun_restart: all checks passed"
exit $fail
