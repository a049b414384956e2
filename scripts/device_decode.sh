#!/usr/bin/env bash
# Third device session of 2026-11-29 on nvidia-h200-x2, in three calls made back to back:
#   1. carry artifacts/backbone-small:  OUT=$OUT bash scripts/device_decode.sh scaling
#      Issue 7: small-backbone router training (scripts/small_fsdp.yaml, 40 steps) on one GPU with the other GPU
#      idle, then FSDP2 on two GPUs (reshard after forward on, then off), then DDP; routers compared.
#   2. carry .fa4a:                      bash .fa4a/stage.sh
#   3. carry .fa4b:                      OUT=$OUT bash scripts/device_decode.sh decode
#      Issue 6: a profile of decode steps at 128K (8 layers of the 8B shape), then `bench decode` on GPU 0 (8B
#      shape, MSR 0.7; bounded vs full vs dense caches; 32K/128K at batch 1 and 8), prefill with fa4.
#      (An earlier run of this call also ran `bench decode --lengths 256k --batch 1 --steps 5`.)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
export PYTHONPATH=$PWD/src:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
R=/tmp/third; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
if [ "${1:-}" = scaling ]; then
  T="python3 -m torch.distributed.run --standalone"
  C="-m elastic_attention.cli train scripts/small_fsdp.yaml steps=40 model=artifacts/backbone-small"
  CUDA_VISIBLE_DEVICES=0 timeout 150 $T --nproc_per_node 1 $C output_dir=/tmp/s1 --no-progress > $R/s1_one_gpu.log 2>&1
  echo "one gpu rc $? at $(( $(date +%s) - start )) s"
  timeout 120 $T --nproc_per_node 2 $C output_dir=/tmp/s2 distributed=fsdp --no-progress > $R/s2_fsdp.log 2>&1
  echo "fsdp rc $? at $(( $(date +%s) - start )) s"
  timeout 120 $T --nproc_per_node 2 $C output_dir=/tmp/s3 distributed=fsdp fsdp_reshard_after_forward=false \
    --no-progress > $R/s3_fsdp_keep.log 2>&1
  echo "fsdp keep rc $? at $(( $(date +%s) - start )) s"
  timeout 120 $T --nproc_per_node 2 $C output_dir=/tmp/s4 distributed=ddp --no-progress > $R/s4_ddp.log 2>&1
  echo "ddp rc $? at $(( $(date +%s) - start )) s"
  for other in s2 s3 s4; do python3 scripts/compare_routers.py /tmp/s1 /tmp/$other --out $R/compare_s1_$other.json; done
  for run in s1 s2 s3 s4; do cp /tmp/$run/summary.json $R/summary_$run.json 2>/dev/null; done
  tar -C /tmp -czf $OUT/scaling.tgz third
else
  [ -d /tmp/fa4site ] || bash .fa4b/install.sh
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 scripts/profile_decode.py --layers 8 --length 131072 --vocab 32000 --backend fa4 \
    --caches bounded,dense > $R/profile_128k.log 2>&1
  echo "profile rc $? at $(( $(date +%s) - start )) s"
  timeout $(( 420 - ($(date +%s) - start) )) python3 -m elastic_attention.cli bench decode --lengths 32k,128k \
    --batch 1,8 --backend fa4 --steps 20 --out $R/decode_8b.json > $R/decode.log 2>&1
  echo "decode rc $? at $(( $(date +%s) - start )) s"
  tar -C /tmp -czf $OUT/decode.tgz third
fi
ls -la $R
