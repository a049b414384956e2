#!/usr/bin/env bash
# The device runner: the GPU work behind the results files, one stage per call of the lent H200 (10 minutes each).
# Run from the repository root on the device; every stage writes what it made into $OUT (files come back from the
# device two folders deep at most) and prints its last lines.
#
#   OUT=$OUT bash benchmarks/device.sh tests             # every GPU test (pytest -m gpu); fa4 tests need flash-attn-4
#   OUT=$OUT bash benchmarks/device.sh layer             # one hybrid layer, flex (and fa4 when installed) against dense
#                                                        # SDPA (cuDNN and flash, the faster kept): layer_flex.json
#   OUT=$OUT bash benchmarks/device.sh real-train        # routers for the real model: configs/qwen2.5_coder_code.yaml
#   OUT=$OUT bash benchmarks/device.sh real-eval 8k,16k  # the real model's table at these lengths, $SAMPLES per cell
#   ROUTER=path MODES=full,elastic BATCH=8 OUT=$OUT bash benchmarks/device.sh real-eval 32k   # another router, fewer modes
#
# The real-model stages need the model at $MODEL: `../shared/tools/real-model-parts` stages it (its header says how;
# its last call, `bash .rmNN/install.sh`, can precede any stage in the same call). FlashAttention-4 comes from
# `../shared/tools/fa4-wheels` (two calls; then export the PYTHONPATH its header names).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
MODEL=${MODEL:-/tmp/qwen2.5-coder-0.5b-instruct}
RUN=${RUN:-/tmp/qwen_code}
ROUTER=${ROUTER:-$RUN/router}
SAMPLES=${SAMPLES:-50}
cli="python3 -m elastic_attention.cli"
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
case ${1:-} in
  tests)
    timeout ${TEST_LIMIT:-560} python3 -m pytest -q -m gpu tests > "$OUT/gpu_tests.log" 2>&1
    echo "tests rc $? at $(( $(date +%s) - start )) s"
    tail -8 "$OUT/gpu_tests.log" ;;
  layer)
    backends=flex
    python3 -c "from elastic_attention.backends.fa4 import fa4_available as a; raise SystemExit(not a()[0])" \
      && backends=flex,fa4
    timeout ${LAYER_LIMIT:-400} $cli bench layer --lengths ${LENGTHS:-32k,128k} --msr ${MSR:-0.25,0.5,0.75} \
      --backends $backends --repeats 10 --out "$OUT/layer_flex.json" > "$OUT/layer.log" 2>&1
    echo "layer rc $? at $(( $(date +%s) - start )) s (backends $backends)"
    tail -3 "$OUT/layer.log" | cut -c1-400 ;;
  real-train)
    timeout ${TRAIN_LIMIT:-530} $cli train configs/qwen2.5_coder_code.yaml model="$MODEL" output_dir="$RUN" \
      --no-progress > "$OUT/train.log" 2>&1
    echo "train rc $? at $(( $(date +%s) - start )) s"
    mkdir -p "$OUT/router"
    cp "$RUN"/summary.json "$RUN"/metrics.csv "$RUN"/training.png "$OUT/" 2>/dev/null
    cp "$RUN"/router/* "$OUT/router/" 2>/dev/null
    tail -3 "$OUT/train.log" ;;
  real-eval)
    lengths=${2:?give the lengths, e.g. 8k,16k}
    name=eval_${lengths//,/_}
    timeout ${EVAL_LIMIT:-560} $cli eval --model "$MODEL" --router "$ROUTER" --suite code --tasks all \
      --modes ${MODES:-full,elastic,static,static@0.7,sparse} --lengths "$lengths" --samples "$SAMPLES" \
      --batch-size ${BATCH:-16} --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    echo "eval rc $? at $(( $(date +%s) - start )) s"
    tr '\r' '\n' < "$OUT/$name.log" | tail -30 ;;
  *)
    echo "unknown stage '${1:-}': tests, layer, real-train or real-eval LENGTHS"; exit 2 ;;
esac
