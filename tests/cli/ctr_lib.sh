# ctr_lib.sh - what the CTR trainer's CLI tests share (sourced by test_ctr_train.sh and
# test_ctr_lifecycle.sh): worker 0's losses, and the three ways to start a job over the
# caller's $bin, $run, $cfg, ${small[@]} and $tmp, each writing $tmp/NAME.out.
losses() { # the step losses of worker 0's progress lines
  grep '^worker_index: 0, epoch .*, step .*, loss' "$1" | sed -E 's/.*, loss ([0-9.]+),.*/\1/'
}
one() { # one NAME ARGS...: a single process
  local name=$1; shift
  timeout 120 "$bin" -c "$cfg" "${small[@]}" "$@" >"$tmp/$name.out" 2>&1
}
coll() { # coll NAME ARGS...: 2 collective workers
  local name=$1; shift
  timeout 120 "$run" --nproc_per_node 2 --log_dir "$tmp/log_$name" "$bin" -c "$cfg" \
    "${small[@]}" "$@" >"$tmp/$name.out" 2>&1 </dev/null
}
ps_job() { # ps_job NAME ARGS...: 2 servers, 2 workers
  local name=$1; shift
  timeout 120 "$run" --server_num 2 --worker_num 2 --log_dir "$tmp/log_$name" "$bin" -c "$cfg" \
    "${small[@]}" "$@" >"$tmp/$name.out" 2>&1 </dev/null
}
