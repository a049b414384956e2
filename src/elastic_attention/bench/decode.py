"""Decode with the bounded cache against the full cache: KV bytes and step latency (issue 6, item 4).

Builds a decoder with random bf16 weights from a config (default: the Llama-3.1-8B shape; nothing is downloaded),
attaches elastic attention with routing forced to ``--msr`` (FA-SSA), and for each length and batch size: prefills a
random prompt once with each cache kind (``bounded``: `ElasticCache`; ``full``: the model's own cache), records the
bytes the cache holds, checks that both caches give the same next-token logits, and times ``--steps`` decode steps.

  elastic-attention bench decode --lengths 32k,128k --batch 1,8 --out benchmarks/results/decode.json
  elastic-attention bench decode --device cpu --layers 2 --hidden 128 --heads 4 --kv-heads 2 --intermediate 256 \\
      --vocab 500 --lengths 300 --batch 1,2 --block-size 64 --sink 64 --local 128 --out /tmp/decode.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from elastic_attention import ElasticCache, attach, detach, force_routing
from elastic_attention.bench.model import (
    add_model_arguments,
    build_model,
    elastic_config,
    forced_routing,
    model_fields,
)
from elastic_attention.bench.timing import parse_tokens, run_header, timed, write_result


def cache_bytes(cache) -> int:
    """Bytes of keys and values a cache holds (an `ElasticCache`, or a transformers cache of full tensors)."""
    if isinstance(cache, ElasticCache):
        return cache.nbytes()
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def run(args) -> dict:
    device = torch.device(args.device)
    model = build_model(args, device, max(args.lengths))
    routing = forced_routing(args.layers, args.kv_heads, args.msr, args.seed)
    config = elastic_config(args)
    rows = []
    for length in args.lengths:
        for batch in args.batch:
            generator = torch.Generator(device).manual_seed(length + batch)
            prompt = torch.randint(0, args.vocab, (batch, length), device=device, generator=generator)
            next_logits = {}
            for kind in ("bounded", "full"):
                attach(model, config, backend=args.backend, cache=kind)
                force_routing(model, routing)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                with torch.inference_mode():
                    output = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
                    cache = output.past_key_values
                    token = output.logits[:, -1:].argmax(-1)
                    state = {"cache": cache, "length": length}

                    def step():
                        state["length"] += 1
                        mask = torch.ones(batch, state["length"], dtype=torch.long, device=device)
                        return model(input_ids=token, attention_mask=mask, past_key_values=state["cache"],
                                     use_cache=True, logits_to_keep=1)

                    next_logits[kind] = step().logits.float()
                    seconds = timed(step, device, args.steps, warmup=1)
                row = {"length": length, "batch": batch, "cache": kind, "cache_bytes": cache_bytes(cache),
                       "decode_step_s": seconds}
                if device.type == "cuda":
                    row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
                rows.append(row)
                print(row, flush=True)
                del cache, output, state
                detach(model)
            difference = float((next_logits["bounded"] - next_logits["full"]).abs().max())
            if difference > args.tolerance:
                raise SystemExit(f"bounded and full caches disagree by {difference} at length {length}")
            full, bounded = rows[-1], rows[-2]
            bounded.update(bytes_vs_full=bounded["cache_bytes"] / full["cache_bytes"],
                           speedup_vs_full=full["decode_step_s"] / bounded["decode_step_s"],
                           max_logit_difference=difference)
    return {
        **run_header(device),
        "model": model_fields(args),
        "elastic": {"backend": args.backend, "msr": args.msr, "block_size": args.block_size, "sink": args.sink,
                    "local": args.local},
        "baseline": "the same model and routing with the model's own (full) cache, same process",
        "rows": rows,
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=parse_tokens, default=parse_tokens("32k,128k"))
    parser.add_argument("--batch", type=lambda t: [int(b) for b in t.split(",")], default=[1, 8])
    parser.add_argument("--backend", default="auto", help="prefill backend")
    parser.add_argument("--msr", type=float, default=0.7)
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tolerance", type=float, default=0.1, help="largest next-token logit difference allowed")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    arguments = parse_args(argv)
    write_result(arguments.out, run(arguments))


if __name__ == "__main__":
    main()
