#!/usr/bin/env bash
# Fifth device session (2026-11-30), nvidia-h200-x2, after `bash .fa4a/stage.sh` (carry .fa4a); carry .fa4b:
#   OUT=$OUT bash scripts/device_session5.sh
# GPU 1: two tiny pretraining runs with dense local blocks (scripts/device_recipe.sh local, issue 3).
# GPU 0: the GPU tests (backends and the bounded cache, issues 5 and 6), then `bench layer` with the pipelined timing
# (issue 5, item 4a) at 32K and 128K.
set -u
export PYTHONUNBUFFERED=1
start=$(date +%s)
[ -d /tmp/fa4site ] || bash .fa4b/install.sh
R=/tmp/session5; mkdir -p "$R"
OUT=$OUT bash scripts/device_recipe.sh local > "$R/recipe.log" 2>&1 &
export PYTHONPATH=$PWD/src:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages CUDA_VISIBLE_DEVICES=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/gpu.txt"
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_backends.py tests/test_gpu_cache.py \
  > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - start )) s"
timeout 200 python3 -m elastic_attention.cli bench layer --lengths 32k,128k --msr 0.5,0.75,1.0 --backends fa4 \
  --out "$R/layer_fa-ssa.json" > "$R/layer.log" 2>&1
echo "layer rc $? at $(( $(date +%s) - start )) s"
wait
echo "all done at $(( $(date +%s) - start )) s"
tar -C /tmp -czf "$OUT/session5.tgz" session5
ls -la "$OUT"
