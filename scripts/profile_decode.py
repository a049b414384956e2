"""Profile decode steps of the 8B-shaped random model per cache kind: where the synchronisations and the time go.

Prefill and decode run without torch's cuDNN SDPA, decode as in `bench decode` (cuDNN plans a graph per key length:
4.5 ms of host time per call was measured with this script on an H200, 2026-11-29).

  python scripts/profile_decode.py --layers 8 --length 8192 [--batch 8] [--caches bounded,bounded_torch,full,dense]

``bounded`` is the bounded cache with its fused decode step (a GPU with Triton), ``bounded_torch`` the same cache with
its per-sequence torch step; a batch above 1 repeats the prefilled cache.
"""

from __future__ import annotations

import argparse
import collections
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from elastic_attention import detach
from elastic_attention.cache.token_attention import single_query_kernels
from elastic_attention.bench.decode import compile_in_process, prepare_kind
from elastic_attention.bench.model import add_model_arguments, build_model
from elastic_attention.integration.attach import is_attached, runtime_of


def main() -> None:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--msr", type=float, default=0.7)
    parser.add_argument("--backend", default="reference")
    parser.add_argument("--caches", default="bounded,bounded_torch,full,dense")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    device = torch.device(args.device)
    compile_in_process()
    model = build_model(args, device, args.length + 64)
    prompt = torch.randint(0, args.vocab, (1, args.length), device=device)
    for kind in args.caches.split(","):
        cache = prepare_kind(model, kind, args)
        with torch.inference_mode(), single_query_kernels():
            output = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache, token, length = output.past_key_values, output.logits[:, -1:].argmax(-1), args.length
            if args.batch > 1:
                cache.batch_repeat_interleave(args.batch)
                if kind == "full":  # the model's own cache does not tell the runtime
                    runtime_of(model).select_sequences(torch.zeros(args.batch, dtype=torch.long))
                token = token.repeat_interleave(args.batch, dim=0)

            def step():
                nonlocal length
                length += 1
                mask = torch.ones(token.shape[0], length, dtype=torch.long, device=device)
                return model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True,
                             logits_to_keep=1)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            began = time.perf_counter()
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            print(f"== {kind}: {(time.perf_counter() - began) / 10 * 1e3:.2f} ms per step, {args.layers} layers, "
                  f"batch {args.batch}")
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
