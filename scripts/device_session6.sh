#!/usr/bin/env bash
# Sixth device session (2026-11-30), nvidia-h200-x2:
#   1. OUT=$OUT bash scripts/device_recipe.sh count      (issue 3: two tiny seeds and the small preset)
#   2. carry artifacts/backbone-small (run small_c of call 1): OUT=$OUT bash scripts/device_session6.sh small
#      GPU 0: the small backbone's table of issue 3 (full and all-SSA, every task, at 4096 and 8192 tokens).
#      GPU 1: issue 4 item 7 on the small backbone: routers trained with scripts/small_finding.yaml, then full,
#      elastic, static hybrid at elastic's MSR and all sparse at 4096 and 8192 tokens.
#   3. carry artifacts/backbone-small: OUT=$OUT bash scripts/device_session6.sh limit   (item 7 with margin_limit)
#   4. carry artifacts/backbone-small: OUT=$OUT bash scripts/device_session6.sh standardize   (item 7, standardized
#      router inputs); then the same with "standardize2" (sensitive targets 0.5; 240 steps) and "standardize3"
#      (targets 0.5 with the absolute linear term; with exponential temperature decay)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
start=$(date +%s)
R=/tmp/session6; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/gpu.txt"
MODE=${1:-small}
cli="python3 -m elastic_attention.cli"
variant() {  # variant NAME GPU OVERRIDES...: item 7 on the small backbone in the background on one GPU: routers
  # trained with scripts/small_finding.yaml and the overrides, then full, elastic, static and all sparse evaluated
  local name=$1 gpu=$2; shift 2
  ( export CUDA_VISIBLE_DEVICES=$gpu
    timeout 250 $cli train scripts/small_finding.yaml output_dir=/tmp/$name "$@" --no-progress > "$R/${name}_train.log" 2>&1
    cp /tmp/$name/summary.json "$R/${name}_summary.json"; cp /tmp/$name/metrics.csv "$R/${name}_metrics.csv"
    timeout 200 $cli eval --model artifacts/backbone-small --router /tmp/$name/router \
      --modes full,elastic,static,sparse --tasks needle_multikey,variable_tracking,local_recall \
      --lengths 4096,8192 --samples 24 --batch-size 24 --out "$R/${name}_eval" > "$R/${name}_eval.log" 2>&1 ) &
}
if [ "$MODE" = small ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 520 $cli eval --model artifacts/backbone-small --modes full,sparse --tasks all \
    --lengths 4096,8192 --samples 16 --batch-size 16 --out "$R/small_eval" > "$R/small_eval.log" 2>&1 &
  variant small_finding 1
  wait
  tar -C /tmp -czf "$OUT/session6_small.tgz" session6
elif [ "$MODE" = limit ] || [ "$MODE" = standardize ] || [ "$MODE" = standardize2 ] || [ "$MODE" = standardize3 ]; then
  # Item 7 on the small backbone again, one variant per GPU. "limit": the router's logit margin clamped while
  # sampling (margin_limit); "standardize": router inputs standardized per head.
  if [ "$MODE" = limit ]; then
    variant limit4 0 margin_limit=4
    variant limit4_lr3 1 margin_limit=4 router_lr=0.003 multiplier_lr=0.1
  elif [ "$MODE" = standardize ]; then
    variant std 0 elastic.router_standardize=true
    variant std_lr3 1 elastic.router_standardize=true router_lr=0.003 multiplier_lr=0.1
  elif [ "$MODE" = standardize2 ]; then  # lower targets on the sensitive tasks; twice the steps
    variant std_t5 0 elastic.router_standardize=true targets.needle_multikey=0.5 targets.variable_tracking=0.5
    variant std_s240 1 elastic.router_standardize=true steps=240
  else  # standardize3: std_t5 with the absolute linear term; with the paper's exponential temperature decay
    T5="elastic.router_standardize=true targets.needle_multikey=0.5 targets.variable_tracking=0.5"
    variant std_t5_abs 0 $T5 linear_term=absolute
    variant std_t5_exp 1 $T5 temperature.kind=exponential
  fi
  wait
  tar -C /tmp -czf "$OUT/session6_$MODE.tgz" session6
else
  echo "unknown mode $MODE (small, limit, standardize, standardize2 or standardize3)" >&2; exit 2
fi
echo "done at $(( $(date +%s) - start )) s"
ls -la "$OUT"
