#!/usr/bin/env bash
# Issue 7 on nvidia-h200-x2: router training of the small backbone on 1 GPU and with FSDP2 on 2 GPUs (same global
# batch), then router-training steps at the Llama-3.1-8B shape (32K tokens per sample on 2 GPUs; the one-GPU runs are in device_gpu_session.sh,
# gradient checkpointing). Waits first for the background work of scripts/device_gpu_session.sh, if any.
#   OUT=$OUT bash scripts/device_distributed.sh        (carry artifacts/backbone-small)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
[ -d /tmp/fa4site ] && export PYTHONPATH=$PWD/src:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages \
  || export PYTHONPATH=$PWD/src
R=/tmp/results; mkdir -p $R
while [ -d /tmp/work ] && { [ ! -e $R/gpu0.done ] || [ ! -e $R/tiny_v2.done ]; } && \
  [ $(( $(date +%s) - start )) -lt 200 ]; do sleep 5; done
echo "background work finished or waited out at $(( $(date +%s) - start )) s"
run() { timeout "$1" "${@:2}"; echo "rc $? for ${*:2:6} at $(( $(date +%s) - start )) s"; }
T="python3 -m torch.distributed.run --standalone"
run 120 $T --nproc_per_node 1 -m elastic_attention.cli train scripts/small_fsdp.yaml output_dir=/tmp/r1 --no-progress \
  > $R/small_1gpu.log 2>&1
run 120 $T --nproc_per_node 2 -m elastic_attention.cli train scripts/small_fsdp.yaml output_dir=/tmp/r2 \
  distributed=fsdp --no-progress > $R/small_2gpu.log 2>&1
python3 scripts/compare_routers.py /tmp/r1 /tmp/r2 --out $R/small_fsdp_comparison.json
cp /tmp/r2/training.png $R/small_fsdp_training.png 2>/dev/null
B="-m elastic_attention.cli bench train-step --gradient-checkpointing"
run 100 $T --nproc_per_node 2 $B --length 32k --out $R/train8b_32k_2gpu.json > $R/train8b_32k_2gpu.log 2>&1
tar -C /tmp -czf $OUT/results_b.tgz results
ls $R
