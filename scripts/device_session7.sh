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
else
  echo "unknown mode $MODE (probe, chunks or long)" >&2; exit 2
fi
echo "done at $(( $(date +%s) - start )) s"
ls -la "$OUT"
