"""What the model-level benchmarks share: the model-shape and pattern options, a random-weight decoder built from
them (default: the Llama-3.1-8B shape; nothing is downloaded), the forced routing, and the ElasticConfig."""

from __future__ import annotations

import argparse

import torch

from elastic_attention import ElasticConfig

#: The model-shape options, as recorded in a results file.
MODEL_FIELDS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab")


def add_pattern_arguments(parser: argparse.ArgumentParser) -> None:
    """--block-size, --sink, --local (tokens)."""
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--sink", type=int, default=128)
    parser.add_argument("--local", type=int, default=2048)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, the decoder shape (--layers ... --vocab), the pattern sizes and --seed."""
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=128256)
    add_pattern_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)


def model_fields(args) -> dict:
    """The model shape of a run, for its results file."""
    return {key: getattr(args, key) for key in MODEL_FIELDS}


def elastic_config(args, configuration: str = "fa-ssa") -> ElasticConfig:
    """The ElasticConfig of the pattern options."""
    return ElasticConfig(configuration=configuration, block_size=args.block_size, sink_tokens=args.sink,
                         local_tokens=args.local)


def build_model(args, device: torch.device, max_length: int):
    """A Llama-architecture causal LM of the shape in ``args`` with random weights (bf16 on CUDA), eval mode."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        vocab_size=args.vocab,
        max_position_embeddings=max_length,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=False,
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def forced_routing(layers: int, kv_heads: int, msr: float, seed: int) -> torch.Tensor:
    """[L, Hkv] bool with round((1 - msr) * L * Hkv) heads on retrieval attention, chosen at random."""
    total = layers * kv_heads
    retrieval = round((1.0 - msr) * total)
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    chosen = torch.zeros(total, dtype=torch.bool)
    chosen[order[:retrieval]] = True
    return chosen.view(layers, kv_heads)
