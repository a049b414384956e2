#!/usr/bin/env bash
# Router findings on the shipped tiny backbone, CPU: do routers trained with configs/tiny_finding.yaml meet the paper's
# comparison (full, elastic, static hybrid at elastic's average MSR, all sparse) on the same rows at the training length and twice it?
#   bash studies/synthetic_routers/finding_tiny.sh OUT_DIR [key=value overrides for the training config]
# The evaluation's tasks: TASKS (default: the config's, needle_multivalue,variable_tracking,local_recall,local_pattern).
set -eu
out=${1:?usage: bash studies/synthetic_routers/finding_tiny.sh OUT_DIR [overrides]}; shift
cli="python -m elastic_attention.cli"
export PYTHONPATH=${PYTHONPATH:-src}
$cli train configs/tiny_finding.yaml output_dir="$out/train" "$@" --no-progress
$cli eval --model src/elastic_attention/assets/backbone_tiny --router "$out/train/router" \
  --modes full,elastic,static,sparse --tasks "${TASKS:-needle_multivalue,variable_tracking,local_recall,local_pattern}" \
  --lengths 1024,2048 \
  --samples 12 --batch-size 12 --device cpu --out "$out/eval"
