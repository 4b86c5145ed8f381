#!/usr/bin/env bash
# test_onednn_prims.sh - bench/onednn_prims.sh on a small oneDNN verbose log whose sums are
# known: ms per step per primitive kind and per convolution shape (with its GFLOP/s, grouped
# convolutions counted per group), lines that are not exec lines ignored, and its refusals
# (STEPS not a positive integer, an unknown mode) naming the culprit.
set -u
src="${FLEET_SRC:?}"
tool="$src/bench/onednn_prims.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
conv='onednn_verbose,exec,cpu,convolution'
p3='mb8_ic96oc96_ih24oh24kh3sh1dh0ph1_iw24ow24kw3sw1dw0pw1'
pdw='g96mb8_ic96oc96_ih24oh12kh3sh2dh0ph1_iw24ow12kw3sw2dw0pw1'
cat >"$tmp/log" <<LOG
onednn_verbose,info,oneDNN v2.6.3 (commit N/A)
cnn_step: a line of the program's own
$conv,jit:avx2,forward_training,src_f32::blocked:acdb:f0 dst_f32::blocked:acdb:f0,attr-scratchpad:user ,alg:convolution_direct,$p3,10
$conv,jit:avx2,forward_training,src_f32::blocked:acdb:f0 dst_f32::blocked:acdb:f0,attr-scratchpad:user ,alg:convolution_direct,$p3,6
$conv,jit_dw:avx2,backward_data,src_f32::blocked:acdb:f0,,alg:convolution_direct,$pdw,2
onednn_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:abcd:f0 dst_f32::blocked:ABcd8b8a:f0,,,96x96x3x3,1.5
LOG
expect() { # mode, expected line, blanks squeezed to one (the columns' widths are not checked)
  sed 's/^ *//; s/  */ /g' "$tmp/out.$1" | grep -qxF -- "$2" ||
    { echo "FAIL: $1: no line '$2' in:"; cat "$tmp/out.$1"; fail=1; }
}
bash "$tool" 2 <"$tmp/log" >"$tmp/out.kind" 2>"$tmp/err" || { echo "FAIL: kind mode exits non-zero"; cat "$tmp/err"; fail=1; }
expect kind "9.75 all primitives, ms per step"
expect kind "8.00 1.0 convolution,jit:avx2,forward_training"
expect kind "1.00 0.5 convolution,jit_dw:avx2,backward_data"
expect kind "0.75 0.5 reorder,jit:uni,undef"
[ "$(wc -l <"$tmp/out.kind")" -eq 4 ] || { echo "FAIL: kind mode: not 4 lines"; cat "$tmp/out.kind"; fail=1; }
# 2 x 8 x 96 x 96 x 24 x 24 x 9 = 764411904 flops a call, 2 calls in 16 ms: 95.6 GFLOP/s; the
# depthwise one 2 x 8 x 96 x 12 x 12 x 9 = 1990656 in 2 ms: 1.0
bash "$tool" 2 problem <"$tmp/log" >"$tmp/out.problem" 2>"$tmp/err" || { echo "FAIL: problem mode exits non-zero"; cat "$tmp/err"; fail=1; }
expect problem "8.00 1.0 95.6 jit:avx2,forward_training,$p3"
expect problem "1.00 0.5 1.0 jit_dw:avx2,backward_data,$pdw"
expect problem "9.75 all primitives, ms per step"
grep -q reorder "$tmp/out.problem" && { echo "FAIL: problem mode lists a reorder"; fail=1; }
for bad in "0" "x" "2 shapes"; do
  # shellcheck disable=SC2086
  if bash "$tool" $bad <"$tmp/log" >/dev/null 2>"$tmp/err"; then
    echo "FAIL: '$bad' accepted"; fail=1
  fi
  word=${bad##* }
  grep -q "'$word'" "$tmp/err" || { echo "FAIL: '$bad': the message does not name '$word':"; cat "$tmp/err"; fail=1; }
done
[ $fail -eq 0 ] && echo "PASS: onednn_prims.sh"
exit $fail
