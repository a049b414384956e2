#!/usr/bin/env bash
# Fifth device session (2026-11-30), nvidia-h200-x2, calls made back to back:
#   1. carry .fa4a: bash .fa4a/stage.sh
#   2. carry .fa4b: OUT=$OUT bash scripts/device_session5.sh tests
#      GPU 1: two tiny pretraining runs with dense local blocks (scripts/device_recipe.sh local, issue 3).
#      GPU 0: the GPU tests (backends and the bounded cache, issues 5 and 6), then `bench layer` with the pipelined
#      timing (issue 5, item 4a) at 32K and 128K.
#   3. carry artifacts/backbone-small: OUT=$OUT bash scripts/device_session5.sh scaling
#      Issue 7: small-backbone router training with packs of 32768 tokens (four times the earlier runs') on one GPU
#      with the other idle, then FSDP2 on two GPUs (reshard after forward on, then off); routers compared.
#   4. OUT=$OUT bash scripts/device_session5.sh local2   (issue 3: scripts/device_recipe.sh local2, four runs)
#   5. OUT=$OUT bash scripts/device_session5.sh local3   (issue 3: scripts/device_recipe.sh local3, two runs)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
R=/tmp/session5; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/gpu.txt"
MODE=${1:-tests}
if [ "$MODE" = tests ]; then
  [ -d /tmp/fa4site ] || bash .fa4b/install.sh
  OUT=$OUT bash scripts/device_recipe.sh local > "$R/recipe.log" 2>&1 &
  export PYTHONPATH=$PWD/src:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_backends.py tests/test_gpu_cache.py \
    > "$R/gpu_tests.log" 2>&1
  echo "gpu tests rc $? at $(( $(date +%s) - start )) s"
  timeout 200 python3 -m elastic_attention.cli bench layer --lengths 32k,128k --msr 0.5,0.75,1.0 --backends fa4 \
    --out "$R/layer_fa-ssa.json" > "$R/layer.log" 2>&1
  echo "layer rc $? at $(( $(date +%s) - start )) s"
  wait
  tar -C /tmp -czf "$OUT/session5.tgz" session5
elif [ "$MODE" = scaling ]; then
  export PYTHONPATH=$PWD/src
  T="python3 -m torch.distributed.run --standalone"
  C="-m elastic_attention.cli train scripts/small_fsdp.yaml steps=20 data.budget=32768 model=artifacts/backbone-small"
  CUDA_VISIBLE_DEVICES=0 timeout 170 $T --nproc_per_node 1 $C output_dir=/tmp/p1 --no-progress > "$R/p1_one_gpu.log" 2>&1
  echo "one gpu rc $? at $(( $(date +%s) - start )) s"
  timeout 120 $T --nproc_per_node 2 $C output_dir=/tmp/p2 distributed=fsdp --no-progress > "$R/p2_fsdp.log" 2>&1
  echo "fsdp rc $? at $(( $(date +%s) - start )) s"
  timeout 120 $T --nproc_per_node 2 $C output_dir=/tmp/p3 distributed=fsdp fsdp_reshard_after_forward=false \
    --no-progress > "$R/p3_fsdp_keep.log" 2>&1
  echo "fsdp keep rc $? at $(( $(date +%s) - start )) s"
  for other in p2 p3; do python3 scripts/compare_routers.py /tmp/p1 /tmp/$other --out "$R/compare_p1_$other.json"; done
  for run in p1 p2 p3; do cp /tmp/$run/summary.json "$R/summary_$run.json" 2>/dev/null; done
  tar -C /tmp -czf "$OUT/scaling.tgz" session5
elif [ "$MODE" = local2 ] || [ "$MODE" = local3 ]; then
  OUT=$OUT bash scripts/device_recipe.sh "$MODE"
else
  echo "unknown mode $MODE (tests, scaling, local2 or local3)" >&2; exit 2
fi
echo "done at $(( $(date +%s) - start )) s"
ls -la "$OUT"
