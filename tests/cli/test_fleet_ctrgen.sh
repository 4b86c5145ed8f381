#!/usr/bin/env bash
# test_fleet_ctrgen.sh - fleet-ctrgen and the Criteo reader on the same data: files written
# (plain and multi-valued slots, another slot count with the log transform) have Criteo's
# shape and read back through the reader as exactly the task's samples (--verify); the same
# options give the same bytes; a file written with other options, or edited, fails to verify
# naming its line; the best AUC is printed and above 0.5; bad options are refused with the
# culprit named; a failed write leaves no file behind.
set -u
bin="${FLEET_BIN:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
gen="$bin/fleet-ctrgen"
[ -x "$gen" ] || { echo "SKIPPED: fleet-ctrgen not built"; exit 77; }
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }

# Criteo's shape: 40 tab-separated fields, label 0/1, integers, 8-digit hex values
"$gen" --samples 3000 --out "$tmp/a.txt" --seed 7 --best-auc 20000 >"$tmp/a.log" 2>&1 ||
  { bad "writing a.txt: $(cat "$tmp/a.log")"; exit 1; }
[ "$(wc -l <"$tmp/a.txt")" -eq 3000 ] && ok "3000 lines" || bad "$(wc -l <"$tmp/a.txt") lines"
awk -F'\t' 'NF != 40 || $1 !~ /^[01]$/ { bad++ }
  { for (i = 2; i <= 14; i++) if ($i !~ /^(-?[0-9]+)?$/) bad++
    for (i = 15; i <= 40; i++) if ($i !~ /^[0-9a-f]*$/ || (length($i) != 8 && $i != "")) bad++ }
  END { exit bad > 0 }' "$tmp/a.txt" && ok "Criteo's fields" || bad "fields not in Criteo's shape"
auc=$(sed -n 's/.*best AUC \([0-9.]*\).*/\1/p' "$tmp/a.log")
awk -v a="$auc" 'BEGIN { exit !(a > 0.5 && a < 1) }' && ok "best AUC $auc printed" ||
  bad "no best AUC in: $(cat "$tmp/a.log")"
rate=$(sed -n 's/.*positive rate \([0-9.]*\).*/\1/p' "$tmp/a.log")
awk -v r="$rate" 'BEGIN { exit !(r > 0.2 && r < 0.32) }' && ok "positive rate $rate" ||
  bad "positive rate '$rate' far from 0.26"

# the reader gives back exactly the task's samples
"$gen" --samples 3000 --verify "$tmp/a.txt" --seed 7 >"$tmp/v.log" 2>&1 &&
  grep -q "3000 samples match" "$tmp/v.log" && ok "a.txt verifies" || bad "verify a.txt: $(cat "$tmp/v.log")"
"$gen" --samples 3000 --out "$tmp/a2.txt" --seed 7 --best-auc 0 >/dev/null 2>&1
cmp -s "$tmp/a.txt" "$tmp/a2.txt" && ok "same options, same bytes" || bad "two runs differ"
"$gen" --samples 500 --first 1000 --split 1 --max-ids 3 --missing 0.3 --vocab 1e8 --seed 9 \
  --out "$tmp/m.txt" --best-auc 0 >/dev/null 2>&1 || bad "writing m.txt"
grep -q ',' "$tmp/m.txt" && ok "multi-valued slots written with ','" || bad "no multi-valued slot"
"$gen" --samples 500 --first 1000 --split 1 --max-ids 3 --missing 0.3 --vocab 1e8 --seed 9 \
  --verify "$tmp/m.txt" >"$tmp/v.log" 2>&1 && ok "m.txt verifies" || bad "verify m.txt: $(cat "$tmp/v.log")"
"$gen" --samples 200 --slots 5 --dense 3 --transform log --out "$tmp/s.txt" --best-auc 0 >/dev/null 2>&1 &&
  [ "$(head -1 "$tmp/s.txt" | awk -F'\t' '{print NF}')" -eq 9 ] &&
  "$gen" --samples 200 --slots 5 --dense 3 --transform log --verify "$tmp/s.txt" >/dev/null 2>&1 &&
  ok "5 slots, 3 dense, log transform round trip" || bad "5 slots, 3 dense"

# a mismatch is found and named
if "$gen" --samples 3000 --verify "$tmp/a.txt" --seed 8 >"$tmp/v.log" 2>&1; then
  bad "a.txt verified against seed 8"
else
  grep -q "a.txt:1: differs from sample 0" "$tmp/v.log" && ok "other seed: $(head -1 "$tmp/v.log")" ||
    bad "other seed: $(cat "$tmp/v.log")"
fi
awk -F'\t' -v OFS='\t' 'NR == 17 { $15 = "00000bad" } { print }' "$tmp/a.txt" >"$tmp/e.txt"
"$gen" --samples 3000 --verify "$tmp/e.txt" --seed 7 >"$tmp/v.log" 2>&1
grep -q "e.txt:17: differs from sample 16" "$tmp/v.log" && ok "edited line 17 named" || bad "edit: $(cat "$tmp/v.log")"
awk 'NR == 5 { print "1\tx"; next } { print }' "$tmp/a.txt" >"$tmp/b.txt"
"$gen" --samples 3000 --verify "$tmp/b.txt" --seed 7 >"$tmp/v.log" 2>&1
grep -q "b.txt:5: 2 fields, want 40" "$tmp/v.log" && ok "malformed line: $(head -1 "$tmp/v.log")" ||
  bad "malformed: $(cat "$tmp/v.log")"
head -2999 "$tmp/a.txt" >"$tmp/t.txt"
"$gen" --samples 3000 --verify "$tmp/t.txt" --seed 7 >"$tmp/v.log" 2>&1
grep -q "2999 lines, want 3000" "$tmp/v.log" && ok "short file named" || bad "short: $(cat "$tmp/v.log")"

# refused options
for args in "--samples x --out $tmp/z" "--samples 10 --out $tmp/z --vocab 0" \
            "--samples 10 --out $tmp/z --transform cube" "--samples 10 --out $tmp/z --dense 5" \
            "--samples 10" "--samples 10 --out $tmp/z --bogus 1"; do
  if "$gen" $args >"$tmp/r.log" 2>&1; then
    bad "accepted: $args"
  else
    grep -q "fleet-ctrgen: error:" "$tmp/r.log" && ok "refused $args: $(head -1 "$tmp/r.log")" ||
      bad "no error line for $args"
  fi
done
[ ! -e "$tmp/z" ] && ok "nothing written for refused options" || bad "$tmp/z written"
mkdir "$tmp/ro" && chmod 500 "$tmp/ro"
if [ "$(id -u)" -ne 0 ]; then
  "$gen" --samples 10 --out "$tmp/ro/x.txt" >"$tmp/r.log" 2>&1 && bad "wrote into a read-only directory" ||
    { grep -q "ro/x.txt" "$tmp/r.log" && ok "unwritable output named" || bad "unwritable: $(cat "$tmp/r.log")"; }
  [ -z "$(ls -A "$tmp/ro")" ] && ok "no file left behind" || bad "left: $(ls -A "$tmp/ro")"
fi
chmod 700 "$tmp/ro"
exit $fail
