"""Wall time of every decode step (synchronised) for cache kinds in turn, to see transients (first steps, first
kind in the process) that medians hide. 8B-shaped random model, FA-SSA at --msr. Compiles with Inductor's worker
processes unless TORCHINDUCTOR_COMPILE_THREADS=1 (that transient is what it found).

  python scripts/decode_step_trace.py --layers 8 --length 32768 --kinds bounded,bounded_torch,bounded --steps 40
"""

from __future__ import annotations

import argparse
import time

import torch

from elastic_attention import detach
from elastic_attention.cache.token_attention import single_query_kernels
from elastic_attention.bench.decode import prepare_kind
from elastic_attention.bench.model import add_model_arguments, build_model


def main() -> None:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--msr", type=float, default=0.7)
    parser.add_argument("--backend", default="flex")
    parser.add_argument("--kinds", default="bounded,bounded_torch,bounded")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    device = torch.device(args.device)
    model = build_model(args, device, args.length + args.steps + 8)
    prompt = torch.randint(0, args.vocab, (1, args.length), device=device)
    for kind in args.kinds.split(","):
        if not kind.startswith("bounded"):
            raise SystemExit(f"--kinds takes bounded and bounded_torch, got {kind!r}")
        cache = prepare_kind(model, kind, args)
        with torch.inference_mode(), single_query_kernels():
            output = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
            token, length = output.logits[:, -1:].argmax(-1), args.length
            if args.batch > 1:
                cache.batch_repeat_interleave(args.batch)
                token = token.repeat_interleave(args.batch, dim=0)
            times = []
            for _ in range(args.steps):
                length += 1
                mask = torch.ones(token.shape[0], length, dtype=torch.long, device=device)
                torch.cuda.synchronize()
                began = time.perf_counter()
                model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - began) * 1e3)
        print(f"{kind}: " + " ".join(f"{t:.1f}" for t in times), flush=True)
        del output, cache
        detach(model)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
