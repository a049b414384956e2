#!/usr/bin/env bash
# The GPU part of this study, on the device, once the real model is at $MODEL (benchmarks/device.sh real-model):
#
#   OUT=$OUT bash studies/ruler_heldout/device_job.sh start   # three background jobs (they outlive the call)
#   OUT=$OUT LIMIT=500 bash studies/ruler_heldout/device_job.sh wait   # until they finish or LIMIT s pass; what
#                                                                       # they wrote so far comes back in $OUT
#
# The rows travel as row cells (`elastic-attention rows`, written on a CPU with the model's tokenizer), packed in
# $CELLS (a .tgz, carried): ruler/ (lm-eval 0.4.13's RULER generators, seed 0), code/ (the code suite, seed 0),
# broad/ (the broad suite's validation rows, seed $BROAD_SEED). The jobs, side by side on the GPU:
#   ruler_eval   the held-out RULER cells: full, the shipped router (elastic), all-SSA, the joint searched set at
#                elastic's MSR (heads) and at MSR 0.5 (heads@0.5); $SAMPLES rows a cell
#   broad_eval   the broad suite's validation cells: full, all-SSA, heads@0.5 (each family's kind and need)
#   signal       per row of every cell: the retrieval signal and the shipped router's set probabilities
set -uo pipefail
MODEL=${MODEL:-/tmp/qwen2.5-coder-1.5b-instruct}
ROUTER=${ROUTER:-src/elastic_attention/assets/routers/qwen2.5-coder-1.5b-instruct}
HEAD_SET=${HEAD_SET:-benchmarks/results/real_model_1.5b_head_set_search_2026-12-03.json}
CELLS=${CELLS:-.cellpack/cells.tgz}
RUN=${RUN:-/tmp/ruler_heldout}
SAMPLES=${SAMPLES:-20}
BROAD_SAMPLES=${BROAD_SAMPLES:-12}
BROAD_SEED=${BROAD_SEED:-777}
LIMIT=${LIMIT:-540}
OUT=${OUT:?set OUT}
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
case "${1:-}" in
  start)
    [ -f "$MODEL/config.json" ] || { echo "no model at $MODEL"; exit 3; }
    rm -rf "$RUN" && mkdir -p "$RUN/cells" && cp -r src studies "$HEAD_SET" "$RUN/"
    cp -r "$ROUTER" "$RUN/router"
    tar xzf "$CELLS" -C "$RUN/cells"
    cd "$RUN"
    cells=$RUN/cells heads=$RUN/$(basename "$HEAD_SET")
    cli="python3 -m elastic_attention.cli"
    PYTHONPATH=$RUN/src setsid nohup bash -c "$cli eval --model $MODEL --router $RUN/router --suite ruler \
      --tasks all --lengths 8k,16k --samples $SAMPLES --rows $cells/ruler --modes full,elastic,sparse,heads,heads@0.5 \
      --head-set $heads --out ruler_eval > ruler_eval.log 2>&1; echo \$? > ruler_eval.rc" > /dev/null 2>&1 &
    PYTHONPATH=$RUN/src setsid nohup bash -c "$cli eval --model $MODEL --suite broad --tasks all --lengths 8k,16k \
      --samples $BROAD_SAMPLES --seed $BROAD_SEED --rows $cells/broad --modes full,sparse,heads@0.5 --head-set $heads \
      --router $RUN/router --out broad_eval > broad_eval.log 2>&1; echo \$? > broad_eval.rc" \
      > /dev/null 2>&1 &
    PYTHONPATH=$RUN/src setsid nohup bash -c "python3 studies/ruler_heldout/retrieval_signal.py --model $MODEL \
      --router $RUN/router --cells $cells/ruler $cells/code --samples $SAMPLES --out signal.jsonl > signal.log 2>&1; \
      python3 studies/ruler_heldout/retrieval_signal.py --model $MODEL --router $RUN/router --cells $cells/broad \
      --samples $BROAD_SAMPLES --seed $BROAD_SEED --out signal_broad.jsonl >> signal.log 2>&1; echo \$? > signal.rc" \
      > /dev/null 2>&1 &
    sleep 20
    tail -n 2 "$RUN"/*.log | cut -c1-300 ;;
  wait)
    start=$(date +%s)
    while [ $(( $(date +%s) - start )) -lt "$LIMIT" ]; do
      [ -f "$RUN/ruler_eval.rc" ] && [ -f "$RUN/broad_eval.rc" ] && [ -f "$RUN/signal.rc" ] && break
      sleep 10
    done
    cd "$RUN"
    for job in ruler_eval broad_eval signal; do
      echo "$job: rc $(cat $job.rc 2>/dev/null || echo running)"; tr '\r' '\n' < $job.log | grep -v '^$' | tail -2 | cut -c1-300
    done
    tar czf "$OUT/ruler_heldout.tgz" ruler_eval broad_eval signal*.jsonl *.log 2>/dev/null
    ls -la "$OUT"
    [ -f ruler_eval.rc ] && [ -f broad_eval.rc ] && [ -f signal.rc ] && echo finished ;;
  *)
    echo "usage: OUT=... bash studies/ruler_heldout/device_job.sh start|wait"; exit 2 ;;
esac
