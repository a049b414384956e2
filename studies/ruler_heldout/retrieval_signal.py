"""Per row, two candidate router inputs: the retrieval signal (under full attention, the attention mass that the
prompt's last queries put on keys that streaming attention would not show them) and the shipped head-set router's
choice probabilities.

    python studies/ruler_heldout/retrieval_signal.py --model /tmp/qwen2.5-coder-1.5b-instruct \
        --router src/elastic_attention/assets/routers/qwen2.5-coder-1.5b-instruct \
        --cells cells/ruler cells/broad --samples 20 --out signal.jsonl

The signal of layer l and KV head h: the mean, over the last ``--last`` prompt queries and the query heads of h's
group, of the softmax mass on key blocks outside SSA's view of that query's block (sink blocks and the local window of
blocks, the block rule the kernels use). Measured on the plain model through a registered attention function (SDPA
for the output), one row at a time (no padding), prefill only. One JSON line per row: task, length, kind, the
signal [layers][KV heads], the router's probabilities over its sets and the sets' MSRs.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def outside_window_mass(query: torch.Tensor, key: torch.Tensor, scale: float, last: int, block: int,
                        sink_blocks: int, local_blocks: int) -> torch.Tensor:
    """[Hkv] float32: mean softmax mass of the last ``last`` queries on the key blocks SSA hides from them (the
    library's `router.retrieval_signal.retrieval_signal` of one unpadded sequence).

    Args:
        query: [Hq, S, D] one sequence's queries (after RoPE).
        key: [Hkv, S, D] its keys (after RoPE).
        scale: the softmax scale.
        last: how many trailing queries.
        block, sink_blocks, local_blocks: SSA's block size, sink and window in blocks.
    """
    from elastic_attention.patterns import SequenceLayout
    from elastic_attention.router.retrieval_signal import retrieval_signal

    layout = SequenceLayout.dense(1, key.shape[1])
    return retrieval_signal(query[None], key[None], layout, scale, queries=last, block_size=block,
                            sink_tokens=sink_blocks * block, local_tokens=local_blocks * block)[0]


def install_signal_attention(model, store: dict, last: int, block: int, sink: int, local: int) -> None:
    """Register an SDPA attention function that also writes each layer's `outside_window_mass` of a prefill into
    ``store`` (layer index -> [Hkv]), and select it on ``model``."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if query.shape[0] == 1 and query.shape[2] == key.shape[2] > 1:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            store[module.layer_idx] = outside_window_mass(query[0], key[0], scale, last, block, sink // block,
                                                          local // block).cpu()
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)

    AttentionInterface.register("retrieval_signal", attention)
    model.set_attn_implementation("retrieval_signal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--router", required=True, help="a head-set router adapter (its choice is recorded)")
    parser.add_argument("--cells", nargs="+", required=True, help="folders of row cells (elastic-attention rows)")
    parser.add_argument("--samples", type=int, default=20, help="rows read from each cell")
    parser.add_argument("--seed", type=int, default=0, help="the cells' seed")
    parser.add_argument("--last", type=int, default=64, help="trailing prompt queries measured")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import elastic_attention as ea
    from elastic_attention.evaluation.row_cells import read_cells
    from elastic_attention.evaluation.suites import suite_of
    from elastic_attention.integration import routers_of, runtime_of
    from elastic_attention.integration.routing import read_router_input
    from elastic_attention.rows import encode_row

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    plain = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    routed = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    ea.load_router(routed, args.router)
    (router,) = routers_of(routed).values()
    config = runtime_of(routed).config  # the router's own SSA window
    sink, local, block = config.sink_tokens, config.local_tokens, config.block_size
    store: dict[int, torch.Tensor] = {}
    install_signal_attention(plain, store, args.last, block, sink, local)
    set_msrs = router.set_msrs().tolist()
    started = time.time()
    with open(args.out, "w") as out:
        for folder in args.cells:
            for task, length, rows in read_cells(folder, seed=args.seed, samples=args.samples, tokenizer=tokenizer):
                kind = suite_of(task).kind(task)
                for index, row in enumerate(rows):
                    ids = torch.tensor([encode_row(tokenizer, row).prompt_ids], device=device)
                    store.clear()
                    with torch.no_grad():
                        plain(input_ids=ids, use_cache=False, logits_to_keep=1)
                        pooled = read_router_input(router, lambda: routed(input_ids=ids, use_cache=False,
                                                                          logits_to_keep=1))
                        probabilities = torch.softmax(router.choice_logits(pooled.to(device)).float(), -1)[0]
                    signal = torch.stack([store[layer] for layer in sorted(store)]).tolist()
                    out.write(json.dumps({"task": task, "length": length, "kind": kind,
                                          "index": index, "tokens": ids.shape[1], "signal": signal,
                                          "router_probabilities": probabilities.tolist(),
                                          "router_set_msrs": set_msrs}) + "\n")
                print(f"{task}_{length}: {len(rows)} rows, {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
