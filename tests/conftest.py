"""Shared factories: tiny random Hugging Face models of every supported family, and brute-force mask oracles."""

from __future__ import annotations

import pytest
import torch

FAMILY_NAMES = ("llama", "qwen2", "qwen3", "mistral")


def tiny_model(family: str, *, layers: int = 2, heads: int = 4, kv_heads: int = 2, head_dim: int = 16, seed: int = 0):
    """A tiny random causal LM of ``family`` in float32, eval mode."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(
        vocab_size=97,
        hidden_size=heads * head_dim,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=1024,
        pad_token_id=0,
        eos_token_id=None,
        bos_token_id=None,
    )
    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM, {}),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"use_sliding_window": False}),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"use_sliding_window": False}),
        "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    }
    config_class, model_class, extra = classes[family]
    torch.manual_seed(seed)
    model = model_class(config_class(**common, **extra))
    return model.eval()


def token_mask(length: int, block_size: int, mode: str, sink_blocks: int = 0, local_blocks: int = 1) -> torch.Tensor:
    """Brute-force [L, L] bool mask of one head, written token by token from the rule in SPEC section 2."""
    mask = torch.zeros(length, length, dtype=torch.bool)
    for q in range(length):
        for k in range(q + 1):
            qb, kb = q // block_size, k // block_size
            if mode == "full":
                mask[q, k] = True
            elif mode == "ssa":
                mask[q, k] = kb < sink_blocks or kb > qb - local_blocks
            else:
                raise ValueError(mode)
    return mask


def streaming_suffix_case(count: int, sink: int, local: int, head_dim: int, scale: float, gap: int = 6):
    """Float64 inputs of `streaming_suffix_attention` (2 streaming KV heads of 3 grouped queries, a chunk of
    ``count`` queries starting ``gap`` tokens after a complete window) and the expected output by the token rule
    (`token_attention` at the logical positions).

    Returns:
        ((query, sink_key, sink_value, window_key, window_value), expected).
    """
    from elastic_attention.backends.tokens import token_attention

    first = sink + local + gap
    query = torch.randn(2, 3, count, head_dim, dtype=torch.float64)
    sink_key, sink_value = torch.randn(2, 2, sink, head_dim, dtype=torch.float64)
    window_key, window_value = torch.randn(2, 2, local + count, head_dim, dtype=torch.float64)
    positions = torch.cat([torch.arange(sink), torch.arange(first - local, first + count)])
    expected = token_attention(query, torch.cat([sink_key, window_key], 1), torch.cat([sink_value, window_value], 1),
                               torch.arange(first, first + count), positions, torch.ones(2, dtype=torch.bool),
                               sink_tokens=sink, local_tokens=local, scale=scale)
    return (query, sink_key, sink_value, window_key, window_value), expected


def masked_attention_float64(query, key, value, mask, scale):
    """Oracle: softmax attention in float64 with an explicit [Hq, Lq, Lk] mask. query [Hq, Lq, D], key [Hkv, Lk, D]."""
    group = query.shape[0] // key.shape[0]
    key = key.double().repeat_interleave(group, dim=0)
    value = value.double().repeat_interleave(group, dim=0)
    scores = query.double() @ key.transpose(-1, -2) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value


@pytest.fixture(params=FAMILY_NAMES)
def family(request):
    return request.param


@pytest.fixture(scope="session")
def random_suite_backbone(tmp_path_factory):
    """A tiny random Qwen3 with the suite tokenizer, saved like a real checkpoint: a folder for from_pretrained."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from elastic_attention.evaluation.vocabulary import build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    path = tmp_path_factory.mktemp("random_suite_backbone")
    Qwen3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
