#!/usr/bin/env bash
# test_fleet_plot.sh - fleet-plot on real runs: a 1-worker dense run and a 2-worker Local SGD run
# of the quick-start task (fleet-train's metrics.jsonl) drawn into PNG and SVG, against step
# and time, with panels that only one run (or none) has data for, and labels gnuplot must not
# interpret (quotes, a backslash, `command`, '=' in the path); and its errors: an unknown metric,
# a missing file, a malformed line in the middle (named by file and line), a truncated last line
# (a warning, still drawn), a wrong output extension, an unwritable output, no gnuplot
# (FLEET_GNUPLOT), gnuplot failing — none of which leaves an output file behind. Skipped
# without gnuplot.
set -u
bin="${FLEET_BIN:?}"
src="${FLEET_SRC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
command -v gnuplot >/dev/null || { echo "SKIPPED: gnuplot not installed (scripts/install-deps.sh)"; exit 77; }
for b in fleet-train fleetrun fleet-plot; do
  [ -x "$bin/$b" ] || { echo "SKIPPED: $b not built"; exit 77; }
done
plot="$bin/fleet-plot"

"$bin/fleet-train" -c "$src/configs/quickstart.yaml" -o train.max_steps=96 -o train.log_interval=8 \
  -o train.log_dir="$tmp/dense" >"$tmp/dense.out" 2>&1 ||
  { echo "FAIL: training the dense run"; tail -5 "$tmp/dense.out"; exit 1; }
FLEET_COMM_TIMEOUT=60 timeout 120 "$bin/fleetrun" --nproc_per_node 2 --log_dir "$tmp/wlog" \
  "$bin/fleet-train" -c "$src/configs/quickstart.yaml" -o train.max_steps=96 \
  -o train.log_interval=8 -o strategy.localsgd=true -o strategy.localsgd_configs.k_steps=4 \
  -o train.log_dir="$tmp/local" >"$tmp/local.out" 2>&1 ||
  { echo "FAIL: training the Local SGD run"; tail -5 "$tmp/local.out"; exit 1; }
grep -q '"localsgd_k":4' "$tmp/local/metrics.jsonl" || { echo "FAIL: no localsgd_k in the Local SGD run"; fail=1; }

ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
labels() { grep -o '<text[^>]*>[^<]*<' "$1" | sed 's/.*>//; s/<$//'; }

# PNG: its signature and a size
if "$plot" -o "$tmp/a.png" dense="$tmp/dense" "Local SGD k=4"="$tmp/local/metrics.jsonl" >"$tmp/a.log" 2>&1 &&
   [ -s "$tmp/a.png" ] && [ "$(head -c 8 "$tmp/a.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; then
  ok "PNG, $(stat -c %s "$tmp/a.png") bytes: $(cat "$tmp/a.log")"
else
  bad "PNG"; cat "$tmp/a.log"
fi
# SVG against time; labels with a quote, a backslash and `command` as text, not interpreted;
# an empty panel (no run has dgc_sparsity) says "no data"
if "$plot" -o "$tmp/b.svg" --x time --metrics loss,acc,interval,sparsity,step_ms,ips \
     --title 'two "runs"' "$tmp/dense" 'k=4 \ "q" `touch pwned`'="$tmp/local" >"$tmp/b.log" 2>&1 &&
   grep -q '<svg' "$tmp/b.svg" && labels "$tmp/b.svg" >"$tmp/b.txt" &&
   grep -qx 'dense' "$tmp/b.txt" && grep -qxF 'k=4 \ "q" `touch pwned`' "$tmp/b.txt" &&
   grep -qx 'seconds' "$tmp/b.txt" && grep -qx 'no data' "$tmp/b.txt" && [ ! -e pwned ] &&
   [ ! -e "$tmp/pwned" ]; then
  ok "SVG against time, labels with a quote, a backslash and a backquote, an empty panel"
else
  bad "SVG"; cat "$tmp/b.log"; labels "$tmp/b.svg" 2>/dev/null | sort -u | head -20
fi
# a run without the metric has no line in its panel; '=' in a path; --name=value options
cp -r "$tmp/local" "$tmp/lr=0.1"
if "$plot" --output="$tmp/k.svg" --metrics=interval "$tmp/dense" "lr=0.1=$tmp/lr=0.1" "$tmp/lr=0.1" \
     >"$tmp/k.log" 2>&1 && labels "$tmp/k.svg" >"$tmp/k.txt" && ! grep -qx 'dense' "$tmp/k.txt" &&
   [ "$(grep -cx 'lr=0.1' "$tmp/k.txt")" -eq 2 ] && ! grep -qx 'no data' "$tmp/k.txt"; then
  ok "--metrics interval: the Local SGD runs only; 'lr=0.1' labels from LABEL=PATH and PATH"
else
  bad "--metrics interval / '=' in the path"; cat "$tmp/k.log"; sort -u "$tmp/k.txt" 2>/dev/null | head -20
fi
if "$plot" -o "$tmp/s.png" --metrics interval,sparsity "$tmp/dense" >"$tmp/s.log" 2>&1 && [ -s "$tmp/s.png" ]; then
  ok "--metrics interval,sparsity with a run that has neither"
else
  bad "--metrics interval,sparsity on a dense run"; cat "$tmp/s.log"
fi

# errors: exit 2 (input) or 1 (gnuplot), the culprit named, no output file (or its temporary) left
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
expect "unknown metric" 2 "unknown metric 'accuracy' (valid: loss acc val_acc lr bytes interval sparsity step_ms ips)" \
  "$tmp/e1.png" -- --metrics loss,accuracy "$tmp/dense"
expect "missing run" 2 "nowhere: cannot open $tmp/nowhere/metrics.jsonl: No such file" "$tmp/e2.png" -- "$tmp/nowhere/metrics.jsonl"
head -3 "$tmp/dense/metrics.jsonl" >"$tmp/mid.jsonl"
echo '{"phase":"train","step":40,"loss":0.3,' >>"$tmp/mid.jsonl"
tail -2 "$tmp/dense/metrics.jsonl" >>"$tmp/mid.jsonl"
expect "malformed line 4 of 6" 2 "$tmp/mid.jsonl:4: offset" "$tmp/e3.png" -- "$tmp/mid.jsonl"
expect "wrong extension" 2 "must end in .png or .svg" "$tmp/e4.jpg" -- "$tmp/dense"
expect "bad --x" 2 "--x 'epoch': want step or time" "$tmp/e5.png" -- --x epoch "$tmp/dense"
echo '{"phase":"other"}' >"$tmp/none.jsonl"
expect "no records" 2 "$tmp/none.jsonl: no train or eval records" "$tmp/e6.png" -- "$tmp/none.jsonl"
expect "unwritable output" 2 "cannot write $tmp/nodir/e7.png.tmp." "$tmp/nodir/e7.png" -- "$tmp/dense"
FLEET_GNUPLOT=/nonexistent/gnuplot expect "no gnuplot" 1 \
  "gnuplot not found (install gnuplot-nox: scripts/install-deps.sh)" "$tmp/e8.png" -- "$tmp/dense"
FLEET_GNUPLOT=false expect "gnuplot fails" 1 "false failed (exit status 1)" "$tmp/e9.png" -- "$tmp/dense"
printf '#!/bin/sh\necho "gnuplot: no terminal" >&2\nexit 3\n' >"$tmp/gp.sh"
chmod +x "$tmp/gp.sh"
FLEET_GNUPLOT="$tmp/gp.sh" expect "gnuplot's stderr shown" 1 "gnuplot: no terminal" "$tmp/e10.png" -- "$tmp/dense"

# a run cut short while writing its last line: a warning, and the figure
head -c -7 "$tmp/dense/metrics.jsonl" >"$tmp/cut.jsonl"
lines=$(wc -l <"$tmp/cut.jsonl")
if "$plot" -o "$tmp/c.png" "$tmp/cut.jsonl" >"$tmp/c.log" 2>&1 && [ -s "$tmp/c.png" ] &&
   grep -qF "warning: $tmp/cut.jsonl:$((lines + 1)): incomplete last line skipped" "$tmp/c.log"; then
  ok "truncated last line: exit 0, $(grep -F warning "$tmp/c.log")"
else
  bad "truncated last line"; cat "$tmp/c.log"
fi
left=$(cd "$tmp" && ls | grep -E '\.tmp\.|\.gp$')
[ -z "$left" ] || bad "temporary files left: $left"
exit $fail
