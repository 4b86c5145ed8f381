#!/usr/bin/env bash
# test_recompute.sh - strategy.recompute in fleet-train: 2-worker runs (fleetrun on loopback)
# with recompute print the same loss and evaluation lines as without, for the CIFAR ResNet-20
# with batch norm (dense, auto and named checkpoints), and for the MLP with DGC, Local SGD and
# gradient merge; the progress line and metrics.jsonl show the smaller activation memory;
# --print-model marks the checkpoints; an unknown layer name or a missing checkpoint list stops
# before training with the key, its line and the layers to choose from.
set -u
bin="${FLEET_BIN:?}/fleet-train"
run="${FLEET_BIN:?}/fleetrun"
src="${FLEET_SRC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}
if [ ! -x "$run" ] || [ ! -x "$bin" ]; then
  echo "SKIPPED: fleetrun or fleet-train not built"; exit 77
fi
unset FLAGS_START_PORT FLEET_JOB_TOKEN FLEET_LISTEN_FD
losses() { # loss and evaluation lines of rank $2 in log $1, without timing and memory fields
  grep "^worker_index: $2," "$1" | sed -E 's/, ips .*//'
}
same() { test -s "$1" && cmp -s "$1" "$2"; }
# job NAME CONFIG OVERRIDES...: a 2-worker run, logs under $tmp/NAME
job() {
  local name=$1 cfg=$2; shift 2
  timeout 300 "$run" --nproc_per_node 2 --log_dir "$tmp/$name" "$bin" -c "$src/configs/$cfg" \
    -o train.log_dir="$tmp/$name.m" "$@" >"$tmp/$name.out" 2>&1
  check "$name: exit 0" test $? -eq 0
  losses "$tmp/$name/workerlog.0" 0 >"$tmp/$name.0"
  losses "$tmp/$name/workerlog.1" 1 >"$tmp/$name.1"
}
# compare PLAIN OTHER: identical loss lines on both ranks
compare() {
  check "$2: rank 0's loss lines are $1's" same "$tmp/$1.0" "$tmp/$2.0"
  check "$2: rank 1's loss lines are $1's" same "$tmp/$1.1" "$tmp/$2.1"
}
on=(-o strategy.recompute=true)

# 1. ResNet-20 with batch norm, dense with overlapped buckets (on 16x16 images: the layers and
# what recompute keeps of them are those of 32x32, at a quarter of the cost)
res=(-o train.max_steps=24 -o train.log_interval=4 -o data.train_size=2048 -o data.val_size=256
  -o data.image_size=16)
job r_plain shapes_resnet.yaml "${res[@]}"
job r_auto shapes_resnet.yaml "${res[@]}" "${on[@]}" -o strategy.recompute_configs.checkpoints=auto
job r_named shapes_resnet.yaml "${res[@]}" "${on[@]}" \
  -o "strategy.recompute_configs.checkpoints=layer1.1.add, layer2.0.bn1,layer3.2.add"
compare r_plain r_auto
compare r_plain r_named
check "resnet: evaluation lines compared too" grep -q "eval val_loss" "$tmp/r_auto.0"
act() { sed -nE 's/.*"act_mb":([0-9.]+).*/\1/p' "$tmp/$1.m/metrics.jsonl" | head -1; }
a_plain=$(act r_plain) a_auto=$(act r_auto)
echo "resnet-20 activation MB per worker: ${a_plain:-?} without recompute, ${a_auto:-?} with"
check "metrics.jsonl: act_mb ${a_auto:-none} < ${a_plain:-none}" \
  awk -v a="${a_auto:-0}" -v p="${a_plain:-0}" 'BEGIN { exit !(a > 0 && a < p) }'
check "metrics.jsonl: peak_mb" grep -q '"peak_mb":[0-9]' "$tmp/r_auto.m/metrics.jsonl"
a_line=$(awk -v a="${a_auto:-0}" 'BEGIN { printf "%.1f", a }')
check "progress line: act $a_line MB and peak" grep -qE "^worker_index: 0, .*, comm [0-9.]+ MB, act $a_line MB, peak [0-9]+ MB$" "$tmp/r_auto/workerlog.0"

# 2. the MLP with DGC, Local SGD and gradient merge (auto: every ceil(sqrt(n))-th layer)
mlp=(-o train.epochs=2)
job d_plain mlp_dgc.yaml "${mlp[@]}"
job d_auto mlp_dgc.yaml "${mlp[@]}" "${on[@]}" -o strategy.recompute_configs.checkpoints=auto
compare d_plain d_auto
job l_plain mlp_localsgd.yaml "${mlp[@]}"
job l_auto mlp_localsgd.yaml "${mlp[@]}" "${on[@]}" -o strategy.recompute_configs.checkpoints=act1
compare l_plain l_auto
gm=(-o train.epochs=2 -o strategy.gradient_merge=true -o strategy.gradient_merge_configs.k_steps=2)
job g_plain quickstart.yaml "${gm[@]}"
job g_auto quickstart.yaml "${gm[@]}" "${on[@]}" -o strategy.recompute_configs.checkpoints=auto
compare g_plain g_auto

# 3. --print-model: the layers, which outputs are checkpoints, and the activation memory
"$bin" -c "$src/configs/quickstart.yaml" "${on[@]}" -o strategy.recompute_configs.checkpoints=fc2 \
  --print-model >"$tmp/model.txt" 2>&1
check "--print-model: exit 0" test $? -eq 0
check "--print-model: fc2 is the checkpoint" grep -qE '^fc2 +fc +\(128\) +checkpoint$' "$tmp/model.txt"
check "--print-model: fc1 is recomputed" grep -qE '^fc1 +fc +\(128\) +recomputed$' "$tmp/model.txt"
check "--print-model: activation memory" grep -q '^activations: .* (with recompute)\|^activations: .*recompute arena' "$tmp/model.txt"

# 4. bad settings: named with their line, before training
cat >"$tmp/bad.yaml" <<EOF
model:
  type: mlp
data:
  type: teacher
strategy:
  recompute: true
  recompute_configs:
    checkpoints: "fc1, fc7"
EOF
"$bin" -c "$tmp/bad.yaml" >"$tmp/bad.out" 2>&1
check "unknown checkpoint: exit 2" test $? -eq 2
check "unknown checkpoint: key, file and line" grep -q "bad.yaml:8: strategy.recompute_configs.checkpoints: " "$tmp/bad.out"
check "unknown checkpoint: the name and the layers" grep -q "'fc7' is not a layer of the network (or 'auto'); its layers: fc1, act1, fc2, act2, fc3" "$tmp/bad.out"
check "unknown checkpoint: nothing trained" bash -c "! grep -q '^worker_index' '$tmp/bad.out'"
sed -i '/recompute_configs/,$d' "$tmp/bad.yaml"
"$bin" -c "$tmp/bad.yaml" >"$tmp/empty.out" 2>&1
check "no checkpoints: exit 2" test $? -eq 2
check "no checkpoints: said at recompute's line" grep -q "bad.yaml:6: strategy.recompute: needs strategy.recompute_configs.checkpoints" "$tmp/empty.out"

[ $fail -eq 0 ] && echo "test_recompute: all checks passed"
exit $fail
