#!/usr/bin/env bash
# One device call on nvidia-h200-x2 for issue 5 (and the one-GPU half of issue 7's 8B runs), after
# `bash .fa4a/stage.sh` in the call before when the machine is fresh (flash-attn-4, see ../shared/tools/fa4-wheels):
#   OUT=$OUT bash scripts/device_gpu_session.sh          (carry .fa4b)
# GPU 0: GPU tests, the layer benchmark, the end-to-end prefill benchmark. GPU 1: router-training steps at the 8B
# shape on one GPU (32K and 64K tokens, gradient checkpointing). Results land in /tmp/results, packed into $OUT.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
[ -d /tmp/fa4site ] || bash .fa4b/install.sh
export PYTHONPATH=$PWD/src:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
R=/tmp/results; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
left() { echo $(( $1 - ($(date +%s) - start) )); }
B="-m elastic_attention.cli bench train-step --gradient-checkpointing"
( export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 $B --length 32k --out $R/train8b_32k_1gpu.json > $R/train8b_32k_1gpu.log 2>&1
  timeout 200 python3 $B --length 64k --steps 2 --out $R/train8b_64k_1gpu.json > $R/train8b_64k_1gpu.log 2>&1 ) &
export CUDA_VISIBLE_DEVICES=0
timeout 240 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/test_gpu_backends.py > $R/gpu_tests.log 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - start )) s"; tail -3 $R/gpu_tests.log
timeout 130 python3 -m elastic_attention.cli bench layer --lengths 8k,32k,128k --out $R/layer_fa-ssa.json \
  > $R/layer.log 2>&1
echo "layer bench rc $? at $(( $(date +%s) - start )) s"; tail -2 $R/layer.log
timeout $(left 560) python3 -m elastic_attention.cli bench prefill --lengths 8k,32k,128k --configurations fa-ssa,xa-ssa \
  --repeats 2 --out $R/prefill.json > $R/prefill.log 2>&1
echo "prefill bench rc $? at $(( $(date +%s) - start )) s"; tail -3 $R/prefill.log
wait
tar -C /tmp -czf $OUT/results_b.tgz results
ls $R
