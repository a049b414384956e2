"""Router adapters: round trip, import of the reference implementation's checkpoints, refusals."""

import dataclasses
import hashlib
import json

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import load_file, save_file

import elastic_attention as ea
from elastic_attention import AdapterMismatchError, ElasticConfig

CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4, pool_first=6, pool_last=6)


def router_state(model):
    return {f"{i}.{k}": v.clone() for i, r in ea.routers_of(model).items() for k, v in r.state_dict().items()}


@pytest.mark.parametrize("config", [CONFIG, dataclasses.replace(CONFIG, router_standardize=True)],
                         ids=["paper", "standardize"])
def test_round_trip_restores_routers_and_routing(tmp_path, config):
    model = ea.attach(tiny_model("qwen3"), config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.normal_()
        for router in ea.routers_of(model).values():
            for buffer in router.buffers():  # a standardizing router's statistics
                buffer.uniform_(0.5, 2.0)
    ids = torch.randint(1, 97, (2, 33))
    with torch.no_grad():
        model(ids)
    expected = ea.routing_report(model).decisions
    ea.save_router(model, tmp_path / "adapter")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["elastic_config.json", "router.safetensors"]
    fresh = tiny_model("qwen3")
    ea.load_router(fresh, tmp_path / "adapter")
    assert ea.integration.runtime_of(fresh).config == config
    for name, value in router_state(model).items():
        torch.testing.assert_close(router_state(fresh)[name], value)
    with torch.no_grad():
        fresh(ids)
    assert torch.equal(ea.routing_report(fresh).decisions, expected)


def test_pinned_heads_travel_with_the_adapter(tmp_path):
    """Oracle: the routing of the model the pins were set on (pinned heads sparse on every input), and the unpinned
    routing of the same weights, through save and load in both directions."""
    config = dataclasses.replace(CONFIG, router_standardize=True)
    model = ea.attach(tiny_model("qwen3"), config)
    torch.manual_seed(0)
    for router in ea.routers_of(model).values():
        router.set_full_probability(0.99)  # every head full unless pinned
    ids = torch.randint(1, 97, (3, 33))
    with torch.no_grad():
        model(ids)
    unpinned = ea.routing_report(model).decisions
    assert unpinned.all()
    ea.save_router(model, tmp_path / "free")
    layers = sorted(ea.routers_of(model))
    pins = {index: torch.tensor([row % 2 == 0, row % 2 == 1]) for row, index in enumerate(layers)}
    for index, router in ea.routers_of(model).items():
        router.pin_sparse(pins[index])
    with torch.no_grad():
        model(ids)
    pinned = ea.routing_report(model).decisions
    assert torch.equal(pinned, unpinned * ~torch.stack([pins[i] for i in layers])[None])
    ea.save_router(model, tmp_path / "pinned")
    saved = load_file(tmp_path / "pinned" / "router.safetensors")
    assert saved[f"layers.{layers[0]}.pinned_sparse"].tolist() == [1.0, 0.0]
    assert not any("pinned" in key for key in load_file(tmp_path / "free" / "router.safetensors"))
    fresh = tiny_model("qwen3")
    for adapter, expected in (("pinned", pinned), ("free", unpinned), ("pinned", pinned)):
        ea.load_router(fresh, tmp_path / adapter)  # each adapter's pins replace the model's
        with torch.no_grad():
            fresh(ids)
        assert torch.equal(ea.routing_report(fresh).decisions, expected), adapter
    tensors = dict(saved)
    tensors[f"layers.{layers[0]}.pinned_sparse"] = torch.ones(3)
    save_file(tensors, tmp_path / "bad.safetensors")
    with pytest.raises(AdapterMismatchError, match="pinned_sparse .* has shape \\[3\\].*one flag per KV head \\(2\\)"):
        ea.adapters.load_router_tensors(ea.routers_of(fresh), tensors, source=tmp_path / "bad.safetensors")


def test_routers_never_run_under_settings_they_were_not_trained_with(tmp_path):
    model = ea.attach(tiny_model("llama"), CONFIG)
    ea.save_router(model, tmp_path)
    other = dataclasses.replace(CONFIG, sink_tokens=0, local_tokens=24, configuration="fa-xa")
    target = ea.attach(tiny_model("llama", seed=1), other, backend="reference")
    before = router_state(target)
    with pytest.raises(AdapterMismatchError) as refused:
        ea.load_router(target, tmp_path)
    message = str(refused.value)
    for field in ("configuration='fa-ssa'", "sink_tokens=8", "local_tokens=16", "reattach=True"):
        assert field in message
    assert "block_size" not in message  # only the fields that differ
    assert ea.integration.runtime_of(target).config == other
    assert all(torch.equal(before[name], value) for name, value in router_state(target).items())
    ea.load_router(target, tmp_path, reattach=True)
    runtime = ea.integration.runtime_of(target)
    assert runtime.config == CONFIG and runtime.backend.name == "reference"
    for name, value in router_state(model).items():
        torch.testing.assert_close(router_state(target)[name], value)
    # The same configuration loads without re-attaching.
    ea.load_router(target, tmp_path)


def test_a_failed_load_leaves_the_model_as_it_was(tmp_path):
    ea.save_router(ea.attach(tiny_model("llama"), CONFIG), tmp_path)
    weights = load_file(tmp_path / "router.safetensors")
    save_file({name: value for name, value in weights.items() if name != "layers.1.router_mlp.4.bias"},
              tmp_path / "router.safetensors")
    document = json.loads((tmp_path / "elastic_config.json").read_text())
    del document["weights_sha256"]  # a consistent adapter that lacks a tensor, not a damaged file
    (tmp_path / "elastic_config.json").write_text(json.dumps(document))
    plain = tiny_model("llama")
    with pytest.raises(AdapterMismatchError, match="missing \\['layers.1.router_mlp.4.bias'\\]"):
        ea.load_router(plain, tmp_path)
    assert not ea.is_attached(plain)
    other = dataclasses.replace(CONFIG, local_tokens=24)
    attached = ea.attach(tiny_model("llama", seed=2), other, backend="reference")
    before = router_state(attached)
    with pytest.raises(AdapterMismatchError, match="missing"):
        ea.load_router(attached, tmp_path, reattach=True)
    runtime = ea.integration.runtime_of(attached)
    assert runtime.config == other and runtime.backend.name == "reference"
    assert all(torch.equal(before[name], value) for name, value in router_state(attached).items())


def test_adapter_for_another_shape_or_family_is_refused(tmp_path):
    ea.save_router(ea.attach(tiny_model("llama", head_dim=16), CONFIG), tmp_path)
    with pytest.raises(AdapterMismatchError, match="head_dim=16.*head_dim=32"):
        ea.load_router(tiny_model("llama", head_dim=32), tmp_path)
    with pytest.raises(AdapterMismatchError, match="model_type='llama'.*model_type='qwen2'"):
        ea.load_router(tiny_model("qwen2"), tmp_path)
    with pytest.raises(AdapterMismatchError, match="num_hidden_layers"):
        ea.load_router(tiny_model("llama", layers=3), tmp_path)
    document = json.loads((tmp_path / "elastic_config.json").read_text())
    document["format_version"] = 7
    (tmp_path / "elastic_config.json").write_text(json.dumps(document))
    with pytest.raises(AdapterMismatchError, match="format_version 7"):
        ea.load_router(tiny_model("llama"), tmp_path)
    with pytest.raises(FileNotFoundError):
        ea.load_router(tiny_model("llama"), tmp_path / "nothing")


def reference_state_dict(layers, head_dim, width=4, seed=0):
    """Router weights in the naming of the authors' reference implementation, plus backbone tensors around them."""
    generator = torch.Generator().manual_seed(seed)
    hidden = width * head_dim
    shapes = {
        "cls_feat_extractor.0": (hidden, head_dim),
        "cls_feat_extractor.2": (head_dim, hidden),
        "cls_router_head_agnostic.0": (hidden, head_dim),
        "cls_router_head_agnostic.2": (head_dim, hidden),
        "cls_router_head_agnostic.4": (2, head_dim),
    }
    state = {"model.embed_tokens.weight": torch.randn(97, 64, generator=generator)}
    for layer in layers:
        prefix = f"model.layers.{layer}.self_attn.mask_allocator"
        for part, shape in shapes.items():
            state[f"{prefix}.{part}.weight"] = torch.randn(shape, generator=generator)
            state[f"{prefix}.{part}.bias"] = torch.randn(shape[0], generator=generator)
        state[f"model.layers.{layer}.self_attn.k_proj.weight"] = torch.randn(32, 64, generator=generator)
    return state


def test_reference_checkpoint_import(tmp_path):
    state = reference_state_dict([0, 1], head_dim=16)
    save_file(state, tmp_path / "model.safetensors")
    model = tiny_model("llama")
    ea.load_router(model, tmp_path / "model.safetensors")
    routers = ea.routers_of(model)
    torch.testing.assert_close(
        routers[1].task_mlp[2].weight, state["model.layers.1.self_attn.mask_allocator.cls_feat_extractor.2.weight"]
    )
    torch.testing.assert_close(
        routers[0].router_mlp[4].bias,
        state["model.layers.0.self_attn.mask_allocator.cls_router_head_agnostic.4.bias"],
    )
    # Class 1 means full attention in both implementations: the same logits give the same decision.
    pooled = torch.randn(3, 2, 16)
    prefix = "model.layers.0.self_attn.mask_allocator"
    features = torch.nn.functional.linear(pooled, state[f"{prefix}.cls_feat_extractor.0.weight"],
                                          state[f"{prefix}.cls_feat_extractor.0.bias"])
    features = torch.nn.functional.linear(torch.nn.functional.silu(features),
                                          state[f"{prefix}.cls_feat_extractor.2.weight"],
                                          state[f"{prefix}.cls_feat_extractor.2.bias"])
    hidden = features
    for index in (0, 2, 4):
        hidden = torch.nn.functional.linear(hidden, state[f"{prefix}.cls_router_head_agnostic.{index}.weight"],
                                            state[f"{prefix}.cls_router_head_agnostic.{index}.bias"])
        if index != 4:
            hidden = torch.nn.functional.silu(hidden)
    routers[0].eval()
    assert torch.equal(routers[0](pooled), (hidden.argmax(-1) == 1).float())


def test_reference_checkpoint_of_a_subset_of_layers_in_shards(tmp_path):
    state = reference_state_dict([1], head_dim=16, width=2)
    save_file({k: v for k, v in state.items() if "feat" in k}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({k: v for k, v in state.items() if "feat" not in k}, tmp_path / "model-00002-of-00002.safetensors")
    model = tiny_model("llama")
    ea.load_router(model, tmp_path)
    config = ea.integration.runtime_of(model).config
    assert config.routed_layers == (1,) and config.router_width == 2


def test_reference_checkpoint_refusals(tmp_path):
    save_file(reference_state_dict([0, 1], head_dim=32), tmp_path / "wide.safetensors")
    with pytest.raises(AdapterMismatchError, match="head_dim 32, but this model has head_dim 16"):
        ea.load_router(tiny_model("llama"), tmp_path / "wide.safetensors")
    save_file(reference_state_dict([0, 5], head_dim=16), tmp_path / "deep.safetensors")
    with pytest.raises(AdapterMismatchError, match="layers up to 5"):
        ea.load_router(tiny_model("llama"), tmp_path / "deep.safetensors")
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, tmp_path / "plain.safetensors")
    with pytest.raises(AdapterMismatchError, match="no router weights"):
        ea.load_router(tiny_model("llama"), tmp_path / "plain.safetensors")


def test_adapter_files_are_checked_and_named(tmp_path):
    ea.save_router(ea.attach(tiny_model("llama"), CONFIG), tmp_path)
    config_path, weights_path = tmp_path / "elastic_config.json", tmp_path / "router.safetensors"
    assert len(json.loads(config_path.read_text())["weights_sha256"]) == 64
    good_weights, good_config = weights_path.read_bytes(), config_path.read_text()
    cases = [
        (lambda: weights_path.write_bytes(good_weights[:-40]), "router.safetensors does not match the checksum"),
        (lambda: weights_path.write_bytes(good_weights[:-1] + bytes([good_weights[-1] ^ 1])), "does not match the checksum"),
        (lambda: config_path.unlink(), "has router.safetensors but no elastic_config.json"),
        (lambda: config_path.write_text("{not json"), "elastic_config.json is not JSON"),
        (lambda: config_path.write_text("{}"), "has no `elastic_config` section"),
        (lambda: weights_path.unlink(), "has no router.safetensors"),
    ]
    for damage, message in cases:
        weights_path.write_bytes(good_weights)
        config_path.write_text(good_config)
        damage()
        model = tiny_model("llama")
        with pytest.raises(AdapterMismatchError, match=message):
            ea.load_router(model, tmp_path)
        assert not ea.is_attached(model)
    # Without a checksum (an adapter of an earlier release) a truncated file is still named.
    document = json.loads(good_config)
    del document["weights_sha256"]
    config_path.write_text(json.dumps(document))
    weights_path.write_bytes(good_weights[:-40])
    with pytest.raises(AdapterMismatchError, match="cannot read .*router.safetensors as safetensors"):
        ea.load_router(tiny_model("llama"), tmp_path)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_router_weights_are_refused_on_save_and_on_load(tmp_path, value):
    """A diverged run's weights: saving them writes nothing, loading them (with a valid checksum, as a run would have
    saved them before this check) attaches nothing; both name the tensor."""
    from safetensors.torch import save as safetensors_bytes

    model = ea.attach(tiny_model("llama"), CONFIG)
    name, parameter = next(iter(ea.routers_of(model)[1].named_parameters()))
    with torch.no_grad():
        parameter.view(-1)[3] = value
    with pytest.raises(AdapterMismatchError, match=f"refusing to save the routers: layers.1.{name} holds 1 NaN or "
                                                   f"Inf value"):
        ea.save_router(model, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()
    with torch.no_grad():
        parameter.view(-1)[3] = 0.0
    ea.save_router(model, tmp_path / "adapter")
    weights = load_file(tmp_path / "adapter" / "router.safetensors")
    weights[f"layers.1.{name}"].view(-1)[3] = value
    data = safetensors_bytes(weights, metadata={"format": "elastic-attention"})
    (tmp_path / "adapter" / "router.safetensors").write_bytes(data)
    document = json.loads((tmp_path / "adapter" / "elastic_config.json").read_text())
    document["weights_sha256"] = hashlib.sha256(data).hexdigest()
    (tmp_path / "adapter" / "elastic_config.json").write_text(json.dumps(document))
    fresh = tiny_model("llama")
    with pytest.raises(AdapterMismatchError, match=f"layers.1.{name} holds 1 NaN or Inf value"):
        ea.load_router(fresh, tmp_path / "adapter")
    assert not ea.is_attached(fresh)


def test_save_router_replaces_another_adapter_only_when_told(tmp_path):
    model = ea.attach(tiny_model("llama"), CONFIG)
    ea.save_router(model, tmp_path / "adapter")
    ea.save_router(model, tmp_path / "adapter")  # the same weights: nothing to lose
    with torch.no_grad():
        next(ea.routers_of(model)[0].parameters()).add_(1.0)
    with pytest.raises(ea.ConfigError, match="holds another router adapter; pass overwrite=True"):
        ea.save_router(model, tmp_path / "adapter")
    ea.save_router(model, tmp_path / "adapter", overwrite=True)
    fresh = ea.load_router(tiny_model("llama"), tmp_path / "adapter")
    torch.testing.assert_close(next(ea.routers_of(fresh)[0].parameters()), next(ea.routers_of(model)[0].parameters()))
