#!/usr/bin/env bash
# Does elastic attention hold on a real pretrained model? Routers for Qwen2.5-Coder-0.5B-Instruct trained on the code
# suite, then the paper's main table (full, elastic, static at elastic's MSR and at 0.7, all sparse) on every task.
# Runs on the lent H200 (issue 18), after `../shared/tools/real-model-parts` has put the model at $MODEL:
#   OUT=$OUT bash benchmarks/real_model.sh train          # configs/qwen2.5_coder_code.yaml -> $RUN (router, logs)
#   OUT=$OUT bash benchmarks/real_model.sh eval 8k,16k    # the table at these lengths, $SAMPLES rows per cell
#   ROUTER=path MODES=full,elastic OUT=$OUT bash benchmarks/real_model.sh eval 32k   # another router, fewer modes
# Each stage copies what it made into $OUT (files come back from the device two folders deep at most).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
MODEL=${MODEL:-/tmp/qwen2.5-coder-0.5b-instruct}
RUN=${RUN:-/tmp/qwen_code}
ROUTER=${ROUTER:-$RUN/router}
SAMPLES=${SAMPLES:-50}
cli="python3 -m elastic_attention.cli"
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
case ${1:-train} in
  train)
    timeout ${TRAIN_LIMIT:-420} $cli train configs/qwen2.5_coder_code.yaml model="$MODEL" output_dir="$RUN" \
      --no-progress > "$OUT/train.log" 2>&1
    echo "train rc $? at $(( $(date +%s) - start )) s"
    mkdir -p "$OUT/router"
    cp "$RUN"/summary.json "$RUN"/metrics.csv "$RUN"/training.png "$OUT/" 2>/dev/null
    cp "$RUN"/router/* "$OUT/router/" 2>/dev/null
    tail -3 "$OUT/train.log" ;;
  eval)
    lengths=${2:?give the lengths, e.g. 8k,16k}
    name=eval_${lengths//,/_}
    timeout ${EVAL_LIMIT:-560} $cli eval --model "$MODEL" --router "$ROUTER" --suite code --tasks all \
      --modes ${MODES:-full,elastic,static,static@0.7,sparse} --lengths "$lengths" --samples "$SAMPLES" \
      --batch-size ${BATCH:-16} --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    echo "eval rc $? at $(( $(date +%s) - start )) s"
    tail -40 "$OUT/$name.log" ;;
  *)
    echo "unknown stage ${1}: train or eval LENGTHS"; exit 2 ;;
esac
