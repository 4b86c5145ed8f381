# shellcheck shell=bash disable=SC2154
# ps_lib.sh - sourced by bench/ps_netlab.sh and bench/ctr_netlab.sh, after dense_lib.sh: starting
# a parameter-server job on bench/netlab (one process per emulated host: workers on hosts
# 0..W-1, servers on the next S; or, with LOOPBACK=1, one fleetrun on 127.0.0.1), and reading
# what worker 0 sent per step from its progress lines.
#
# Callers set workers, servers and hosts (= workers + servers) before calling ps_job.

# endpoints FIRST N PORT -> "ip:port,..." of hosts FIRST..FIRST+N-1 (loopback: ports PORT..)
endpoints() {
  local first=$1 n=$2 port=$3 i eps=""
  for ((i = 0; i < n; i++)); do
    if ((loopback)); then eps+=${eps:+,}127.0.0.1:$((port + first + i))
    else eps+=${eps:+,}$("$netlab" addr $((first + i))):$port; fi
  done
  echo "$eps"
}

# ps_job PORT OUT ARGS...: the servers and workers, one per host; worker 0's output in OUT, host
# I's in OUT.hI
ps_job() {
  local port=$1 out=$2 i pids=() rc=0 token sl wl
  shift 2
  token=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  if ((loopback)); then
    FLEET_JOB_TOKEN=$token timeout 900 "$fleetrun" --server_num "$servers" \
      --worker_num "$workers" --log_dir "$out.log" "$fleet_train" "$@" >"$out" 2>&1 || rc=$?
  else
    sl=$(endpoints "$workers" "$servers" "$port")
    wl=$(endpoints 0 "$workers" "$port")
    for ((i = 0; i < hosts; i++)); do
      FLEET_JOB_TOKEN=$token timeout 900 "$netlab" exec "$i" "$fleetrun" --servers "$sl" \
        --workers "$wl" --node_ip "$("$netlab" addr "$i")" --log_dir "$out.log/h$i" \
        "$fleet_train" "$@" >"$([[ $i == 0 ]] && echo "$out" || echo "$out.h$i")" 2>&1 &
      pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  fi
  if ((rc != 0)); then
    echo "$(basename "$0"): PS job failed (exit $rc); worker 0 said:" >&2
    tail -20 "$out" >&2
    return 1
  fi
}

# comm_mb OUT: median MB sent per step by worker 0 (each progress window: its comm over its steps)
comm_mb() {
  awk '/^worker_index: 0, .* ips / {
      for (i = 1; i <= NF; i++) { if ($i == "step") st = $(i + 1) + 0; if ($i == "comm") mb = $(i + 1) }
      if (st > prev) print mb / (st - prev); prev = st }' "$1" | median
}
