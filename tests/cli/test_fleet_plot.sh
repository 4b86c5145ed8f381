#!/usr/bin/env bash
# test_fleet_plot.sh - fleet-plot on real runs: a 1-worker dense run and a 2-worker Local SGD run
# of the quick-start task (fleet-train's metrics.jsonl) drawn into PNG and SVG, against step
# and time, with panels that only one run (or none) has data for; and its errors: an unknown
# metric, a missing file, a malformed line in the middle (named by file and line), a truncated
# last line (a warning, still drawn), a wrong output extension, no gnuplot (FLEET_GNUPLOT) —
# none of which leaves an output file behind. Skipped without gnuplot.
set -u
bin="${FLEET_BIN:?}"
src="${FLEET_SRC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
command -v gnuplot >/dev/null || { echo "SKIPPED: gnuplot not installed (scripts/install-deps.sh)"; exit 77; }
plot="$bin/fleet-plot"

"$bin/fleet-train" -c "$src/configs/quickstart.yaml" -o train.max_steps=96 -o train.log_interval=8 \
  -o train.log_dir="$tmp/dense" >"$tmp/dense.out" 2>&1 ||
  { echo "FAIL: training the dense run"; tail -5 "$tmp/dense.out"; exit 1; }
FLEET_COMM_TIMEOUT=60 timeout 120 "$bin/fleetrun" --nproc_per_node 2 --log_dir "$tmp/wlog" \
  "$bin/fleet-train" -c "$src/configs/quickstart.yaml" -o train.max_steps=96 \
  -o train.log_interval=8 -o strategy.localsgd=true -o strategy.localsgd_configs.k_steps=4 \
  -o train.log_dir="$tmp/local" >"$tmp/local.out" 2>&1 ||
  { echo "FAIL: training the Local SGD run"; tail -5 "$tmp/local.out"; exit 1; }

ok() { echo "$1"; }
bad() { echo "FAIL: $1"; fail=1; }

# drawn: PNG (its signature), SVG (the labels as text), against time, panels without data
if "$plot" -o "$tmp/a.png" dense="$tmp/dense" "Local SGD k=4"="$tmp/local/metrics.jsonl" >"$tmp/a.log" 2>&1 &&
   [ "$(head -c 8 "$tmp/a.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; then
  ok "PNG: $(stat -c %s "$tmp/a.png") bytes"
else
  bad "PNG"; cat "$tmp/a.log"
fi
if "$plot" -o "$tmp/b.svg" --x time --metrics loss,acc,interval,sparsity,step_ms,ips \
     --title 'two "runs"' "$tmp/dense" 'k=4 \ "q"'="$tmp/local" >"$tmp/b.log" 2>&1 &&
   grep -q '<svg' "$tmp/b.svg" && grep -q '>dense<' "$tmp/b.svg" &&
   grep -qF 'k=4 \ "q"' "$tmp/b.svg" && grep -q 'no data' "$tmp/b.svg"; then
  ok "SVG against time, a label with a quote and a backslash, an empty panel ('no data')"
else
  bad "SVG"; cat "$tmp/b.log"; grep -o '<text[^<]*<' "$tmp/b.svg" 2>/dev/null | head
fi

# errors: exit 2 (input) or 1 (gnuplot), the culprit named, no output file left
expect() { # expect WHAT RC MESSAGE OUT -- ARGS...
  local what=$1 want=$2 msg=$3 out=$4
  shift 5
  "$plot" -o "$out" "$@" >"$tmp/e.log" 2>&1
  local rc=$?
  if [ $rc -eq "$want" ] && grep -qF -- "$msg" "$tmp/e.log" && ! ls "$out"* >/dev/null 2>&1; then
    ok "$what: exit $rc, $(grep -F -- "$msg" "$tmp/e.log" | head -1)"
  else
    bad "$what: exit $rc (want $want), want '$msg', no $out*"; cat "$tmp/e.log"
  fi
}
expect "unknown metric" 2 "unknown metric 'accuracy' (valid: loss acc val_acc lr bytes" \
  "$tmp/e1.png" -- --metrics loss,accuracy "$tmp/dense"
expect "missing run" 2 "cannot open $tmp/nowhere/metrics.jsonl" "$tmp/e2.png" -- "$tmp/nowhere/metrics.jsonl"
head -3 "$tmp/dense/metrics.jsonl" >"$tmp/mid.jsonl"
echo '{"phase":"train","step":40,"loss":0.3,' >>"$tmp/mid.jsonl"
tail -2 "$tmp/dense/metrics.jsonl" >>"$tmp/mid.jsonl"
expect "malformed line 4 of 6" 2 "$tmp/mid.jsonl:4: offset" "$tmp/e3.png" -- "$tmp/mid.jsonl"
expect "wrong extension" 2 "must end in .png or .svg" "$tmp/e4.jpg" -- "$tmp/dense"
expect "bad --x" 2 "--x 'epoch': want step or time" "$tmp/e5.png" -- --x epoch "$tmp/dense"
echo '{"phase":"other"}' >"$tmp/none.jsonl"
expect "no records" 2 "$tmp/none.jsonl: no train or eval records" "$tmp/e6.png" -- "$tmp/none.jsonl"
FLEET_GNUPLOT=/nonexistent/gnuplot expect "no gnuplot" 1 "gnuplot not found" "$tmp/e7.png" -- "$tmp/dense"
FLEET_GNUPLOT=false expect "gnuplot fails" 1 "false failed (exit status 1)" "$tmp/e8.png" -- "$tmp/dense"

# a run cut short while writing its last line: a warning, and the figure
head -c -7 "$tmp/dense/metrics.jsonl" >"$tmp/cut.jsonl"
lines=$(wc -l <"$tmp/cut.jsonl")
if "$plot" -o "$tmp/c.png" "$tmp/cut.jsonl" >"$tmp/c.log" 2>&1 && [ -s "$tmp/c.png" ] &&
   grep -qF "warning: $tmp/cut.jsonl:$((lines + 1)): an incomplete last line" "$tmp/c.log"; then
  ok "truncated last line: $(grep -F warning "$tmp/c.log")"
else
  bad "truncated last line"; cat "$tmp/c.log"
fi
exit $fail
