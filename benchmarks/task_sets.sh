#!/usr/bin/env bash
# Per-task head sets and a router that chooses among them, end to end on the device (run by `benchmarks/device.sh
# task-sets` in the background; longer than a call). Does a head-set router with a sparser set of its own for some
# sensitive tasks buy more average MSR at the same quality than one choosing among the joint search's sets?
#
#   1. for each TASK=MSR,MSR,... of $SET_MSRS, side by side: `elastic-attention search-heads` on TASK alone at
#      $SEARCH_LENGTH (16k), from $SEARCH_START (FILE@MSR, a point of the joint search), up to the largest MSR
#      listed; then its points heads@MSR on TASK at $SHORT_LENGTH (8k) and $SEARCH_LENGTH ($SAMPLES rows, seed 0);
#   2. studies/static_frontier_1.5b/task_set_config.py: each task's sparsest point keeping $SHARE of full attention (full attention's
#      cells from $FULL) joins $BASE_CONFIG's sets ($CHOICE_MSRS of the joint search) -> config.yaml;
#   3. the router: `elastic-attention train config.yaml $TRAIN_ARGS`;
#   4. its table: elastic at both lengths, then $TABLE_MODES (default static,heads: the retrieval-score static
#      hybrid and the joint searched set) at elastic's average MSR of each length, every task, $SAMPLES rows.
#      (`heads` needs that MSR within the joint search's path.)
# $WORK (default /tmp/task-sets) holds the copy of src, scripts, configs and benchmarks that device.sh makes; relative
# paths ($BASE_CONFIG, $FULL, $SEARCH_START) are read there, and everything lands there; `device.sh task-sets-wait`
# brings it back as task_sets.tgz.
set -u
WORK=${WORK:-/tmp/task-sets}
MODEL=${MODEL:?MODEL: the model folder}
: "${SET_MSRS:?SET_MSRS: TASK=MSR,MSR,... for each task to search, space-separated}"
: "${SEARCH_START:?SEARCH_START: FILE@MSR, the joint search point the searches go on from}"
: "${BASE_CONFIG:?BASE_CONFIG: the training config whose sets the tasks join}"
: "${FULL:?FULL: an eval.json with full attention cells of the same rows}"
SAMPLES=${SAMPLES:-50}
BATCH=${BATCH:-10}
JOINT=${SEARCH_START%@*}
WINDOW_CONFIG=${WINDOW_CONFIG:-configs/qwen2.5_coder_1.5b_code_distill.yaml}  # the sparse window of the searches and set cells
SHORT=${SHORT_LENGTH:-8k} LONG=${SEARCH_LENGTH:-16k}  # the table's lengths; the searches run at the long one
TABLE_MODES=${TABLE_MODES:-static,heads}
cd "$WORK" || exit 1
export PYTHONPATH=$WORK/src PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
eval_cells() {  # eval_cells NAME ARGS...: one elastic-attention eval into $WORK/NAME; says so when it fails
  local name=$1; shift
  python3 -m elastic_attention.cli eval --model "$MODEL" --suite code --samples "$SAMPLES" --batch-size "$BATCH" \
    --out "$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 < /dev/null || { echo "$name failed: see $WORK/$name.log"; return 1; }
}
wait_all() {  # wait_all PID...: every one ended with status 0, else stop here
  local failed=0
  for pid in "$@"; do wait "$pid" || failed=1; done
  [ "$failed" = 0 ] || { echo "stopped: a step above failed"; exit 1; }
}
mean_msr() {  # mean_msr EVAL_JSON: elastic's average MSR over the tasks of that file
  python3 -c "import json,sys; r=[c['msr'] for c in json.load(open(sys.argv[1]))['results'] if c['mode']=='elastic'];\
print(round(sum(r)/len(r), 4))" "$1"
}
echo "stage 1: searches and their points ($(date -u +%T))"
task_sets=() searches=()
for entry in $SET_MSRS; do  # TASK=MSR,MSR,...
  task=${entry%%=*} msrs=${entry#*=}
  modes=$(echo "$msrs" | tr , '\n' | sed 's/^/heads@/' | paste -sd,)
  (
    python3 -m elastic_attention.cli search-heads --model "$MODEL" --config "$WINDOW_CONFIG" --tasks "$task" \
      --length "$LONG" --start "$SEARCH_START" --msr "$msrs" --step "${SEARCH_STEP:-3}" \
      --search-samples "${SEARCH_SAMPLES:-3}" --samples 0 --out "$WORK/search_$task.json" > "$WORK/search_$task.log" 2>&1 \
      || { echo "the search on $task failed: see $WORK/search_$task.log"; exit 1; }
    pids=()
    for length in "$SHORT" "$LONG"; do
      eval_cells "set_${task}_$length" --config "$WINDOW_CONFIG" --tasks "$task" --modes "$modes" --lengths "$length" \
        --head-set "$WORK/search_$task.json" &
      pids+=($!)
    done
    wait_all "${pids[@]}"
  ) &
  searches+=($!)
  task_sets+=(--task-set "$task" "$WORK/search_$task.json" "$WORK/set_${task}_$SHORT/eval.json"
             "$WORK/set_${task}_$LONG/eval.json")
done
wait_all "${searches[@]}"
echo "stage 2: the config ($(date -u +%T))"
python3 studies/static_frontier_1.5b/task_set_config.py --base "$BASE_CONFIG" ${CHOICE_MSRS:+--choice-msrs "$CHOICE_MSRS"} "${task_sets[@]}" \
  --full "$FULL" --share "${SHARE:-0.98}" --out "$WORK/config.yaml" > "$WORK/config.log" 2>&1 \
  || { cat "$WORK/config.log"; exit 1; }
cat "$WORK/config.log"
echo "stage 3: training ($(date -u +%T))"
python3 -m elastic_attention.cli train "$WORK/config.yaml" model="$MODEL" output_dir="$WORK/run" ${TRAIN_ARGS:-} --no-progress \
  > "$WORK/train.log" 2>&1 < /dev/null || { echo "training failed: see $WORK/train.log"; exit 1; }
echo "stage 4: the table ($(date -u +%T))"
pids=()
for length in "$SHORT" "$LONG"; do
  eval_cells "elastic_$length" --router "$WORK/run/router" --tasks all --modes elastic --lengths "$length" &
  pids+=($!)
done
wait_all "${pids[@]}"
pids=()
for length in "$SHORT" "$LONG"; do
  msr=$(mean_msr "$WORK/elastic_$length/eval.json") || exit 1
  heads=()
  case ",$TABLE_MODES," in *,heads,*) heads=(--head-set "$JOINT" --head-set-msr "$msr") ;; esac
  eval_cells "${TABLE_MODES//,/_}_$length" --router "$WORK/run/router" --tasks all --modes "$TABLE_MODES" \
    --lengths "$length" --static-msr "$msr" ${heads[@]+"${heads[@]}"} &
  pids+=($!)
done
wait_all "${pids[@]}"
echo "finished ($(date -u +%T))"
