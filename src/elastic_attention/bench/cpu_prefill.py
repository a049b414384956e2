"""How much does elastic attention cost or save on a CPU? One prefill of a Qwen2.5-0.5B-shaped model, timed as the
plain model and with elastic attention forced to full and to all-SSA (the `cpu` backend, and `reference` for
comparison).

  elastic-attention bench cpu-prefill --length 4k --out cpu_prefill.json
  elastic-attention bench cpu-prefill --model artifacts/qwen2.5-coder-0.5b-instruct --length 4k

Without ``--model`` the weights are random (nothing is downloaded); the shape is Qwen2.5-0.5B's (24 layers, hidden
896, 14 query / 2 KV heads of 64, intermediate 4864). Each mode is the median of ``--repeats`` prefills
(``logits_to_keep=1``) after a warm-up; every forced mode is checked against the plain model first (full: logits
equal to float tolerance; sparse: the reference backend's logits).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from elastic_attention import ElasticConfig, attach, detach, force_routing
from elastic_attention.bench.timing import run_header, timed, write_result
from elastic_attention.help_format import finish_parser
from elastic_attention.units import parse_length

MODES = ("plain", "full", "sparse", "full_reference")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="elastic-attention bench cpu-prefill", description=__doc__)
    parser.add_argument("--model", help="a model folder (default: random weights of the Qwen2.5-0.5B shape)")
    parser.add_argument("--length", type=parse_length, default=4096)
    parser.add_argument("--sink", type=int, default=128)
    parser.add_argument("--local", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                        help="float32 on CPUs without bf16 instructions (no AVX-512 BF16 / AMX), where bf16 is slow")
    parser.add_argument("--out", type=Path)
    finish_parser(parser, "elastic-attention bench cpu-prefill --length 4k --out cpu_prefill.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = _model(args.model, args.length, getattr(torch, args.dtype))
    vocabulary = model.config.vocab_size
    ids = torch.randint(vocabulary // 10, vocabulary, (1, args.length), generator=torch.Generator().manual_seed(0))
    config = ElasticConfig(block_size=128, sink_tokens=args.sink, local_tokens=args.local)

    def prefill():
        with torch.no_grad():
            return model(ids, logits_to_keep=1, use_cache=False).logits.float()

    plain_logits = prefill()
    results = []
    for mode in args.modes.split(","):
        if mode == "plain":
            results.append({"mode": mode, "seconds": timed(prefill, torch.device("cpu"), args.repeats, warmup=1)})
            print(f"{mode:>15}: {results[-1]['seconds']:.3f} s", flush=True)
            continue
        routing = "sparse" if mode == "sparse" else "full"
        expected = plain_logits if routing == "full" else _forced(model, config, "reference", routing, prefill)
        attach(model, config, backend="reference" if mode == "full_reference" else "cpu")
        force_routing(model, routing)
        try:
            error = float((prefill() - expected).abs().max())
            seconds = timed(prefill, torch.device("cpu"), args.repeats, warmup=0)
        finally:
            detach(model)
        results.append({"mode": mode, "seconds": seconds, "max_logit_difference": error})
        print(f"{mode:>15}: {seconds:.3f} s (logits within {error:.2e} of the check)", flush=True)
    result = {**run_header(torch.device("cpu")), "threads": args.threads,
              "length": args.length, "model": args.model or "random Qwen2.5-0.5B shape", "dtype": args.dtype,
              "sink_tokens": args.sink, "local_tokens": args.local, "results": results}
    if args.out is not None:
        write_result(args.out, result)


def _forced(model, config: ElasticConfig, backend: str, routing: str, prefill) -> torch.Tensor:
    """The logits of one prefill with elastic attention attached through ``backend`` and forced to ``routing``."""
    attach(model, config, backend=backend)
    force_routing(model, routing)
    try:
        return prefill()
    finally:
        detach(model)


def _model(folder: str | None, length: int, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, Qwen2Config

    if folder is not None:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=max(32768, length),
                         rope_theta=1e6, use_sliding_window=False, tie_word_embeddings=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


if __name__ == "__main__":
    main()
