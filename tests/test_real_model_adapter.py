"""The committed router adapters for Qwen2.5-Coder-0.5B- and 1.5B-Instruct, each on a random-weight Qwen2 of its
model's shape."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from elastic_attention import AdapterMismatchError, force_routing, load_router, routers_of, routing_report
from elastic_attention.adapters import WEIGHTS_FILE
from elastic_attention.assets import QWEN_CODER_1_5B_ROUTER, QWEN_CODER_ROUTER


#: adapter folder -> its model's attention shape: layers, hidden size, query heads, KV heads (rope base 1e6).
SHAPES = {
    QWEN_CODER_ROUTER: {"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14,
                        "num_key_value_heads": 2},
    QWEN_CODER_1_5B_ROUTER: {"num_hidden_layers": 28, "hidden_size": 1536, "num_attention_heads": 12,
                             "num_key_value_heads": 2},
}


def qwen_coder_shape(shape: dict, **changes):
    """A Qwen2.5-Coder model's attention shape with a small MLP and vocabulary, random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=512, intermediate_size=128, max_position_embeddings=32768, rope_theta=1e6,
                         use_sliding_window=False, tie_word_embeddings=False, **{**shape, **changes})
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("adapter", list(SHAPES), ids=lambda path: path.name)
def test_committed_adapter_loads_and_routes_each_sample(adapter):
    shape = SHAPES[adapter]
    model = qwen_coder_shape(shape)
    load_router(model, adapter, backend="reference")
    saved = load_file(adapter / WEIGHTS_FILE)
    loaded = {f"layers.{i}.{name}": tensor for i, router in routers_of(model).items()
              for name, tensor in router.state_dict().items()}
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k].float(), saved[k].float()) for k in saved)
    assert sum(t.numel() for k, t in saved.items() if k.startswith("layers.0.") and "feature_" not in k) > 60_000
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 512, (2, 300), generator=generator)
    with torch.no_grad():
        routed = model(inputs).logits
        report = routing_report(model)
        assert report.decisions.shape == (2, shape["num_hidden_layers"], shape["num_key_value_heads"])
        assert torch.all((0 <= report.msr) & (report.msr <= 1))
        # Each sample's routing is its own: the same as when it runs alone.
        for row in range(2):
            model(inputs[row : row + 1])
            assert torch.equal(routing_report(model).decisions[0], report.decisions[row])
        force_routing(model, "full")
        full = model(inputs).logits
    assert routed.shape == full.shape and torch.isfinite(routed).all()


@pytest.mark.parametrize("adapter", list(SHAPES), ids=lambda path: path.name)
def test_committed_adapter_refuses_another_shape(adapter):
    with pytest.raises(AdapterMismatchError, match="num_hidden_layers"):
        load_router(qwen_coder_shape(SHAPES[adapter], num_hidden_layers=12), adapter, backend="reference")


def test_a_shipped_router_loads_by_name_and_an_unknown_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    from elastic_attention.assets import shipped_routers

    assert shipped_routers() == ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]
    model = qwen_coder_shape(SHAPES[QWEN_CODER_ROUTER])
    monkeypatch.chdir(tmp_path)  # the name, not a checkout path, finds the adapter
    load_router(model, "qwen2.5-coder-0.5b-instruct", backend="reference")
    saved = load_file(QWEN_CODER_ROUTER / WEIGHTS_FILE)
    assert torch.equal(routers_of(model)[0].state_dict()["router_mlp.0.weight"].float(),
                       saved["layers.0.router_mlp.0.weight"].float())
    with pytest.raises(FileNotFoundError, match="qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct"):
        load_router(qwen_coder_shape(SHAPES[QWEN_CODER_ROUTER]), "qwen2.5-coder-7b-instruct")
