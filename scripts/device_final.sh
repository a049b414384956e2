#!/usr/bin/env bash
# Second device session of 2026-11-29 on nvidia-h200-x2, in three calls (the carried files of one call must stay
# under 64 MiB, and the flash-attn-4 files and the small backbone together do not):
#   1. carry .fa4a:                      bash .fa4a/stage.sh
#   2. carry artifacts/backbone-small:   bash scripts/device_final.sh train-one-gpu
#   3. carry .fa4b:                      OUT=$OUT bash scripts/device_final.sh
# Call 2 starts, on GPU 1 and in the background, the small-backbone router training on one GPU, twice (run-to-run
# spread). Call 3: GPU 0 runs the layer benchmark (fa4) and the 8B prefill benchmark (FA-SSA against dense FA4) after
# the per-forward pattern builder; then both GPUs run the same training with FSDP2 and with DDP. Results into $OUT.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
export PYTHONPATH=$PWD/src:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
R=/tmp/final; mkdir -p $R
T="python3 -m torch.distributed.run --standalone"
C="-m elastic_attention.cli train scripts/small_fsdp.yaml steps=40 model=/tmp/backbone-small"
if [ "${1:-}" = train-one-gpu ]; then
  cp -r artifacts/backbone-small /tmp/backbone-small
  CUDA_VISIBLE_DEVICES=1 setsid nohup bash -c "for run in r1 r1b; do timeout 150 $T --nproc_per_node 1 $C \
    output_dir=/tmp/\$run --no-progress > $R/small_\$run.log 2>&1; done; touch $R/one_gpu.done" > /dev/null 2>&1 &
  exit 0
fi
[ -d /tmp/fa4site ] || bash .fa4b/install.sh
export CUDA_VISIBLE_DEVICES=0
timeout 100 python3 -m elastic_attention.cli bench layer --lengths 8k,32k,128k --backends fa4 \
  --out $R/layer_fa-ssa.json > $R/layer.log 2>&1
echo "layer rc $? at $(( $(date +%s) - start )) s"
timeout 200 python3 -m elastic_attention.cli bench prefill --lengths 8k,32k,128k --modes fa4_dense \
  --configurations fa-ssa --repeats 2 --out $R/prefill.json > $R/prefill.log 2>&1
echo "prefill rc $? at $(( $(date +%s) - start )) s"
while [ ! -e $R/one_gpu.done ] && [ $(( $(date +%s) - start )) -lt 400 ]; do sleep 3; done
unset CUDA_VISIBLE_DEVICES
timeout 120 $T --nproc_per_node 2 $C output_dir=/tmp/r2 distributed=fsdp --no-progress > $R/small_r2_fsdp.log 2>&1
echo "fsdp rc $? at $(( $(date +%s) - start )) s"
timeout 120 $T --nproc_per_node 2 $C output_dir=/tmp/r3 distributed=ddp --no-progress > $R/small_r3_ddp.log 2>&1
echo "ddp rc $? at $(( $(date +%s) - start )) s"
for pair in "r1 r1b" "r1 r2" "r1 r3"; do set -- $pair
  python3 scripts/compare_routers.py /tmp/$1 /tmp/$2 --out $R/compare_$1_$2.json; done
cp /tmp/r2/training.png $R/small_fsdp_training.png 2>/dev/null
tar -C /tmp -czf $OUT/final.tgz final
ls $R
