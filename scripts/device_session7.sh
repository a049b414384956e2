#!/usr/bin/env bash
# Seventh device session (2026-11-30):
#   1. OUT=$OUT bash scripts/device_session7.sh probe   (issue 3: can the backbone shapes learn local_count from
#      scratch, with the suite's question and with the asked colour last? scripts/count_probe.py, eight runs on
#      one GPU in parallel)
#   2. OUT=$OUT bash scripts/device_session7.sh probe list   (the same for the question that asks for the list of
#      the colour's items and then their number)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
start=$(date +%s)
R=/tmp/session7; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/gpu.txt"
MODE=${1:-probe}
if [ "$MODE" = probe ]; then
  for question in ${2:-mid last}; do
    for run in "tiny 0" "tiny 1" "small 0"; do
      set -- $run
      timeout 400 python3 scripts/count_probe.py --question $question --preset $1 --seed $2 --steps 4000 \
        --out "$R/probe_${question}_$1_s$2.json" > "$R/probe_${question}_$1_s$2.log" 2>&1 &
    done
  done
  wait
  tar -C /tmp -czf "$OUT/session7_probe_${2:-mid_last}.tgz" session7
else
  echo "unknown mode $MODE (probe)" >&2; exit 2
fi
echo "done at $(( $(date +%s) - start )) s"
ls -la "$OUT"
