#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (issue 5 checks and benchmarks, plus a tiny-backbone recipe variant of issue 3),
# after `bash .fa4a/stage.sh` in the call before (flash-attn-4 install, see ../shared/tools/fa4-wheels):
#   OUT=$OUT bash scripts/device_gpu_session.sh
# GPU 0: GPU tests, the layer benchmark, then (in the background, collected by scripts/device_distributed.sh) the
# end-to-end prefill benchmark. GPU 1: the backbone variant, in the background. Results land in /tmp/results.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
bash .fa4b/install.sh || exit 1
export PYTHONPATH=$PWD/src:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
R=/tmp/results; mkdir -p $R /tmp/work
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
CUDA_VISIBLE_DEVICES=1 setsid nohup bash -c "python3 scripts/pretrain_backbone.py --preset tiny --max-len 2048 \
  --out /tmp/work/tiny-v2 --max-seconds 240 --eval-samples 16 --num-workers 8 --dense-repeat-rate 0.05 \
  --length-warmup-steps 1200 > $R/tiny_v2.log 2>&1; python3 -m elastic_attention.cli eval --model /tmp/work/tiny-v2 \
  --modes full,sparse --tasks all --lengths 2048 --samples 16 --batch-size 16 --out $R/tiny_v2_eval \
  > $R/tiny_v2_eval.log 2>&1; touch $R/tiny_v2.done" > /dev/null 2>&1 &
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/test_gpu_backends.py \
  > $R/gpu_tests.log 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - start )) s"
tail -3 $R/gpu_tests.log
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m elastic_attention.cli bench layer --lengths 8k,32k,128k \
  --out $R/layer_fa-ssa.json > $R/layer.log 2>&1
echo "layer bench rc $? at $(( $(date +%s) - start )) s"
CUDA_VISIBLE_DEVICES=0 setsid nohup bash -c "python3 -m elastic_attention.cli bench prefill --lengths 8k,32k,128k \
  --out $R/prefill.json > $R/prefill.log 2>&1; python3 -m elastic_attention.cli bench layer --lengths 32k,128k \
  --msr 0.5,0.75 --configuration fa-xa --backends fa4 --out $R/layer_fa-xa.json > $R/layer_xa.log 2>&1; \
  touch $R/gpu0.done" > /dev/null 2>&1 &
while [ $(( $(date +%s) - start )) -lt 540 ] && [ ! -e $R/gpu0.done ]; do sleep 5; done
tar -C /tmp -czf $OUT/results_a.tgz results
echo "collected at $(( $(date +%s) - start )) s"; ls $R
