#!/usr/bin/env bash
# Ninth device session (2026-11-30):
#   1. carry .fa4a: bash .fa4a/stage.sh
#   2. carry .fa4b: OUT=$OUT bash scripts/device_session9.sh prefill   (every GPU test with flash-attn-4 installed, on
#      the eighth session's final code; issue 5 item 4b at 128K: SDPA, dense FA4, FA-SSA and XA-SSA at MSR 0.7)
#   3. OUT=$OUT bash scripts/device_session9.sh prefill256   (the same model at 256K tokens, same machine)
#   4. carry artifacts/backbone-small: OUT=$OUT bash scripts/device_session9.sh temperature   (issue 4 item 7: the
#      eighth session's finding2 training with the paper's exponential temperature decay, with the fixed trainer)
#   5. OUT=$OUT bash scripts/device_session9.sh xa   (issue 5, the XA estimate: its GPU tests, then its timing at 32K
#      and 128K. Run on an uncommitted first form of a one-pass Triton estimate (one head per program), then at commit
#      85a864e (its final form and a sweep of its launch settings; removed after: not faster), then on the torch
#      estimate with bf16 products into float32 results)
#   6. carry .fa4a: bash .fa4a/stage.sh; then carry .fa4b: OUT=$OUT bash scripts/device_session9.sh xa_prefill
#      (end-to-end prefill with XA heads: XA-SSA and FA-SSA against dense FA4 at 32K and 128K)
#   7. OUT=$OUT bash scripts/device_session9.sh decode   (issue 6: the decode step in one launch per layer (the merge of
#      the key splits done by the last split to finish, the new entries written by the same launch): the GPU cache
#      tests, then bench decode at 128K, batch 1 and 8, fused bounded cache against the dense model)
#   8. OUT=$OUT bash scripts/device_session9.sh final   (the GPU tests of the cache and the XA estimate on the final code)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
cli="python3 -m elastic_attention.cli"
with_fa4() {
  [ -d /tmp/fa4site ] || bash .fa4b/install.sh > "$OUT/fa4_install.log" 2>&1
  export PYTHONPATH=$PWD/src:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
}
case ${1:-prefill} in
  prefill)
    with_fa4
    timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > "$OUT/gpu_tests.log" 2>&1
    echo "gpu tests rc $? at $(( $(date +%s) - start )) s"
    timeout 300 $cli bench prefill --lengths 128k --modes sdpa,fa4_dense --configurations fa-ssa,xa-ssa --repeats 2 \
      --out "$OUT/prefill_128k.json" > "$OUT/prefill_128k.log" 2>&1
    echo "prefill rc $?" ;;
  prefill256)
    with_fa4
    timeout 560 $cli bench prefill --lengths 256k --modes sdpa,fa4_dense --configurations fa-ssa --repeats 2 \
      --out "$OUT/prefill_256k.json" > "$OUT/prefill_256k.log" 2>&1
    echo "prefill rc $?" ;;
  temperature)
    timeout 220 $cli train scripts/small_finding.yaml output_dir=/tmp/std_t5_exp elastic.router_standardize=true \
      targets.needle_multikey=0.5 targets.variable_tracking=0.5 temperature.kind=exponential --no-progress \
      > "$OUT/std_t5_exp_train.log" 2>&1
    echo "train rc $? at $(( $(date +%s) - start )) s"
    cp /tmp/std_t5_exp/summary.json "$OUT/std_t5_exp_summary.json"
    timeout 80 $cli eval --model artifacts/backbone-small --router /tmp/std_t5_exp/router \
      --modes full,elastic,static,sparse --tasks needle_multikey,variable_tracking,local_recall \
      --lengths 4096,8192 --samples 24 --batch-size 24 --out "$OUT/std_t5_exp_eval" > "$OUT/std_t5_exp_eval.log" 2>&1
    echo "eval rc $?" ;;
  xa)
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_backends.py -k "xa" \
      > "$OUT/gpu_tests.log" 2>&1
    echo "gpu tests rc $? at $(( $(date +%s) - start )) s"
    timeout 300 python3 scripts/xa_estimate_timing.py --lengths 32768,131072 --out "$OUT/xa_estimate.json" \
      > "$OUT/xa_estimate.log" 2>&1
    echo "timing rc $?" ;;
  xa_prefill)
    with_fa4
    timeout 400 $cli bench prefill --lengths 32k,128k --modes fa4_dense --configurations xa-ssa,fa-ssa --repeats 2 \
      --out "$OUT/prefill_xa.json" > "$OUT/prefill_xa.log" 2>&1
    echo "prefill rc $?" ;;
  decode)
    timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_cache.py > "$OUT/gpu_cache_tests.log" 2>&1
    echo "tests rc $? at $(( $(date +%s) - start )) s"
    timeout 200 $cli bench decode --lengths 128k --batch 1,8 --caches bounded,dense --backend flex --steps 20 \
      --out "$OUT/decode_8b.json" > "$OUT/decode_8b.log" 2>&1
    echo "bench rc $?" ;;
  final)
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_cache.py tests/test_gpu_backends.py \
      -k "cache or xa" > "$OUT/gpu_tests.log" 2>&1
    echo "tests rc $?" ;;
  *) echo "unknown mode $1 (prefill, prefill256, temperature, xa, xa_prefill, decode or final)" >&2; exit 2 ;;
esac
echo "done at $(( $(date +%s) - start )) s"
ls -la "$OUT"
