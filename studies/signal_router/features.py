"""Per row, the retrieval signal of every layer and KV head, for a few query counts, with the model running a fixed
head set (the floor set whose heads a signal router's layers before its decision layer run), or every head on SSA
(--all-ssa: what a decision read after an all-SSA prefix would see).

    python studies/signal_router/features.py --model MODEL --head-set FILE --msr 0.5 \
        --cells CELLS/broad CELLS/code_val --seed 777 --samples 12 --queries 1,16,64 --out features.jsonl

The signal is the library's `router.retrieval_signal.retrieval_signal` (what a `SignalSetRouter` reads), computed
from each layer's queries and keys as the attached model attends them (the head set forced on every layer, SSA with
the shipped pattern), one row at a time, prefill only: the signal of layer L is then what a signal router deciding at
L reads when the set runs on the layers before L. One JSON line per row: task, length, kind, index, tokens, the
query counts and statistics measured, and ``signal[statistic][queries][layer][KV head]``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

#: The SSA pattern the shipped 1.5B adapter runs (block 128, sink 128, window 1024 tokens).
BLOCK, SINK, LOCAL = 128, 128, 1024
STATISTICS = ("mean", "max")


def install_capture(model, store: dict, query_counts: list[int]) -> None:
    """Wrap the attached model's attention so that each prefill writes every layer's signal per statistic and query
    count into ``store`` (layer -> [statistics, len(query_counts), Hkv])."""
    from elastic_attention.integration import runtime_of
    from elastic_attention.router.retrieval_signal import retrieval_signal

    runtime = runtime_of(model)
    attend = runtime.attention

    def attention(module, query, key, value, scaling, sinks=None):
        layout = runtime.layout
        if layout is not None and layout.is_prefill:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            store[module.layer_idx] = torch.stack([torch.stack([
                retrieval_signal(query, key, layout, scale, queries=count, block_size=BLOCK, sink_tokens=SINK,
                                 local_tokens=LOCAL, statistic=statistic)[0] for count in query_counts])
                for statistic in STATISTICS]).cpu()
        return attend(module, query, key, value, scaling, sinks)

    runtime.attention = attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--cells", nargs="+", required=True, help="folders of row cells (elastic-attention rows)")
    parser.add_argument("--samples", type=int, required=True, help="rows read from each cell")
    parser.add_argument("--seed", type=int, required=True, help="the cells' seed")
    parser.add_argument("--queries", default="1,16,64", help="comma list of trailing query counts")
    parser.add_argument("--head-set", help="a head-set file (search-heads); its set at --msr runs")
    parser.add_argument("--msr", type=float, default=0.5)
    parser.add_argument("--all-ssa", action="store_true", help="every head on SSA instead of a head set (the signal a "
                                                                "decision after an all-SSA prefix would read)")
    parser.add_argument("--lengths", help="comma list of the cell lengths read (tokens); default: every cell")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.all_ssa == bool(args.head_set):
        parser.error("give either --head-set (its set at --msr runs) or --all-ssa")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import elastic_attention as ea
    from elastic_attention.evaluation.row_cells import read_cells
    from elastic_attention.head_sets import read_head_sets
    from elastic_attention.evaluation.suites import suite_of
    from elastic_attention.rows import encode_row

    counts = [int(value) for value in args.queries.split(",")]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    ea.attach(model, ea.ElasticConfig(block_size=BLOCK, sink_tokens=SINK, local_tokens=LOCAL))
    ea.force_routing(model, "sparse" if args.all_ssa else read_head_sets(args.head_set).at(args.msr))
    store: dict[int, torch.Tensor] = {}
    install_capture(model, store, counts)
    started = time.time()
    with open(args.out, "w") as out:
        for folder in args.cells:
            for task, length, rows in read_cells(folder, seed=args.seed, samples=args.samples, tokenizer=tokenizer):
                if args.lengths and length not in {int(value) for value in args.lengths.split(",")}:
                    continue
                kind = suite_of(task).kind(task)
                for index, row in enumerate(rows):
                    ids = torch.tensor([encode_row(tokenizer, row).prompt_ids], device=device)
                    store.clear()
                    with torch.no_grad():
                        model(input_ids=ids, use_cache=False, logits_to_keep=1)
                    # [statistics, counts, layers, Hkv]
                    signal = torch.stack([store[layer] for layer in sorted(store)], dim=2)
                    out.write(json.dumps({"task": task, "length": length, "kind": kind,
                                          "index": index, "tokens": ids.shape[1], "queries": counts,
                                          "statistics": list(STATISTICS),
                                          "signal": signal.tolist()}) + "\n")
                print(f"{task}_{length}: {len(rows)} rows, {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
