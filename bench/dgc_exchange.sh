#!/usr/bin/env bash
# dgc_exchange.sh - DGC's exchange on emulated hosts (issue 18): the bytes each worker receives
# and the time of one exchange, allgather against the sparse allreduce (bench/dgc_exchange.c),
# for N = 2, 4, 8 hosts of bench/netlab on links of RATE, one worker per host; plus a dense
# allreduce and an 8-byte allgather (one message per round) for the cost model
# (bench/dgc_cost.py fits alpha on the latter and predicts the rest). Two tensor sizes:
# ResNet-50's 25.6M values at sparsity 0.999 (k = 25 600 pairs per worker) and a tenth of it
# (2.56M values, k = 2 560, with the dense allreduce). Half of each worker's indices are common
# to all (top-k sets of real gradients overlap), half its own. Every host's fleetrun runs in its
# own namespace (`netlab exec`); nothing runs from the root namespace against the lab. Each
# cell is the median of ROUNDS rounds (each itself a median of ITERS exchanges). The sparse
# allreduce also runs with one worker (no lab): its local work, the model's gamma.
#
# Usage: bench/dgc_exchange.sh [BUILD_DIR]
#   HOSTS="2 4 8"  RATE=1gbit  ROUNDS=3  ITERS=10  RAW=FILE (every round's rows, for dgc_cost.py)
#   NETLAB_BURST=16384 (the links' token bucket, bench/netlab.md)
#   BUDGET=7 (the sums the sparse allreduce keeps, in k: DGC's dgc_configs.sparse_budget)
# Prints: op hosts k numel time_ms recv_bytes dropped (medians), then the table of the issue.
set -euo pipefail
trap 'echo "$(basename "$0"): failed at line $LINENO: $BASH_COMMAND" >&2' ERR
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
hosts_list=${HOSTS:-2 4 8}
rate=${RATE:-1gbit}
rounds=${ROUNDS:-3} iters=${ITERS:-10} budget=${BUDGET:-7}
netlab=$here/netlab
fleetrun=$build/tools/fleetrun
prog=$build/bench/dgc_exchange
for f in "$fleetrun" "$prog"; do
  [[ -x $f ]] || { echo "dgc_exchange.sh: $f not built (make build)" >&2; exit 1; }
done
"$netlab" check >/dev/null || { echo "dgc_exchange.sh: netlab cannot run here (netlab check)" >&2; exit 77; }
maxhosts=0
for h in $hosts_list; do ((h > maxhosts)) && maxhosts=$h; done
work=$(mktemp -d /tmp/dgc_exchange.XXXXXX)
cleanup() { "$netlab" down >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# a small token bucket: with netlab's default (128 KiB) a message of tens of KB on an idle link
# passes at memory speed, which no alpha-beta model (and no real link) does
NETLAB_BURST=${NETLAB_BURST:-16384} "$netlab" up "$maxhosts" "$rate" >&2

# run_job NHOSTS PORT ARGS...: one fleetrun per host; rank 0's rows on stdout
run_job() {
  local n=$1 port=$2 i ips="" pids=() rc=0 token
  shift 2
  for ((i = 0; i < n; i++)); do ips+=${ips:+,}$("$netlab" addr "$i"); done
  token=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for ((i = 0; i < n; i++)); do
    FLEET_JOB_TOKEN=$token FLEET_COMM_TIMEOUT=120 timeout 600 "$netlab" exec "$i" "$fleetrun" \
      --ips "$ips" --nproc_per_node 1 --started_port "$port" --log_dir "$work/log.$port/h$i" \
      "$prog" "$@" >"$work/out.$port.$i" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  if ((rc != 0)); then
    echo "dgc_exchange.sh: $n-host job failed (exit $rc); host 0 said:" >&2
    tail -20 "$work/out.$port.0" >&2
    return 1
  fi
  grep -E '^(latency|allgather|sparse|dense) ' "$work/out.$port.0"
}

echo "# dgc_exchange: links $rate, hosts [$hosts_list], budget $budget k," \
  "$rounds rounds of $iters exchanges, $(date -u +%Y-%m-%dT%H:%MZ)"
raw=$work/raw
: >"$raw"
port=6300
for ((r = 0; r < rounds; r++)); do
  # one worker alone (no lab, nothing sent): the sparse allreduce's own work, gamma of the model
  for n in 25600000 2560000; do
    "$prog" --numel "$n" --density 0.001 --budget "$budget" --iters "$iters" --ops sparse |
      sed "s/\$/ $r/" >>"$raw"
  done
  for h in $hosts_list; do
    run_job "$h" "$port" --numel 25600000 --density 0.001 --budget "$budget" --iters "$iters" \
      --ops latency,allgather,sparse | sed "s/\$/ $r/" >>"$raw"
    port=$((port + 10))
    run_job "$h" "$port" --numel 2560000 --density 0.001 --budget "$budget" --iters "$iters" \
      --ops allgather,sparse,dense | sed "s/\$/ $r/" >>"$raw"
    port=$((port + 10))
  done
  echo "# round $((r + 1))/$rounds done" >&2
done
[[ -z ${RAW:-} ]] || { echo "# op hosts k numel time_ms recv_bytes dropped round"; cat "$raw"; } >"$RAW"

echo "# op hosts k numel time_ms recv_bytes dropped   (medians over rounds)"
awk '{ key = $1 " " $2 " " $3 " " $4; t[key] = t[key] " " $5; b[key] = b[key] " " $6; d[key] = d[key] " " $7 }
  function med(s,   a, n, i, j, x) { n = split(s, a, " ")
    for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > x + 0; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return a[int((n + 1) / 2)] }
  END { for (k in t) printf "%s %.3f %.0f %.3f\n", k, med(t[k]), med(b[k]), med(d[k]) }' "$raw" |
  sort -k3,3n -k1,1 -k2,2n | tee "$work/med"

echo
echo "| k pairs | hosts | allgather: KB received | time ms | sparse allreduce: KB received | time ms | pairs dropped | bytes sparse / allgather |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
awk '{ v[$1 " " $2 " " $3] = $5 " " $6 " " $7; ks[$3] = 1; hs[$2] = 1 }
  END { for (k in ks) for (h in hs) { a = v["allgather " h " " k]; s = v["sparse " h " " k]
          if (a == "" || s == "") continue; split(a, A, " "); split(s, S, " ")
          printf "| %d | %d | %.1f | %.2f | %.1f | %.2f | %.1f%% | %.2f |\n", k, h, A[2] / 1e3, A[1], S[2] / 1e3, S[1], 100 * S[3], S[2] / A[2] } }' \
  "$work/med" | sort -t'|' -k2,2n -k3,3n
