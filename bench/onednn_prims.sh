#!/usr/bin/env bash
# onednn_prims.sh - sums oneDNN's per-primitive execution times (ONEDNN_VERBOSE=1 lines, from
# fleet's onednn backend or from Debian's PyTorch, which links the same libdnnl) into ms per
# training step, so that two programs' steps can be compared primitive by primitive
# (bench/RESULTS.md, issue 36).
# Usage: onednn_prims.sh STEPS [kind|problem] < LOG
#   STEPS   the number of steps the log holds (its times are divided by it)
#   kind    (default) one row per primitive, implementation and propagation kind
#   problem one row per convolution shape (implementation, propagation kind, oneDNN's problem
#           string), with its GFLOP/s (2 x MB x IC x OC / G x OH x OW x KH x KW per call)
# Example: OMP_NUM_THREADS=1 CNN_STEP_SIZE=96 ONEDNN_VERBOSE=1 build/bench/cnn_step \
#            pphgnet_tiny 8 1 3 onednn 2>/dev/null | bench/onednn_prims.sh 4 problem
# (cnn_step ITERS 1 REPEATS 3 runs 1 warm-up + 3 steps: 4 in the log.)
set -euo pipefail
steps=${1:?usage: onednn_prims.sh STEPS [kind|problem] < LOG}
mode=${2:-kind}
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "onednn_prims.sh: STEPS '$steps' is not a positive integer" >&2; exit 2; }
[[ "$mode" == kind || "$mode" == problem ]] || { echo "onednn_prims.sh: mode '$mode' is not kind or problem" >&2; exit 2; }
# exec lines: onednn_verbose,exec,cpu,PRIM,IMPL,PROP,MDS,ATTRS,AUX,PROBLEM,MS
grep '^onednn_verbose,exec,' | awk -F, -v steps="$steps" -v mode="$mode" '
function flops(pd,   d, k, v, s) {
    split("", d)
    s = pd
    while (match(s, /[a-z]+[0-9]+/)) {
        k = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
        v = k; sub(/^[a-z]+/, "", v); sub(/[0-9]+$/, "", k)
        if (!(k in d)) d[k] = v + 0
    }
    if (!("g" in d)) d["g"] = 1
    return 2 * d["mb"] * d["ic"] * d["oc"] / d["g"] * d["oh"] * d["ow"] * d["kh"] * d["kw"]
}
{
    ms = $NF + 0; total += ms
    if (mode == "kind") key = $4 "," $5 "," $6
    else if ($4 == "convolution") { key = $5 "," $6 "," $(NF - 1); fl[key] += flops($(NF - 1)) }
    else next
    t[key] += ms; n[key]++
}
END {
    for (k in t) {
        if (mode == "kind")
            printf "%9.2f %7.1f  %s\n", t[k] / steps, n[k] / steps, k
        else
            printf "%9.2f %7.1f %7.1f  %s\n", t[k] / steps, n[k] / steps, (t[k] > 0 ? fl[k] / t[k] / 1e6 : 0), k
    }
    printf "%9.2f         all primitives, ms per step\n", total / steps
}' | sort -rn
