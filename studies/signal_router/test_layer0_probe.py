"""layer0_probe's pooled keys against the attached router's own input, read off a Qwen2 model's layer-0 key
projection during a forward; its fit against labels a router can learn."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from input_auc import auc  # noqa: E402
from layer0_probe import fit, floor_probability, pooled_keys  # noqa: E402


@pytest.mark.parametrize("length, first, last", [(37, 5, 7), (9, 5, 7), (12, 5, 7)])
def test_pooled_keys_match_the_models_layer0_keys_pooled_by_the_library(length, first, last):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from elastic_attention.patterns import SequenceLayout
    from elastic_attention.router.pooling import boundary_pool

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=101, hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=64, rms_norm_eps=1e-6)
    model = Qwen2ForCausalLM(config).double().eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.bias.normal_()
        model.model.layers[0].input_layernorm.weight.uniform_(0.5, 1.5)
    captured = {}
    model.model.layers[0].self_attn.k_proj.register_forward_hook(lambda _m, _i, out: captured.update(keys=out))
    ids = torch.randint(0, 101, (1, length))
    with torch.no_grad():
        model(input_ids=ids)
    keys = captured["keys"].view(1, length, 3, 8)  # [B, S, Hkv, D], before RoPE
    expected = boundary_pool(keys, SequenceLayout.dense(1, length), first, last)[0]
    weights = {name: value for name, value in model.state_dict().items()}
    got = pooled_keys(ids[0].tolist(), weights, first, last, kv_heads=3, eps=1e-6)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)  # boundary_pool: float32


def test_fit_learns_a_label_that_one_key_dimension_carries_and_ranks_fresh_inputs_by_it():
    generator = torch.Generator().manual_seed(1)
    inputs, fresh = torch.randn(400, 2, 8, generator=generator), torch.randn(200, 2, 8, generator=generator)
    router = fit(inputs, inputs[:, 1, 3] > 0, steps=300, seed=0)
    assert auc(floor_probability(router, inputs).tolist(), (inputs[:, 1, 3] > 0).tolist()) > 0.85
    assert auc(floor_probability(router, fresh).tolist(), (fresh[:, 1, 3] > 0).tolist()) > 0.8
