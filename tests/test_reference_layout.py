"""The authors' checkpoint layout: tiny random Qwen3 and Llama models written in it by the test, loaded with
`from_pretrained`, routed as their evaluation routes, and written back by `save_pretrained(format="reference")`.

The oracle is an independent implementation of their evaluation rule on the unmodified model: keys after the
k-norm (Qwen3) or the key projection (Llama), before RoPE; the mean over the first 100 and the last 100 tokens per
KV head; their two MLPs; argmax, class 1 = full attention.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model
from safetensors.torch import load_file, save_file

import elastic_attention as ea
from elastic_attention import ConfigError
from elastic_attention.integration import runtime_of

PREFIX = "model.layers.{layer}.self_attn.mask_allocator"
THEIR_FIELDS = {"toggle_type": "streaming", "retrieval_mode": "full", "sink_size": 128, "local_window_size": 1024,
                "pooling_mode": "ctx_q", "use_softmax": True, "enable_ada_sparsity": True,
                "use_task_emb_for_mask": False, "enable_lambda_task": True, "suggested_threshold": 0.41}


def their_router_tensors(layers: int, head_dim: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    hidden = 4 * head_dim

    def normal(*shape):
        return torch.randn(*shape, generator=generator) * 0.5

    tensors = {}
    for layer in range(layers):
        prefix = PREFIX.format(layer=layer)
        for part, shapes in (("cls_feat_extractor", [(hidden, head_dim), (head_dim, hidden)]),
                             ("cls_router_head_agnostic", [(hidden, head_dim), (head_dim, hidden), (2, head_dim)])):
            for index, (rows, columns) in zip((0, 2, 4), shapes):
                tensors[f"{prefix}.{part}.{index}.weight"] = normal(rows, columns)
                tensors[f"{prefix}.{part}.{index}.bias"] = normal(rows)
        tensors[f"model.layers.{layer}.self_attn.attn_mask_log_alphas"] = torch.full((2,), 4.5)
    tensors["model.sparsity_lambda_1"] = torch.zeros(1)
    tensors["model.sparsity_lambda2_task"] = torch.zeros(5)
    return tensors


def write_their_layout(folder, family: str, seed: int = 0, **fields):
    """A tiny random model saved as the authors' tools save it: base weights plus routers in one safetensors file,
    base config plus their fields."""
    model = tiny_model(family, layers=2, seed=seed)
    model.config.max_position_embeddings = 4096
    model.save_pretrained(folder)
    weights = load_file(folder / "model.safetensors")
    routers = their_router_tensors(2, model.config.head_dim, seed)
    save_file({**weights, **routers}, folder / "model.safetensors", metadata={"format": "pt"})
    document = json.loads((folder / "config.json").read_text())
    architecture = "PawQwen3ForCausalLM" if family == "qwen3" else "PawLlamaForCausalLM"
    document.update({"architectures": [architecture], **THEIR_FIELDS, **fields})
    (folder / "config.json").write_text(json.dumps(document))
    return model, routers


def their_decisions(model, routers, input_ids) -> torch.Tensor:
    """[B, layers, Hkv] bool: their evaluation rule, on the plain model."""
    family = model.config.model_type
    keys = {}
    hooks = []
    for index, layer in enumerate(model.model.layers):
        source = layer.self_attn.k_norm if family == "qwen3" else layer.self_attn.k_proj
        hooks.append(source.register_forward_hook(lambda m, a, out, index=index: keys.__setitem__(index, out)))
    with torch.no_grad():
        model(input_ids)
    for hook in hooks:
        hook.remove()
    head_dim, num_kv = model.config.head_dim, model.config.num_key_value_heads
    decisions = []
    for index in range(len(model.model.layers)):
        states = keys[index].reshape(input_ids.shape[0], input_ids.shape[1], num_kv, head_dim)
        pooled = torch.cat([states[:, :100], states[:, -100:]], dim=1).mean(dim=1)  # [B, Hkv, D]
        prefix = PREFIX.format(layer=index)

        def mlp(x, part, indices):
            for position, i in enumerate(indices):
                x = F.linear(x, routers[f"{prefix}.{part}.{i}.weight"], routers[f"{prefix}.{part}.{i}.bias"])
                if position < len(indices) - 1:
                    x = F.silu(x)
            return x

        logits = mlp(mlp(pooled, "cls_feat_extractor", (0, 2)), "cls_router_head_agnostic", (0, 2, 4))
        decisions.append(logits.argmax(-1) == 1)
    return torch.stack(decisions, dim=1)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_their_checkpoint_loads_and_routes_each_sample_as_their_rule(tmp_path, family):
    plain, routers = write_their_layout(tmp_path, family)
    model = ea.from_pretrained(tmp_path, backend="reference")
    config = runtime_of(model).config
    assert (config.configuration, config.sink_tokens, config.local_tokens, config.block_size) == ("fa-ssa", 128, 1024,
                                                                                                   128)
    assert (config.pool_first, config.pool_last, config.router_width) == (100, 100, 4)
    generator = torch.Generator().manual_seed(3)
    found_different = False
    for trial in range(6):
        # Prompts far apart: random tokens, one token repeated, two tokens alternating.
        token, other = (int(t) for t in torch.randint(3, 97, (2,), generator=generator))
        ids = torch.stack([torch.randint(3, 97, (260,), generator=generator), torch.full((260,), token),
                           torch.tensor([token, other] * 130)])
        expected = their_decisions(plain, routers, ids)
        with torch.no_grad():
            model(ids, use_cache=False)
        decided = ea.routing_report(model).decisions
        assert torch.equal(decided, expected)
        found_different |= not all(torch.equal(decided[0], decided[row]) for row in (1, 2))
    assert found_different  # the batch is routed per sample, not like its first sample


def test_saving_in_their_layout_round_trips_routing_and_logits(tmp_path):
    write_their_layout(tmp_path / "theirs", "qwen3")
    model = ea.from_pretrained(tmp_path / "theirs", backend="reference")
    ids = torch.randint(3, 97, (2, 300), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    decisions = ea.routing_report(model).decisions
    ea.save_pretrained(model, tmp_path / "again", format="reference")
    saved = json.loads((tmp_path / "again" / "config.json").read_text())
    assert saved["architectures"] == ["PawQwen3ForCausalLM"] and saved["toggle_type"] == "streaming"
    assert saved["model_type"] == "qwen3" and saved["use_softmax"] is True
    names = load_file(tmp_path / "again" / "model.safetensors").keys()
    assert f"{PREFIX.format(layer=1)}.cls_router_head_agnostic.4.bias" in names
    assert not any(".elastic_router." in name for name in names)
    again = ea.from_pretrained(tmp_path / "again", backend="reference")
    with torch.no_grad():
        torch.testing.assert_close(again(ids, use_cache=False).logits, logits, rtol=0, atol=0)
    assert torch.equal(ea.routing_report(again).decisions, decisions)


@pytest.mark.parametrize("field, value, message", [
    ("use_softmax", False, "sigmoid router head"),
    ("use_task_emb_for_mask", True, "task embeddings"),
    ("enable_ada_sparsity", False, "static per-head masks"),
    ("pooling_mode", "first_token", "pooling_mode 'first_token'"),
    ("toggle_type", "topk", "toggle_type 'topk' is not supported"),
    ("retrieval_mode", "xattn", None),  # xattn + streaming is xa-ssa: honoured
])
def test_their_settings_are_honoured_or_refused_by_name(tmp_path, field, value, message):
    write_their_layout(tmp_path, "qwen3", **{field: value})
    if message is None:
        assert runtime_of(ea.from_pretrained(tmp_path, backend="reference")).config.configuration == "xa-ssa"
        return
    with pytest.raises(ConfigError, match=message):
        ea.from_pretrained(tmp_path, backend="reference")


def test_plain_folders_take_an_adapter_and_unwritable_settings_are_named(tmp_path):
    model = ea.attach(tiny_model("llama"), ea.ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16,
                                                             xa_stride=4))
    model.save_pretrained(tmp_path / "plain", state_dict={k: v for k, v in model.state_dict().items()
                                                          if ".elastic_router." not in k})
    with pytest.raises(ea.AdapterMismatchError, match="without routers: pass router="):
        ea.from_pretrained(tmp_path / "plain", backend="reference")
    ea.save_pretrained(model, tmp_path / "plain" / "elastic_router")
    loaded = ea.from_pretrained(tmp_path / "plain", backend="reference")
    assert runtime_of(loaded).config == runtime_of(model).config
    with pytest.raises(ConfigError, match="block_size 8 \\(theirs: 128\\)"):
        ea.save_pretrained(model, tmp_path / "theirs", format="reference")  # block 8 cannot be written
    with pytest.raises(ConfigError, match="format must be 'adapter' or 'reference'"):
        ea.save_pretrained(model, tmp_path / "x", format="gguf")


def test_saving_over_an_earlier_save_leaves_no_stale_file_a_loader_prefers(tmp_path, monkeypatch):
    """Oracle: their checkpoint's own logits. An earlier sharded save (index + shards) under the same folder is
    replaced whole: a stale index naming deleted shards would load the base weights with random routers. A router
    adapter is never written into a model folder, where their loader would read the model's routers instead."""
    write_their_layout(tmp_path / "theirs", "qwen3")
    model = ea.from_pretrained(tmp_path / "theirs", backend="reference")
    ids = torch.randint(3, 97, (1, 300), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    target = tmp_path / "again"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-00001-of-00002"}}))
    (target / "model-00001-of-00002.safetensors").write_bytes(b"stale")
    ea.save_pretrained(model, target, format="reference")
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    with torch.no_grad():
        torch.testing.assert_close(ea.from_pretrained(target, backend="reference")(ids, use_cache=False).logits,
                                   logits, rtol=0, atol=0)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep")
    with pytest.raises(ConfigError, match="holds files but no config.json: it is not a saved model"):
        ea.save_pretrained(model, tmp_path / "notes", format="reference")
    with pytest.raises(ConfigError, match="holds files that are not a router adapter \\(config.json, "
                                          "generation_config.json, model.safetensors\\); a loader could read them"):
        ea.save_router(model, tmp_path / "theirs")
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep"

