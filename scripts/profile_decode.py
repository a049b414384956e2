"""Profile decode steps of the 8B-shaped random model per cache kind: where the synchronisations and the time go.

Prefill and decode run without torch's cuDNN SDPA, decode as in `bench decode` (cuDNN plans a graph per key length:
4.5 ms of host time per call was measured with this script on an H200, 2026-11-29).

  python scripts/profile_decode.py --layers 8 --length 8192 [--caches bounded,full,dense]
"""

from __future__ import annotations

import argparse
import collections
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from elastic_attention import attach, detach, force_routing
from elastic_attention.backends.tokens import single_query_kernels
from elastic_attention.bench.model import add_model_arguments, build_model, elastic_config, forced_routing
from elastic_attention.integration.attach import is_attached


def main() -> None:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--msr", type=float, default=0.7)
    parser.add_argument("--backend", default="reference")
    parser.add_argument("--caches", default="bounded,full,dense")
    args = parser.parse_args()
    device = torch.device(args.device)
    model = build_model(args, device, args.length + 64)
    prompt = torch.randint(0, args.vocab, (1, args.length), device=device)
    for kind in args.caches.split(","):
        if kind != "dense":
            attach(model, elastic_config(args), backend=args.backend, cache=kind)
            force_routing(model, forced_routing(args.layers, args.kv_heads, args.msr, args.seed))
        with torch.inference_mode(), single_query_kernels():
            output = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
            cache, token, length = output.past_key_values, output.logits[:, -1:].argmax(-1), args.length

            def step():
                nonlocal length
                length += 1
                mask = torch.ones(1, length, dtype=torch.long, device=device)
                return model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True,
                             logits_to_keep=1)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            began = time.perf_counter()
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            print(f"== {kind}: {(time.perf_counter() - began) / 10 * 1e3:.2f} ms per step, {args.layers} layers")
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step()
            torch.cuda.set_sync_debug_mode(0)
            where = collections.Counter(f"{w.filename.split('src/')[-1]}:{w.lineno}" for w in caught)
            print(f"synchronisations in one step: {sum(where.values())}", dict(where.most_common(12)))
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
            averages = prof.key_averages()
            print(averages.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
            print(averages.table(sort_by="self_device_time_total", row_limit=10, max_name_column_width=60))
        del output, cache
        if is_attached(model):
            detach(model)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
