#!/usr/bin/env bash
# Seventh device session (2026-11-30):
#   1. OUT=$OUT bash scripts/device_session7.sh probe   (issue 3: can the backbone shapes learn local_count from
#      scratch, with the suite's question and with the asked colour last? scripts/count_probe.py, eight runs on
#      one GPU in parallel)
#   2. OUT=$OUT bash scripts/device_session7.sh probe list   (the same for the question that asks for the list of
#      the colour's items and then their number)
#   3. OUT=$OUT bash scripts/device_session7.sh chunks   (issue 6: the GPU cache tests, with the fused chunk paths,
#      then a chunked bounded prefill at 256K as a check of speed)
#   4. OUT=$OUT bash scripts/device_session7.sh long   (issue 6 item 4: the longest context, the bounded cache
#      prefilled in 64K chunks to 1M tokens, then decode steps)
#   5. carry artifacts/backbone-small (small_s26 of device_recipe.sh short): OUT=$OUT bash scripts/device_session7.sh
#      finding   (issue 4 item 7 on the new small backbone, routers pooling the prompt only; the sixth session's
#      std_t5 settings; every output written to $OUT as it comes, the call runs on the session's last minutes)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
start=$(date +%s)
R=/tmp/session7; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/gpu.txt"
MODE=${1:-probe}
cli="python3 -m elastic_attention.cli"
if [ "$MODE" = probe ]; then
  QUESTIONS=${2:-mid last}
  for question in $QUESTIONS; do
    for run in "tiny 0" "tiny 1" "small 0"; do
      set -- $run
      timeout 400 python3 scripts/count_probe.py --question $question --preset $1 --seed $2 --steps 4000 \
        --out "$R/probe_${question}_$1_s$2.json" > "$R/probe_${question}_$1_s$2.log" 2>&1 &
    done
  done
  wait
  tar -C /tmp -czf "$OUT/session7_probe_${QUESTIONS// /_}.tgz" session7
elif [ "$MODE" = chunks ]; then
  timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_cache.py > "$R/gpu_cache_tests.log" 2>&1
  timeout 300 $cli bench decode --lengths 256k --batch 1 --caches bounded --backend flex --prefill-chunk 64k \
    --steps 5 --out "$OUT/decode_chunked_256k.json" > "$R/decode_chunked_256k.log" 2>&1
  cp "$R"/*.log "$OUT/"
elif [ "$MODE" = long ]; then
  timeout 575 $cli bench decode --lengths ${2:-1m} --batch 1 --caches bounded --backend flex --prefill-chunk 64k \
    --steps 5 --out "$OUT/decode_${2:-1m}.json" > "$OUT/decode_${2:-1m}.log" 2>&1
elif [ "$MODE" = finding ]; then
  timeout 110 $cli train scripts/small_finding.yaml output_dir=/tmp/std_t5 elastic.router_standardize=true \
    targets.needle_multikey=0.5 targets.variable_tracking=0.5 --no-progress > "$OUT/std_t5_train.log" 2>&1
  cp /tmp/std_t5/summary.json "$OUT/std_t5_summary.json"; cp /tmp/std_t5/metrics.csv "$OUT/std_t5_metrics.csv"
  timeout 60 $cli eval --model artifacts/backbone-small --router /tmp/std_t5/router \
    --modes full,elastic,static,sparse --tasks needle_multikey,variable_tracking,local_recall \
    --lengths 4096,8192 --samples 24 --batch-size 24 --out "$OUT/std_t5_eval" > "$OUT/std_t5_eval.log" 2>&1
else
  echo "unknown mode $MODE (probe, chunks, long or finding)" >&2; exit 2
fi
echo "done at $(( $(date +%s) - start )) s"
ls -la "$OUT"
