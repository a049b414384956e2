"""Models that mix sliding-window and full-attention layers, on tiny random configs of each family: the full layers
are routed, the sliding layers keep the model's attention and cache.

Windows (24 tokens) and the SSA window (sink 8 + local 16) are shorter than the prompts, so every rule binds.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import token_mask
from transformers import AttentionInterface
from transformers.cache_utils import DynamicSlidingWindowLayer

import elastic_attention as ea
from elastic_attention import ConfigError, ElasticConfig

CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4, pool_first=6, pool_last=6)
WINDOW = 24
MIXED = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
FAMILIES = ("qwen2", "gemma2", "gemma2_softcap", "gemma3_text", "cohere2", "gpt_oss")
#: Gemma 2's soft-cap in the tests, with the query and key projections scaled up so that it binds.
SOFTCAP = 2.0


def tiny_mixed(family: str, seed: int = 0):
    """A tiny random model of ``family`` whose layers 0 and 2 are sliding-window layers (Qwen2: layers 2 and 3)."""
    from transformers import (
        Cohere2Config,
        Cohere2ForCausalLM,
        Gemma2Config,
        Gemma2ForCausalLM,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GptOssConfig,
        GptOssForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, pad_token_id=0, eos_token_id=None,
                  bos_token_id=None, sliding_window=WINDOW)
    torch.manual_seed(seed)
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=True, max_window_layers=2)).eval()
    if family == "gemma2":
        return Gemma2ForCausalLM(Gemma2Config(**common, attn_logit_softcapping=None,
                                              final_logit_softcapping=None)).eval()
    if family == "gemma2_softcap":
        model = Gemma2ForCausalLM(Gemma2Config(**common, attn_logit_softcapping=SOFTCAP,
                                               final_logit_softcapping=None)).eval()
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(12.0)
                layer.self_attn.k_proj.weight.mul_(12.0)
        return model
    if family == "gemma3_text":
        return Gemma3ForCausalLM(Gemma3TextConfig(**common, layer_types=MIXED)).eval()
    if family == "gpt_oss":
        model = GptOssForCausalLM(GptOssConfig(**common, layer_types=MIXED, num_local_experts=2,
                                               num_experts_per_tok=1)).eval()
        with torch.no_grad():  # sinks large enough to take a visible share of every softmax
            for layer in model.model.layers:
                layer.self_attn.sinks.copy_(torch.randn(4) + 3.0)
        return model
    return Cohere2ForCausalLM(Cohere2Config(**common, layer_types=MIXED)).eval()


def prompt(batch: int = 2, width: int = 60, seed: int = 0):
    ids = torch.randint(1, 97, (batch, width), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1:, :9] = 0
    return ids, mask


def oracle_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Unpadded prompts only: sliding layers attend keys (q - WINDOW, q]; full layers SSA at block level; with the
    model's soft-cap (Gemma 2) and sinks (gpt-oss) in float64."""
    length = key.shape[2]
    positions = torch.arange(length)
    if module.config.layer_types[module.layer_idx] == "sliding_attention":
        allowed = (positions[None, :] <= positions[:, None]) & (positions[None, :] > positions[:, None] - WINDOW)
    else:
        allowed = token_mask(length, 8, "ssa", sink_blocks=1, local_blocks=2)
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    if softcap is None and sinks is None:
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling, enable_gqa=True)
    else:
        group = query.shape[1] // key.shape[1]
        scores = query.double() @ key.double().repeat_interleave(group, dim=1).transpose(2, 3) * scaling
        if softcap is not None:  # Gemma 2: c * tanh(scores / c)
            scores = softcap * torch.tanh(scores / softcap)
        weights = scores.masked_fill(~allowed, float("-inf")).exp()
        denominator = weights.sum(-1, keepdim=True)
        if sinks is not None:  # gpt-oss: e^sink joins the denominator
            denominator = denominator + sinks.double().exp()[None, :, None, None]
        output = ((weights / denominator) @ value.double().repeat_interleave(group, dim=1)).to(query.dtype)
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register("sliding_test_oracle", oracle_attention)


@pytest.mark.parametrize("family", FAMILIES)
def test_full_layers_are_routed_and_forced_full_is_the_model(family):
    model = tiny_mixed(family)
    ids, mask = prompt()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        expected_tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                                         pad_token_id=0)
    ea.attach(model, CONFIG, backend="reference")
    runtime = ea.integration.runtime_of(model)
    full = tuple(i for i, kind in enumerate(model.config.layer_types) if kind == "full_attention")
    assert runtime.routed_layers == full and runtime.config.routed_layers == full
    assert runtime.sliding_layers == frozenset(set(range(4)) - set(full))
    ea.force_routing(model, "full")
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
        tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                                pad_token_id=0, return_dict_in_generate=True)
    torch.testing.assert_close(logits[0], expected[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(logits[1, 9:], expected[1, 9:], atol=2e-5, rtol=1e-4)
    assert torch.equal(tokens.sequences, expected_tokens)
    cache = tokens.past_key_values
    for index in runtime.sliding_layers:  # the model's own window cache, holding the window only
        assert isinstance(cache.layers[index], DynamicSlidingWindowLayer)
        assert cache.layers[index].keys.shape[2] <= WINDOW
    report = ea.routing_report(model)
    assert report.layers == full and report.decisions.shape == (2, len(full), 2)


@pytest.mark.parametrize("family", FAMILIES)
def test_forced_sparse_on_the_full_layers_equals_masked_sdpa(family):
    model = tiny_mixed(family)
    ids = torch.randint(1, 97, (2, 57), generator=torch.Generator().manual_seed(3))
    previous = model.config._attn_implementation
    model.set_attn_implementation("sliding_test_oracle")
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits
    model.set_attn_implementation(previous)
    ea.attach(model, CONFIG, backend="reference" if family in ("gemma2_softcap", "gpt_oss") else "cpu")
    ea.force_routing(model, "sparse")
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-4)
    assert ea.routing_report(model).msr.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_and_padding_match_each_sample_alone(family):
    model = tiny_mixed(family)
    ea.attach(model, CONFIG, backend="reference")
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for router in ea.routers_of(model).values():
            for name, parameter in router.named_parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * (0 if "bias" in name else 0.5))
    ids, mask = prompt(seed=2)
    for cache in ("bounded", "full"):
        ea.detach(model)
        ea.attach(model, CONFIG, backend="reference", cache=cache)
        with torch.no_grad():
            batched = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                     pad_token_id=0)
            alone = [model.generate(input_ids=ids[row : row + 1, start:], max_new_tokens=12, do_sample=False,
                                    pad_token_id=0) for row, start in ((0, 0), (1, 9))]
        assert torch.equal(batched[0], alone[0][0]) and torch.equal(batched[1, 9:], alone[1][0])


def test_sliding_layers_cannot_be_routed():
    with pytest.raises(ConfigError, match="sliding-window layers \\[0\\]"):
        ea.attach(tiny_mixed("gemma3_text"), ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16,
                                                            xa_stride=4, routed_layers=[0, 1]))


def test_the_soft_cap_binds_and_a_backend_without_it_is_refused_by_name():
    from elastic_attention import BackendUnavailableError

    model = tiny_mixed("gemma2_softcap")
    ids = torch.randint(1, 97, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        capped = model(ids).logits
        model.config.attn_logit_softcapping = None
        for layer in model.model.layers:
            layer.self_attn.attn_logit_softcapping = None
        uncapped = model(ids).logits
        model.config.attn_logit_softcapping = SOFTCAP
        for layer in model.model.layers:
            layer.self_attn.attn_logit_softcapping = SOFTCAP
    assert (capped - uncapped).abs().max() > 0.1  # the test models' scores reach the cap
    with pytest.raises(BackendUnavailableError, match="backend .cpu. lacks logit soft-capping .*use 'reference'"):
        ea.attach(model, CONFIG, backend="cpu")
    assert not ea.integration.is_attached(model)
    ea.attach(model, CONFIG)  # auto on a CPU: reference, which soft-caps
    assert ea.integration.runtime_of(model).backend.name == "reference"
    ea.force_routing(model, "full")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, capped, atol=2e-5, rtol=1e-4)


def test_the_sinks_take_a_share_of_every_softmax():
    from elastic_attention import BackendUnavailableError

    model = tiny_mixed("gpt_oss")
    ids = torch.randint(1, 97, (1, 40), generator=torch.Generator().manual_seed(4))
    with pytest.raises(BackendUnavailableError, match="backend 'flex' lacks attention sinks"):
        ea.attach(model, CONFIG, backend="flex")
    ea.attach(model, CONFIG)  # auto: reference, the backend with sinks
    assert ea.integration.runtime_of(model).backend.name == "reference"
    ea.force_routing(model, "full")
    with torch.no_grad():
        with_sinks = model(ids).logits
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
        without = model(ids).logits
    assert (with_sinks - without).abs().max() > 0.1


def test_an_adapter_of_a_mixed_model_routes_the_same_layers_again(tmp_path):
    model = ea.attach(tiny_mixed("cohere2"), CONFIG, backend="reference")
    ea.save_router(model, tmp_path)
    fresh = ea.load_router(tiny_mixed("cohere2", seed=1), tmp_path, backend="reference")
    assert ea.integration.runtime_of(fresh).routed_layers == (1, 3)
    ids, _ = prompt(batch=1)
    with torch.no_grad():
        model(ids)
        fresh(ids)
    assert ea.routing_report(fresh).layers == (1, 3)
