#!/usr/bin/env bash
# Backbone recipe search (issue 3): six tiny variants and one small run side by side on two H200s (nvidia-h200-x2),
# each evaluated by the pretraining script itself (full attention, greedy exact match at its training length).
#   OUT=out bash scripts/device_recipe.sh          (from the repository root; results under $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-out}
W=/tmp/recipe
mkdir -p "$OUT" "$W"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$W/gpu.txt"
run() {  # run NAME GPU ARGS...
  local name=$1 gpu=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout 560 python3 scripts/pretrain_backbone.py --out "$W/$name" --num-workers 4 \
    --eval-samples 24 "$@" > "$W/$name.log" 2>&1 &
}
T="--preset tiny --max-len 2048 --max-seconds 420"
run t_dense 0 $T --suite-start-step 1500
run t_lr    0 $T --lr 1e-3
run t_few   0 $T --dense-needle-rate 0.08 --dense-query-rate 0.12
run t_lm    1 $T --dense-lm-weight 0.1 --dense-repeat-rate 0.03
run t_warm  1 $T --length-warmup-steps 1500 --warmup-len 512
run small   1 --preset small --max-len 4096 --max-seconds 440 --suite-start-step 800 --dense-needle-rate 0.1 \
  --dense-query-rate 0.15
wait
for d in "$W"/t_*/; do n=$(basename "$d"); tar -C "$W" -czf "$OUT/$n.tgz" "$n"; done
tar -C "$W" -cf - small | split -b 15m - "$OUT/small.tar.part-"
cp "$W"/*.log "$W/gpu.txt" "$OUT/"
ls -la "$OUT"
