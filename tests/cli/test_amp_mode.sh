#!/usr/bin/env bash
# test_amp_mode.sh - fleet-train says which mixed precision runs (docs/amp.md): with
# strategy.amp on train.backend=ref, whose table has low dtypes, the activations are natively
# float16 / bfloat16 and the start-up line says "native ... activations on the ref table"; on
# train.backend=cpu the same run is emulated (f32 kernels, values rounded) and says so; a white
# list that names no layer of the network says no layer computes low; without strategy.amp
# nothing is said. configs/mlp.yaml cut to 3 steps of 128: each run takes about 0.1 CPU-s.
set -u
bin="${FLEET_BIN:?}/fleet-train"
cfg="${FLEET_SRC:?}/configs/mlp.yaml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
[ -x "$bin" ] || { echo "SKIPPED: fleet-train not built"; exit 77; }
unset FLEET_AMP_INJECT_INF
tiny=(-o data.train_size=512 -o train.max_steps=3 -o train.threads=1)

run() { # run NAME OVERRIDES...: fleet-train into $tmp/NAME.out, checking that it exits 0
  local name=$1; shift
  timeout 120 "$bin" -c "$cfg" "${tiny[@]}" -o train.log_dir="$tmp/$name" "$@" \
    >"$tmp/$name.out" 2>&1
  check "$name: exit 0" test $? -eq 0
}
says() { # says NAME TEXT: the run's output has TEXT on its strategy amp line
  check "$1 says '$2'" grep -qF "strategy amp: $2" "$tmp/$1.out"
}

run ref_f16 -o train.backend=ref -o strategy.amp=true
says ref_f16 "native float16 activations on the ref table (5 of 5 layers, 0 emulated)"
run ref_bf16 -o train.backend=ref -o strategy.amp=true -o strategy.amp_configs.dtype=bfloat16
says ref_bf16 "native bfloat16 activations on the ref table"
run cpu_f16 -o train.backend=cpu -o strategy.amp=true
says cpu_f16 "emulated on the cpu table (f32 kernels, values rounded to float16; 3 of 5 layers)"
run ref_none -o train.backend=ref -o strategy.amp=true -o strategy.amp_configs.custom_black_list=fc
says ref_none "no layer computes in float16 on the ref table"
run ref_f32 -o train.backend=ref
check "ref_f32: no strategy amp line" bash -c "! grep -q 'strategy amp' '$tmp/ref_f32.out'"
exit $fail
