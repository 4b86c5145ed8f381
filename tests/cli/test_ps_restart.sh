#!/usr/bin/env bash
# test_ps_restart.sh - fleetrun --max_restarts with parameter servers: a sync job (2 servers,
# 2 workers, checkpoints every 8 steps, kept 2, checkpoint.resume: auto) whose worker 1 is
# SIGKILLed after its step-16 checkpoint is restarted whole (servers and workers), the servers
# load their shards of the step the workers resume from, and the job ends with the progress
# losses, final evaluation line and final checkpoint (fleet-ckpt diff: bit for bit) of an
# undisturbed run. Two cases a kill can leave, made on purpose: a save the servers completed
# but the workers never published (their `latest` one step behind the servers' pointers: the
# servers load the workers' step, not their newest), and shards with no workers' checkpoint
# at all (resume: auto starts fresh on every process). The servers keep the shards of the
# steps the workers keep (checkpoint.keep). The steps are slowed to 25 ms (FLEET_BENCH_SLOW: a
# sleep, no change in the numbers) so that the kill lands mid-training.
set -u
bin="${FLEET_BIN:?}"
cfg="${FLEET_SRC:?}/configs/mlp_ps.yaml"
tmp=$(mktemp -d)
marker="ps_restart_$$"
. "${FLEET_SRC:?}/tests/cli/marker_lib.sh" # kill_marked
cleanup() {
  kill_marked "$bin/fleet-train"
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
for b in fleet-train fleet-ckpt fleetrun; do
  [ -x "$bin/$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD TRAINING_ROLE FLEET_RESTART_COUNT
export FLEET_COMM_TIMEOUT=20 FLEET_TEST_MARKER=$marker FLEET_BENCH_SLOW=1:25:0
# cosine decay over a fixed 64 steps: a run cut at max_steps keeps the rate of the whole run
args=(-c "$cfg" -o train.epochs=2 -o optimizer.lr.warmup_steps=8 -o optimizer.lr.decay_steps=64
      -o train.log_interval=4 -o checkpoint.save_interval=8 -o checkpoint.keep=2
      -o checkpoint.resume=auto)
job() { # job NAME ARGS...: 2 servers + 2 workers under --max_restarts 2; output in NAME.out
  local name=$1; shift
  timeout 120 "$bin/fleetrun" --server_num 2 --worker_num 2 --max_restarts 2 \
    --log_dir "$tmp/log_$name" "$bin/fleet-train" "${args[@]}" "$@" >"$tmp/$name.out" 2>&1
}
losses() { grep '^worker_index: 0, epoch .*, step .*, loss' "$1" | sed -E 's/.*(step [0-9]+), loss ([0-9.]+),.*/\1 \2/'; }
final_eval() { grep '^worker_index: 0, epoch 1, step 64, eval' "$1" | tail -1; }
same_end() { # same_end NAME: NAME ended as the undisturbed run did
  local n=$1
  check "$n: the final evaluation line is the undisturbed run's" \
    test "$(final_eval "$tmp/$n.out")" = "$(final_eval "$tmp/ref.out")" -a -n "$(final_eval "$tmp/ref.out")"
  check "$n: the losses of steps 28..64 are the undisturbed run's" \
    test "$(losses "$tmp/$n.out" | awk '$2 >= 28' | tail -10)" = "$(losses "$tmp/ref.out" | awk '$2 >= 28')"
  check "$n: the final checkpoint is the undisturbed run's, bit for bit" ckpt_same "$tmp/ref" "$tmp/$n"
}
ckpt_same() { "$bin/fleet-ckpt" diff "$1" "$2" >/dev/null; }
shards() { (cd "$1" && ls ps.server*.safetensors 2>/dev/null | tr '\n' ' '); }

# the undisturbed run
job ref -o checkpoint.dir="$tmp/ref"
check "undisturbed: exit 0" test $? -eq 0
check "undisturbed: no restart" bash -c "! grep -q 'restart 1 of' '$tmp/ref.out'"
check "undisturbed: servers start fresh under resume: auto" \
  grep -q "server 0: resume: auto: the workers have no checkpoint in $tmp/ref yet; starting fresh" "$tmp/log_ref/serverlog.0"
echo "shards kept: $(shards "$tmp/ref")"
check "undisturbed: the servers keep the shards of the 2 steps the workers keep" \
  test "$(shards "$tmp/ref")" = "ps.server0.56.safetensors ps.server0.64.safetensors ps.server1.56.safetensors ps.server1.64.safetensors "
check "undisturbed: the workers keep steps 56 and 64" \
  test "$(cd "$tmp/ref" && ls -d step_* | tr '\n' ' ')" = "step_00000056 step_00000064 "

# 1. worker 1 SIGKILLed at step 20 (its step-16 checkpoint complete)
job kill -o checkpoint.dir="$tmp/kill" &
fr=$!
p="" killed=0
for _ in $(seq 1 3000); do # up to 60 s
  [ -n "$p" ] || p=$(for q in $(pgrep -f "$bin/fleet-train" || true); do
      e=$(tr '\0' '\n' <"/proc/$q/environ" 2>/dev/null) || continue
      grep -qx "FLEET_TEST_MARKER=$marker" <<<"$e" && grep -qx "TRAINING_ROLE=TRAINER" <<<"$e" &&
        grep -qx "PADDLE_TRAINER_ID=1" <<<"$e" && grep -qx "FLEET_RESTART_COUNT=0" <<<"$e" && echo "$q"
    done | head -1)
  if [ -n "$p" ] && grep -q "^worker_index: 1, epoch 0, step 20," "$tmp/log_kill/workerlog.1" 2>/dev/null; then
    kill -9 "$p" && killed=1
    break
  fi
  kill -0 "$fr" 2>/dev/null || break
  sleep 0.02
done
wait "$fr"
rc=$?
check "kill: worker 1 killed at step 20" test $killed = 1
check "kill: exit 0 (got $rc)" test $rc -eq 0
check "kill: worker 1 named, killed by SIGKILL" grep -q "worker 1 .*SIGKILL\|worker 1 .*signal 9" "$tmp/kill.out"
check "kill: restarted once, servers and workers" \
  grep -q "restart 1 of 2: starting 2 server(s) and 2 worker(s) again" "$tmp/kill.out"
check "kill: no second restart" bash -c "! grep -q 'restart 2 of 2' '$tmp/kill.out'"
from=$(sed -nE 's/.*resumed from [^:]*: step ([0-9]+),.*/\1/p' "$tmp/kill.out" | head -1)
echo "kill: the workers resumed from step ${from:-none}"
check "kill: the workers resumed from step 16 or later" test "${from:-0}" -ge 16
check "kill: each server loaded the workers' step" \
  grep -q "ps server 1: resumed step ${from:-none} from" "$tmp/log_kill/serverlog.1"
same_end kill

# 2. a save the workers never published: servers at step 24, the workers' latest at 16
job cut1 -o checkpoint.dir="$tmp/cut" -o train.max_steps=24
check "cut short: part 1 exit 0" test $? -eq 0
echo step_00000016 >"$tmp/cut/latest"
rm -r "$tmp/cut/step_00000024"
job cut -o checkpoint.dir="$tmp/cut"
check "cut short: part 2 exit 0" test $? -eq 0
check "cut short: server 0 loads step 16, not its pointer's 24" \
  grep -q "ps server 0: the workers resume from step 16, ps.server0.latest is at step 24: loading" "$tmp/log_cut/serverlog.0"
same_end cut

# 3. shards but no workers' checkpoint: every process starts fresh
job fresh1 -o checkpoint.dir="$tmp/fresh" -o train.max_steps=8
check "shards only: part 1 exit 0" test $? -eq 0
rm -r "$tmp/fresh/latest" "$tmp/fresh"/step_*
job fresh -o checkpoint.dir="$tmp/fresh"
check "shards only: part 2 exit 0" test $? -eq 0
check "shards only: server 1 starts fresh" \
  grep -q "server 1: resume: auto: the workers have no checkpoint in $tmp/fresh yet; starting fresh" "$tmp/log_fresh/serverlog.1"
same_end fresh

exit $fail
