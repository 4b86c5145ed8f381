#!/usr/bin/env bash
# test_netlab_multinode.sh - a real two-node job: netlab makes two emulated hosts on 1 Gbit/s
# links, one fleetrun per host (2 workers each) runs the collective self-test as one job of 4
# ranks over the emulated network. Skipped (77) where netlab cannot run (not root, no netns).
set -u
src="${FLEET_SRC:?}"
run="${FLEET_BIN:?}/fleetrun"
netlab="$src/bench/netlab"
check_prog="${FLEET_BUILD:-${FLEET_BIN}/..}/tests/comm/comm_check"
"$netlab" check || exit 77
tmp=$(mktemp -d)
trap '"$netlab" down; rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}

if [ -x "$check_prog" ]; then
  prog=("$check_prog" --quick)
else
  # until the communicator's self-test exists: a ring of plain TCP connections between the
  # ranks' endpoints, with the token as the greeting
  py=$(command -v /usr/bin/python3 python3 | head -1)
  [ -n "$py" ] || { echo "no comm_check and no python3: skipped"; exit 77; }
  cat >"$tmp/ring.py" <<'EOF'
import os, socket, sys, time
rank, n = int(os.environ["PADDLE_TRAINER_ID"]), int(os.environ["PADDLE_TRAINERS_NUM"])
eps = os.environ["PADDLE_TRAINER_ENDPOINTS"].split(",")
token = os.environ["FLEET_JOB_TOKEN"].encode()
assert eps[rank] == os.environ["PADDLE_CURRENT_ENDPOINT"]
host, port = eps[rank].rsplit(":", 1)
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((host, int(port))); srv.listen(4); srv.settimeout(30)
rhost, rport = eps[(rank + 1) % n].rsplit(":", 1)
for _ in range(300):
    try:
        out = socket.create_connection((rhost, int(rport)), timeout=5); break
    except OSError:
        time.sleep(0.1)
out.sendall(token + b" %d\n" % rank)
c, _ = srv.accept(); c.settimeout(30)
got = c.makefile("rb").readline().split()
ok = got == [token, b"%d" % ((rank - 1) % n)]
print("rank %d of %d at %s: heard %s from the left: %s" % (rank, n, eps[rank], got[-1:], "ok" if ok else "WRONG"))
sys.exit(0 if ok else 1)
EOF
  prog=("$py" "$tmp/ring.py")
  echo "note: $check_prog not built; checking the 4-rank job with a TCP ring instead"
fi

"$netlab" up 2 1gbit || { echo "FAIL: netlab up"; exit 1; }
export FLEET_JOB_TOKEN
FLEET_JOB_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
pids=()
for h in 0 1; do
  "$netlab" exec $h timeout 180 "$run" --ips 10.77.0.1,10.77.0.2 --nproc_per_node 2 \
    --started_port 6170 --grace 2 --log_dir "$tmp/log$h" "${prog[@]}" >"$tmp/out$h" 2>&1 &
  pids+=($!)
done
for h in 0 1; do
  wait "${pids[$h]}"
  rc=$?
  check "node $h: fleetrun exits 0 (got $rc)" test $rc -eq 0
done
check "node 0 found itself (rank 0 on 10.77.0.1)" grep -q 'node 0 of 2 (10.77.0.1)' "$tmp/out0"
check "node 1 found itself (ranks 2..3 on 10.77.0.2)" grep -q 'node 1 of 2 (10.77.0.2), 2 worker(s), ranks 2..3 of 4' "$tmp/out1"
for h in 0 1; do
  for i in 0 1; do
    check "node $h: workerlog.$i made" test -f "$tmp/log$h/workerlog.$i"
  done
done
if [ $fail -ne 0 ]; then
  for h in 0 1; do
    echo "=== fleetrun on node $h"; cat "$tmp/out$h"
    for i in 0 1; do echo "=== node $h workerlog.$i"; tail -20 "$tmp/log$h/workerlog.$i"; done
  done
else
  grep -h . "$tmp/log0/workerlog.0" | tail -3
fi
exit $fail
