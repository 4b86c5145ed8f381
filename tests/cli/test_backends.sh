#!/usr/bin/env bash
# test_backends.sh - training on the onednn backend is training on the im2col reference path
# (train.backend cpu) up to floating-point rounding: 30 steps of CIFAR ResNet-20 (option A
# shortcuts, NHWC on onednn) and of the quick-start MLP, the same seed, every step's loss
# within a stated tolerance; 2-worker dense and DGC runs (ResNet-8) likewise; an unknown backend
# is refused naming the key. Skipped where fleet was built without oneDNN. Under
# FLEET_TEST_NUMERIC_ONLY=1 (numeric_only_lib.sh) the refused backend is left to the native pass:
# every other check compares two backends.
set -u
bin="${FLEET_BIN:?}/fleet-train"
run="${FLEET_BIN:?}/fleetrun"
src="${FLEET_SRC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
source "$src/tests/cli/numeric_only_lib.sh"
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}
if [ ! -x "$run" ] || [ ! -x "$bin" ]; then
  echo "SKIPPED: fleetrun or fleet-train not built"; exit 77
fi
cd "$tmp" || exit 1
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD

# an unknown backend: refused, naming the key and the valid names
if native_section "the unknown backend"; then
  "$bin" -c "$src/configs/mlp.yaml" -o train.backend=cuda >"$tmp/bad.out" 2>&1
  check "train.backend=cuda refused" test $? -ne 0
  check "the message names train.backend" grep -q "train.backend" "$tmp/bad.out"
fi

if ! "$bin" -c "$src/configs/mlp.yaml" -o train.backend=onednn -o train.max_steps=1 \
     >"$tmp/probe.out" 2>&1; then
  if grep -q "built without oneDNN" "$tmp/probe.out"; then
    echo "SKIPPED: this fleet was built without oneDNN"; exit 77
  fi
  cat "$tmp/probe.out"; echo "FAIL: onednn backend does not start"; exit 1
fi

# the loss of every step, from metrics.jsonl (full precision)
losses() { grep '"phase":"train"' "$1/metrics.jsonl" | sed -E 's/.*"loss":([^,]*),.*/\1/'; }
# within TOL FILE1 FILE2 [EARLY_TOL EARLY_STEPS]: the same number of lines, each |a - b| <=
# TOL (1 + |b|), the first EARLY_STEPS within EARLY_TOL (1 + |b|); prints the largest
# differences, relative to (1 + |b|), of the early steps and of all
within() {
  awk -v tol="$1" -v etol="${4:-$1}" -v esteps="${5:-0}" 'NR == FNR { a[FNR] = $1; n = FNR; next }
    { m = FNR; d = a[FNR] - $1; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1; r = d / (1 + s)
      if (r > worst) worst = r
      if (FNR <= esteps && r > eworst) eworst = r
      if (r > (FNR <= esteps ? etol : tol)) { print "step " FNR ": " a[FNR] " vs " $1; bad = 1 } }
    END { if (esteps) printf "  steps 1-%d: largest relative difference %.3g (line %g)\n", esteps, eworst, etol
          printf "  %d steps, largest relative difference %.3g (line %g)\n", m, worst, tol
          exit bad || n != m || m == 0 }' "$2" "$3"
}
one() { # one NAME BACKEND ARGS...: a single-process run logging every step, on one thread
  local name=$1 be=$2; shift 2
  timeout 300 "$bin" "$@" -o train.backend="$be" -o train.log_interval=1 -o train.threads=1 \
    -o train.log_dir="$tmp/$name.$be" >"$tmp/$name.$be.out" 2>&1
  check "$name on $be: exit 0" test $? -eq 0
  losses "$tmp/$name.$be" >"$tmp/$name.$be.loss"
}
pair() { # pair NAME ARGS...: one NAME on cpu and on onednn, side by side (neither backend's
  # bits depend on the thread count, so one thread each costs fewer CPU-s than two in turn)
  local name=$1 pid; shift
  (one "$name" cpu "$@"; exit "$fail") &
  pid=$!
  one "$name" onednn "$@"
  wait "$pid" || fail=1
}

# ResNet-20, 30 steps of 32 images: convolutions, batch norm, option-A shortcuts and global
# pooling in NHWC against the NCHW im2col path. A small constant rate without momentum: at the
# recipe's rate (0.1 after warm-up, batch 16) any two summation orders, ref against cpu too,
# drift apart ~6x a step (1e-8 after one update, 1e-3 by step 12), which would test the
# dynamics, not the backend. Even so the difference grows with the steps, and how fast depends
# on the kernels oneDNN and OpenBLAS pick for the CPU: the largest relative difference over
# steps 1-5 was 8.0e-6 (AVX2) and 1.5e-5 (SSE4.1 kernels), over 30 steps 3.5e-4 and 1.3e-3.
# So: steps 1-5 within 1e-4 (rounding; a wrong gradient moves step 2 by far more), all 30
# within 5e-3 (about 4x the worst spread seen).
slow=(-o optimizer.lr.base=0.005 -o optimizer.lr.warmup_steps=0 -o optimizer.lr.schedule=constant
  -o optimizer.momentum=0)
r20=(-c "$src/configs/shapes_resnet.yaml" -o train.batch_size=32 -o train.max_steps=30
  -o data.num_workers=0 -o data.train_size=4096 -o data.val_size=0 "${slow[@]}")
pair r20 "${r20[@]}"
echo "ResNet-20, onednn vs cpu:"
check "ResNet-20: the first 5 losses within 1e-4, 30 within 5e-3" \
  within 5e-3 "$tmp/r20.onednn.loss" "$tmp/r20.cpu.loss" 1e-4 5

# the quick-start MLP (no convolutions: the same kernels on both backends): identical
mlp=(-c "$src/configs/mlp.yaml" -o train.max_steps=30 -o data.train_size=8192)
pair mlp "${mlp[@]}"
echo "MLP, onednn vs cpu:"
check "MLP: 30 losses identical" within 0 "$tmp/mlp.onednn.loss" "$tmp/mlp.cpu.loss"

# 2 workers, dense and DGC (ResNet-8 on 16x16 shapes, 40 steps; DGC compresses from step 0)
small=(-c "$src/configs/shapes_resnet.yaml" -o model.depth=8 -o data.image_size=16
  -o data.train_size=4096 -o data.val_size=0 -o train.batch_size=16 -o train.max_steps=40
  -o train.log_interval=1 -o train.threads=1 -o data.num_workers=0 "${slow[@]}")
dgc=(-o strategy.dgc=true -o strategy.dgc_configs.rampup_begin_step=0
  -o strategy.dgc_configs.min_compress_numel=1024)
two() { # two NAME BACKEND ARGS...
  local name=$1 be=$2; shift 2
  timeout 300 "$run" --nproc_per_node 2 --log_dir "$tmp/log.$name.$be" "$bin" "$@" \
    -o train.backend="$be" -o train.log_dir="$tmp/$name.$be" >"$tmp/$name.$be.out" 2>&1
  check "2 workers, $name on $be: exit 0" test $? -eq 0
  losses "$tmp/$name.$be" >"$tmp/$name.$be.loss"
}
two dense cpu "${small[@]}"
two dense onednn "${small[@]}"
echo "2 workers dense, onednn vs cpu:"
check "2 workers dense: 40 losses within 2e-3" within 2e-3 "$tmp/dense.onednn.loss" "$tmp/dense.cpu.loss"
two dgc cpu "${small[@]}" "${dgc[@]}"
two dgc onednn "${small[@]}" "${dgc[@]}"
echo "2 workers DGC, onednn vs cpu:"
check "2 workers DGC: 40 losses within 5e-3" within 5e-3 "$tmp/dgc.onednn.loss" "$tmp/dgc.cpu.loss"
if [ $fail -ne 0 ]; then
  for f in "$tmp"/*.out; do echo "== $f"; tail -5 "$f"; done
fi
numeric_only_report
exit $fail
