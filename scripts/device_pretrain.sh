#!/usr/bin/env bash
# Pretrain the tiny and small backbones side by side on one H200 and evaluate both with elastic-attention's own
# runner (full attention and all-SSA, at the training length and twice it). One device call of at most 10 minutes:
#   OUT=out bash scripts/device_pretrain.sh          (from the repository root; results under $OUT)
# It ran with the pretraining script's defaults of that time, which OLD restores (the echo recipe is the default now).
set -u
OLD="--dense-echo-rate 0 --dense-chain-rate 0 --tokens-per-step 65536 --length-warmup-steps 300 --suite-start-step 0"
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-out}
mkdir -p "$OUT" /tmp/work
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee /tmp/work/gpu.txt
python3 scripts/pretrain_backbone.py --preset small $OLD --max-len 4096 --out /tmp/work/backbone-small \
  --max-seconds 330 \
  --eval-samples 16 --num-workers 6 > /tmp/work/small.log 2>&1 &
small_pid=$!
python3 scripts/pretrain_backbone.py --preset tiny $OLD --head-dim 64 --lr 2e-3 --max-len 2048 \
  --out /tmp/work/backbone-tiny --max-seconds 250 \
  --eval-samples 16 --num-workers 6 > /tmp/work/tiny.log 2>&1
tar -C /tmp/work -czf "$OUT/backbone-tiny.tgz" backbone-tiny
echo "tiny done at $(( $(date +%s) - start )) s"
timeout 120 python3 -m elastic_attention.cli eval --model /tmp/work/backbone-tiny --modes full,sparse --tasks all \
  --lengths 2048,4096 --samples 16 --batch-size 16 --out /tmp/work/tiny-eval > /tmp/work/tiny-eval.log 2>&1
echo "tiny eval done at $(( $(date +%s) - start )) s"
wait $small_pid
echo "small done at $(( $(date +%s) - start )) s"
tar -C /tmp/work -cf - backbone-small | split -b 15m - "$OUT/backbone-small.tar.part-"
left=$(( 470 - ($(date +%s) - start) ))
timeout $left python3 -m elastic_attention.cli eval --model /tmp/work/backbone-small --modes full,sparse --tasks all \
  --lengths 4096,8192 --samples 10 --batch-size 10 --out /tmp/work/small-eval > /tmp/work/small-eval.log 2>&1
echo "small eval done at $(( $(date +%s) - start )) s"
tar -C /tmp/work -czf "$OUT/logs.tgz" gpu.txt tiny.log small.log tiny-eval.log small-eval.log tiny-eval small-eval \
  backbone-tiny/train_summary.json backbone-small/train_summary.json 2>/dev/null
ls -la "$OUT"
