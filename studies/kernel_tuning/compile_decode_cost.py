"""What does compiling the captured decode step's layers cost a process, and how much does each compiled step save?
(issue 41, item 3: after how many decode steps does `attach(..., compile_decode=True)` pay for itself?)

A random-weight decoder of the given shape (`bench.model`, Llama architecture; default: Qwen2.5-Coder-1.5B's
attention and MLP shape), routing forced to ``--msr``, one random prompt of ``--length`` tokens repeated to each
``--batch``. Per batch size, greedy `generate` of ``--new-tokens`` tokens, twice with ``compile_decode`` off, then
twice with it on (each time attached afresh); the first call of each pair captures (and compiles), the second is the
steady state. A row per (batch, setting): the first and the second call's seconds to their last token, the second call's
decode milliseconds a step. Derived per batch size: ``compile_seconds`` (the first compiled call minus the steady
compiled one; the uncompiled pair before it has compiled the prefill's and the cache's kernels for that batch size,
so what is left is compiling the layers, and a capture of milliseconds), ``saved_ms_per_step`` (uncompiled step
minus compiled step) and ``pays_after_steps`` (their ratio).

Run it twice on one machine with the same ``TORCHINDUCTOR_CACHE_DIR``: the first process compiles from nothing, the
second finds Inductor's compiled graphs on disk (what a user's later processes pay).

  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor python studies/kernel_tuning/compile_decode_cost.py --out cold.json
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor python studies/kernel_tuning/compile_decode_cost.py --out warm.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch


def parse_args(argv=None):
    from elastic_attention.bench.model import add_model_arguments
    from elastic_attention.bench.timing import parse_tokens

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser)
    parser.set_defaults(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936, local=1024)
    parser.add_argument("--length", type=lambda text: parse_tokens(text)[0], default=16384)
    parser.add_argument("--batch", type=lambda text: [int(b) for b in text.split(",")], default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--msr", type=float, default=0.9)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def timed_pair(model, ids, mask, args) -> dict:
    """Two identical greedy generations (`bench.timing.warm_then_timed`): each call's seconds from its start to its
    last token, the second's decode milliseconds a step."""
    from elastic_attention.bench.timing import warm_then_timed

    steady = warm_then_timed(model, ids, mask, args.new_tokens, pad_id=0)
    return {"first_call_s": steady["first_call_s"], "second_call_s": steady["ttft_s"] + steady["decode_s"],
            "decode_ms_per_step": 1000 * steady["decode_s"] / (args.new_tokens - 1)}


def main(argv=None) -> dict:
    from elastic_attention import attach, detach, force_routing
    from elastic_attention.bench.model import build_model, elastic_config, forced_routing, model_fields
    from elastic_attention.bench.timing import run_header, write_result

    args = parse_args(argv)
    device = torch.device(args.device)
    model = build_model(args, device, args.length + args.new_tokens)
    routing = forced_routing(args.layers, args.kv_heads, args.msr, args.seed)
    prompt = torch.randint(3, args.vocab, (1, args.length), generator=torch.Generator().manual_seed(args.seed))
    result = {**run_header(device), "model": model_fields(args), "msr": args.msr,
              "length": args.length, "new_tokens": args.new_tokens,
              "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "rows": [], "derived": []}
    for batch in args.batch:
        ids = prompt.repeat(batch, 1).to(device)
        mask = torch.ones_like(ids)
        rows = {}
        for compile_decode in (False, True):
            attach(model, elastic_config(args), backend=args.backend, compile_decode=compile_decode)
            force_routing(model, routing)
            try:
                rows[compile_decode] = {"batch": batch, "compile_decode": compile_decode,
                                        **timed_pair(model, ids, mask, args)}
            finally:
                detach(model)
            result["rows"].append(rows[compile_decode])
        off, on = rows[False], rows[True]
        compile_seconds = on["first_call_s"] - on["second_call_s"]
        saved = off["decode_ms_per_step"] - on["decode_ms_per_step"]
        result["derived"].append({"batch": batch, "compile_seconds": compile_seconds, "saved_ms_per_step": saved,
                                  "pays_after_steps": 1000 * compile_seconds / saved if saved > 0 else None})
        write_result(args.out, result)
        print(json.dumps(result["derived"][-1]), flush=True)
    return result


if __name__ == "__main__":
    main()
