"""A model that slides one window over every layer (Mistral 7B v0.1's rule), on a tiny random Mistral: every layer
is routed and the window is composed with the routing (a full head attends the window; an SSA head its sink and
local window inside it).

The model's window (24 tokens) and the SSA window (sink 8 + local 16) are shorter than the prompts, so both bind;
the sink leaves the model's window after position 31.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import token_mask
from transformers import AttentionInterface

import elastic_attention as ea
from elastic_attention import ElasticConfig

CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4, pool_first=6, pool_last=6)
WINDOW = 24


def tiny_mistral(seed: int = 0):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    config = MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                           sliding_window=WINDOW, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    return MistralForCausalLM(config).eval()


def prompt(batch: int = 2, width: int = 60, seed: int = 0):
    ids = torch.randint(1, 97, (batch, width), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1:, :9] = 0
    return ids, mask


def per_sample_routers(model, seed: int = 1):
    """Random router weights: different sequences get different routings."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in ea.routers_of(model).values():
            for name, parameter in router.named_parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * (0 if "bias" in name else 0.5))


def oracle_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Unpadded prompts only: SSA at block level (sink 1 block, local 2 blocks), cut to keys q - k < WINDOW."""
    length = key.shape[2]
    positions = torch.arange(length)
    allowed = token_mask(length, 8, "ssa", sink_blocks=1, local_blocks=2)
    allowed &= positions[None, :] > positions[:, None] - WINDOW
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling, enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register("window_test_oracle", oracle_attention)


def generate(model, ids, mask, tokens=14):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False,
                              pad_token_id=0)


@pytest.mark.parametrize("cache", ["bounded", "full"])
def test_every_layer_is_routed_and_forced_full_is_the_model(cache):
    model = tiny_mistral()
    ids, mask = prompt()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
    expected_tokens = generate(model, ids, mask, tokens=30)  # decoding reaches position 89, far past the window
    ea.attach(model, CONFIG, backend="reference", cache=cache)
    runtime = ea.integration.runtime_of(model)
    assert runtime.routed_layers == (0, 1, 2) and runtime.model_window == WINDOW
    ea.force_routing(model, "full")
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(logits[0], expected[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(logits[1, 9:], expected[1, 9:], atol=2e-5, rtol=1e-4)
    with torch.no_grad():
        output = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False,
                                pad_token_id=0, return_dict_in_generate=True)
    assert torch.equal(output.sequences, expected_tokens)
    if cache == "bounded":  # full heads forget what the window hides: at most about twice the window is kept
        for layer in output.past_key_values.layers:
            for store in layer.sequences:
                assert store.full_count <= 2 * WINDOW and store.full_keys.shape[1] <= 2 * WINDOW + 1
                assert store.full_first > 0


@pytest.mark.parametrize("backend", ["reference", "cpu", "flex"])
def test_forced_sparse_is_ssa_inside_the_window(backend):
    model = tiny_mistral()
    ids = torch.randint(1, 97, (2, 57), generator=torch.Generator().manual_seed(3))
    previous = model.config._attn_implementation
    model.set_attn_implementation("window_test_oracle")
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits
    model.set_attn_implementation(previous)
    ea.attach(model, CONFIG, backend=backend)
    ea.force_routing(model, "sparse")
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-4)


def test_per_sample_routing_generates_the_same_with_either_cache_and_each_sample_alone():
    ids, mask = prompt(seed=2)
    results = {}
    for cache in ("bounded", "full"):
        model = ea.attach(tiny_mistral(), CONFIG, backend="reference", cache=cache)
        per_sample_routers(model)
        batched = generate(model, ids, mask)
        alone = [generate(model, ids[row : row + 1, start:], None) for row, start in ((0, 0), (1, 9))]
        assert torch.equal(batched[0], alone[0][0]) and torch.equal(batched[1, 9:], alone[1][0])
        decisions = ea.routing_report(model).decisions
        results[cache] = batched
    assert torch.equal(results["bounded"], results["full"])
    assert decisions.any() and not decisions.all()  # some heads full, some on SSA
