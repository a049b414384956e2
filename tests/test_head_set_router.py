"""`HeadSetRouter` (``ElasticConfig.head_set_choices``): one choice per prompt among fixed head sets, taken from the
first routed layer's keys and applied in every routed layer; its straight-through choice, its adapter, and training
it from a head-set file on the sampled or the expected objective."""

import csv
import dataclasses
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import per_sample_routers, tiny_model
from safetensors.torch import load_file
from test_training import train_from_adapter, write_config

import elastic_attention as ea
from elastic_attention.errors import ConfigError
from elastic_attention.integration import force_head_set, runtime_of
from elastic_attention.reference_format import reference_fields
from elastic_attention.router.sampling import gumbel_noise, straight_through_one_hot
from elastic_attention.training import RouterTrainer, TrainConfig

CONFIG = ea.ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4, head_set_choices=3)
#: Three sets of a 3-layer, 2-KV-head model: all full, three heads full, all sparse.
SETS = torch.tensor([[[1, 1], [1, 1], [1, 1]], [[1, 0], [0, 1], [1, 0]], [[0, 0], [0, 0], [0, 0]]], dtype=torch.bool)


def test_straight_through_one_hot_is_the_argmax_forward_and_the_softmax_gradient_backward():
    logits = torch.randn(5, 4, dtype=torch.float32, requires_grad=True)
    noise = gumbel_noise(logits.shape, device=torch.device("cpu"), generator=torch.Generator().manual_seed(3))
    weights = torch.randn(5, 4)
    choice = straight_through_one_hot(logits, 0.7, noise)
    assert torch.equal(choice.detach(), torch.nn.functional.one_hot((logits + noise).argmax(-1), 4).float())
    (choice * weights).sum().backward()
    expected_logits = logits.detach().clone().requires_grad_(True)
    (torch.softmax((expected_logits + noise) / 0.7, -1) * weights).sum().backward()
    torch.testing.assert_close(logits.grad, expected_logits.grad)


def _attached(seed=0):
    model = tiny_model("llama", layers=3, seed=seed)
    ea.attach(model, CONFIG, backend="reference")
    (router,) = ea.routers_of(model).values()
    router.set_head_sets(SETS)
    per_sample_routers(model)
    return model, router


def _router_input(router, forward):
    """What ``router`` reads (its pooled keys) in the no-grad call ``forward()``, captured at its own call."""
    pooled = []
    hook = router.register_forward_pre_hook(lambda module, args: pooled.append(args[0]))
    try:
        with torch.no_grad():
            forward()
    finally:
        hook.remove()
    return pooled[0]


def _route(model, router, ids):
    """(decisions [N, layers, Hkv], the choices an independent reading of the router's logits makes)."""
    pooled = _router_input(router, lambda: model(input_ids=ids))
    with torch.no_grad():
        expected = router.logits(pooled).mean(dim=1).argmax(dim=-1)  # [N, Hkv, C] averaged over the heads
    return ea.routing_report(model).decisions, expected


def test_each_prompt_takes_one_set_in_every_routed_layer_whatever_its_batch():
    model, router = _attached()
    assert list(ea.routers_of(model)) == [0]  # one router, in the first routed layer
    ids = torch.randint(3, 90, (6, 40), generator=torch.Generator().manual_seed(5))
    decisions, expected = _route(model, router, ids)
    assert len(set(expected.tolist())) > 1  # the prompts do not all choose alike
    for row, choice in enumerate(expected.tolist()):
        assert torch.equal(decisions[row], SETS[choice])
        alone, _ = _route(model, router, ids[row : row + 1])
        assert torch.equal(alone[0], SETS[choice])
    report = ea.routing_report(model)
    assert report.layers == (0, 1, 2)


def test_an_adapter_carries_the_sets_and_routes_the_same(tmp_path):
    model, router = _attached()
    ids = torch.randint(3, 90, (6, 40), generator=torch.Generator().manual_seed(5))
    decisions, _ = _route(model, router, ids)
    ea.save_router(model, tmp_path / "adapter")
    assert load_file(tmp_path / "adapter" / "router.safetensors")["layers.0.head_sets"].bool().equal(SETS)
    fresh = tiny_model("llama", layers=3)
    ea.load_router(fresh, tmp_path / "adapter", backend="reference")
    (loaded,) = ea.routers_of(fresh).values()
    assert torch.equal(_route(fresh, loaded, ids)[0], decisions)
    with pytest.raises(ConfigError, match="head_set_choices 3 \\(their routers decide each KV head\\)"):
        reference_fields(CONFIG, "llama")
    with pytest.raises(ValueError, match="takes no pins"):
        loaded.pin_sparse(torch.tensor([True, False]))


def write_search(path, shape_path):
    """A head-set file of a 2-layer, 2-KV-head model: the kept set at MSR 0.5 and a greedy path of three heads."""
    path.write_text(json.dumps({"sets": [{"msr_asked": 0.5, "full_heads": [[True, False], [False, True]]}],
                                "path": shape_path}))
    return path


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient_checkpointing"])
def test_a_run_trains_a_head_set_router_from_a_search_file(tmp_path, random_suite_backbone, checkpointing):
    """Oracle: the sets worked out by hand from the file's path; the first choice's probability read from the
    router's bias; after training, every sample of every pack runs one of the sets, and the adapter carries them.
    With gradient checkpointing the later layers' decisions reach the choice made in a recomputed first layer."""
    search = write_search(tmp_path / "search.json", [[0, 1], [1, 0], [0, 0]])
    elastic = {"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8, "head_set_choices": 3,
               "router_standardize": True}
    config = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "run", elastic=elastic, steps=3,
                                                checkpoint_every=0, initial_full_heads=str(search),
                                                head_set_choices_msrs=[0.0, 0.75, 1.0], initial_full_probability=0.8,
                                                gradient_checkpointing=checkpointing))
    sets = torch.tensor([[[True, True], [True, True]], [[False, False], [False, True]],
                         [[False, False], [False, False]]])
    assert torch.equal(config.head_set_choices(), sets)
    assert torch.equal(config.head_set_choices((2, 2)), sets)
    with pytest.raises(ConfigError, match=r"sets of shape \[2, 2\] .* but the model routes \[3, 2\]"):
        config.head_set_choices((3, 2))
    trainer = RouterTrainer(config, progress=False)
    trainer.setup()
    (router,) = ea.routers_of(trainer.model).values()
    torch.testing.assert_close(torch.softmax(router.router_mlp[-1].bias.detach().double(), -1),
                               torch.tensor([0.8, 0.1, 0.1], dtype=torch.float64))
    before = [parameter.detach().clone() for parameter in router.parameters()]
    trainer.finish(trainer.train())
    assert any(not torch.equal(old, new) for old, new in zip(before, router.parameters()))
    saved = load_file(tmp_path / "run" / "router" / "router.safetensors")
    assert saved["layers.0.head_sets"].bool().equal(sets)
    from elastic_attention.training.trainer import forward_pack

    model = trainer.model.eval()
    with torch.no_grad():
        for pack in trainer.packs:
            forward_pack(model, pack, torch.device("cpu"), logits_to_keep=1)
            for decisions in ea.routing_report(model).decisions:
                assert any(torch.equal(decisions, head_set) for head_set in sets)


def test_a_target_between_two_sets_is_named_in_the_log(tmp_path, random_suite_backbone, caplog):
    """Oracle: the sets' MSRs by hand (0, 0.75, 1 over 4 entries; half an entry is 0.125): a target between two of
    them and farther than that from both is named with its neighbours; one within it of a set, or with a band, is
    not."""
    search = write_search(tmp_path / "search.json", [[0, 1], [1, 0], [0, 0]])
    elastic = {"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8, "head_set_choices": 3}
    config = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "run", elastic=elastic, steps=1,
                                                checkpoint_every=0, initial_full_heads=str(search),
                                                head_set_choices_msrs=[0.0, 0.75, 1.0]))
    tasks = sorted(config.targets)
    config = dataclasses.replace(config, targets={tasks[0]: 0.5, tasks[1]: 0.3})
    assert config.targets_between_sets([0.0, 0.75, 1.0], 4) == [
        f"target 0.5 of {tasks[0]} lies between the sets at MSR 0.000 and 0.750: its prompts meet it only by "
        "splitting between them; a target on a set's MSR is met by choosing that set",
        f"target 0.3 of {tasks[1]} lies between the sets at MSR 0.000 and 0.750: its prompts meet it only by "
        "splitting between them; a target on a set's MSR is met by choosing that set"]
    within = dataclasses.replace(config, targets={tasks[0]: 0.65, tasks[1]: 0.9})  # within 0.125 of 0.75, of 1
    assert within.targets_between_sets([0.0, 0.75, 1.0], 4) == []
    banded = dataclasses.replace(config, bounds={tasks[1]: (0.2, 0.4)})
    assert [line.split()[3] for line in banded.targets_between_sets([0.0, 0.75, 1.0], 4)] == [tasks[0]]
    trainer = RouterTrainer(config, progress=False)
    with caplog.at_level("WARNING", logger="elastic_attention.training.trainer"):
        trainer.setup()
    assert f"target 0.5 of {tasks[0]} lies between the sets at MSR 0.000 and 0.750" in caplog.text
    assert f"target 0.3 of {tasks[1]} lies between the sets at MSR 0.000 and 0.750" in caplog.text


def test_a_run_continues_a_head_set_router_from_its_adapter(tmp_path, random_suite_backbone):
    """Oracle: the first run's adapter file: the second run starts from exactly its tensors (the sets among them,
    with no `head_set_choices_msrs`), trains, and its adapter keeps the same sets."""
    search = write_search(tmp_path / "search.json", [[0, 1], [1, 0], [0, 0]])
    elastic = {"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8, "head_set_choices": 3,
               "router_standardize": True}
    first = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "first", elastic=elastic, steps=2,
                                               checkpoint_every=0, initial_full_heads=str(search),
                                               head_set_choices_msrs=[0.0, 0.75, 1.0], initial_full_probability=0.8))
    trainer = RouterTrainer(first, progress=False)
    trainer.setup()
    trainer.finish(trainer.train())
    adapter = load_file(tmp_path / "first" / "router" / "router.safetensors")
    second = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "second", elastic=elastic, steps=2,
                                                checkpoint_every=0, initial_router=str(tmp_path / "first" / "router")))
    assert second.head_set_choices() is None  # the sets come with the adapter
    train_from_adapter(second, adapter)
    continued = load_file(tmp_path / "second" / "router" / "router.safetensors")
    assert torch.equal(continued["layers.0.head_sets"], adapter["layers.0.head_sets"])
    assert any(not torch.equal(continued[name], adapter[name]) for name in adapter if "router_mlp" in name)

def test_head_set_choice_errors_name_the_fix(tmp_path):
    search = write_search(tmp_path / "search.json", [[0, 1], [1, 0], [0, 0]])
    choices = {"head_set_choices": 3}
    with pytest.raises(ConfigError, match="needs the sets to choose among: `head_set_choices_msrs`"):
        TrainConfig(model="m", elastic=choices)
    with pytest.raises(ConfigError, match="lists 2 sets but `elastic.head_set_choices` is 3: set it to 2"):
        TrainConfig(model="m", elastic=choices, initial_full_heads=str(search), head_set_choices_msrs=[0.0, 1.0])
    with pytest.raises(ConfigError, match="lists 3 sets but `elastic.head_set_choices` is None"):
        TrainConfig(model="m", initial_full_heads=str(search), head_set_choices_msrs=[0.0, 0.5, 1.0])
    with pytest.raises(ConfigError, match="takes its sets from `initial_full_heads`"):
        TrainConfig(model="m", elastic=choices, head_set_choices_msrs=[0.0, 0.5, 1.0])
    with pytest.raises(ConfigError, match="margin_limit acts on per-head routers"):
        TrainConfig(model="m", elastic=choices, initial_full_heads=str(search), head_set_choices_msrs=[0.0, 0.5, 1.0],
                    margin_limit=4.0)
    with pytest.raises(ConfigError, match="`head_set_choices_msrs` 0.9 is not among the sets"):
        TrainConfig(model="m", elastic=choices, initial_full_heads=str(search), head_set_choices_msrs=[0.0, 0.9, 1.0])
    with pytest.raises(ConfigError, match="`head_set_choices` must be at least 2"):
        ea.ElasticConfig(head_set_choices=1)


def test_extra_sets_from_another_search_file_follow_the_paths_sets(tmp_path, random_suite_backbone):
    """Oracle: the sets by hand: 0.0 and 1.0 of the first file, then the second file's path after one head (MSR
    0.25) and its kept set at 0.5; the adapter of a run carries the four."""
    search = write_search(tmp_path / "search.json", [[0, 1], [1, 0], [0, 0]])
    other = write_search(tmp_path / "multikey.json", [[1, 1], [0, 0], [1, 0]])
    elastic = {"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8, "head_set_choices": 4}
    config = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "run", elastic=elastic, steps=1,
                                                checkpoint_every=0, initial_full_heads=str(search),
                                                head_set_choices_msrs=[0.0, 1.0],
                                                head_set_choices_extra=[f"{other}@0.25", f"{other}@0.5"]))
    sets = torch.tensor([[[True, True], [True, True]], [[False, False], [False, False]],
                         [[True, True], [True, False]], [[True, False], [False, True]]])
    assert torch.equal(config.head_set_choices(), sets)
    trainer = RouterTrainer(config, progress=False)
    trainer.setup()
    trainer.finish(trainer.train())
    assert load_file(tmp_path / "run" / "router" / "router.safetensors")["layers.0.head_sets"].bool().equal(sets)


def test_extra_set_errors_name_the_fix(tmp_path):
    search = write_search(tmp_path / "search.json", [[0, 1], [1, 0], [0, 0]])
    wider = tmp_path / "wider.json"
    wider.write_text(json.dumps({"sets": [{"msr_asked": 0.5, "full_heads": [[True, False], [False, True],
                                                                             [True, False]]}]}))
    base = {"model": "m", "initial_full_heads": str(search), "head_set_choices_msrs": [0.0, 1.0]}
    with pytest.raises(ConfigError, match="`head_set_choices_msrs` and `head_set_choices_extra` list 3 sets but "
                                          "`elastic.head_set_choices` is 4: set it to 3"):
        TrainConfig(**base, elastic={"head_set_choices": 4}, head_set_choices_extra=[f"{search}@0.5"])
    with pytest.raises(ConfigError, match="adds sets after those of `head_set_choices_msrs`: give that too"):
        TrainConfig(model="m", elastic={"head_set_choices": 2}, initial_full_heads=str(search),
                    head_set_choices_extra=[f"{search}@0.5", f"{search}@1.0"])
    for entry in (str(search), f"{search}@half", "@0.5"):
        with pytest.raises(ConfigError, match="is not FILE@MSR"):
            TrainConfig(**base, elastic={"head_set_choices": 3}, head_set_choices_extra=[entry])
    with pytest.raises(ConfigError, match=r"holds sets of shape \[3, 2\], `initial_full_heads` \[2, 2\]"):
        TrainConfig(**base, elastic={"head_set_choices": 3}, head_set_choices_extra=[f"{wider}@0.5"])
    with pytest.raises(ConfigError, match="`head_set_choices_extra` 0.9 is not among the sets"):
        TrainConfig(**base, elastic={"head_set_choices": 3}, head_set_choices_extra=[f"{search}@0.9"])
    with pytest.raises(ConfigError, match=r"`head_set_choices_extra\[\*\]` must be a number in \[0, 1\], got 1.5"):
        TrainConfig(**base, elastic={"head_set_choices": 3}, head_set_choices_extra=[f"{search}@1.5"])


def test_the_evaluation_runs_a_head_set_adapter_beside_the_static_and_heads_modes(tmp_path):
    """An adapter whose two sets are every head full and every head sparse: in each elastic row every head is full on
    the same share of the samples (those that chose the first set), one minus the row's MSR; the static and heads
    modes run beside it."""
    from elastic_attention.assets import TINY_BACKBONE
    from elastic_attention.cli import main as cli_main
    from elastic_attention.evaluation.pipeline import load_backbone

    model, _ = load_backbone(TINY_BACKBONE, "cpu")
    shape = (model.config.num_hidden_layers, model.config.num_key_value_heads)
    ea.attach(model, ea.ElasticConfig(block_size=32, sink_tokens=32, local_tokens=128, xa_stride=8, head_set_choices=2))
    (router,) = ea.routers_of(model).values()
    router.set_head_sets(torch.stack([torch.ones(shape, dtype=torch.bool), torch.zeros(shape, dtype=torch.bool)]))
    ea.save_router(model, tmp_path / "adapter")
    heads = tmp_path / "heads.json"
    heads.write_text(json.dumps({"sets": [{"msr_asked": 0.5, "full_heads": [[layer % 2 == 0] * shape[1]
                                                                            for layer in range(shape[0])]}]}))
    assert cli_main(["eval", "--model", str(TINY_BACKBONE), "--router", str(tmp_path / "adapter"), "--modes",
                     "full,elastic,static,heads", "--head-set", str(heads), "--tasks", "local_recall,needle_single",
                     "--lengths", "600", "--samples", "2", "--device", "cpu", "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "eval.json").read_text())["results"]
    elastic = [row for row in rows if row["mode"] == "elastic"]
    assert len(elastic) == 2
    for row in elastic:
        shares = {share for layer in row["head_full_share"] for share in layer}
        assert len(shares) == 1 and abs(shares.pop() - (1.0 - row["msr"])) < 1e-6
    assert {row["mode"] for row in rows} == {"full", "elastic", "static", "heads"}
    assert all(row["msr"] == 0.5 for row in rows if row["mode"] == "heads")


def test_generation_keeps_each_prompts_set_in_the_bounded_cache():
    """A head-set router's choice, made at the prefill's first layer, sizes every layer's stores: each sequence's
    rings hold exactly its set's streaming heads, and greedy tokens equal those of the full cache (the oracle)."""
    from elastic_attention import ElasticCache
    from elastic_attention.integration import runtime_of

    ids = torch.randint(3, 90, (6, 40), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1:, :7] = 0  # left padding on all rows but the first
    results = {}
    for cache in ("bounded", "full"):
        model = tiny_model("llama", layers=3, seed=0)
        ea.attach(model, CONFIG, backend="reference", cache=cache)
        (router,) = ea.routers_of(model).values()
        router.set_head_sets(SETS)
        per_sample_routers(model)
        results[cache] = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False,
                                        return_dict_in_generate=True, output_scores=True, pad_token_id=0)
        runtime = runtime_of(model)
        decisions = torch.stack([runtime.decisions[layer] for layer in runtime.routed_layers], dim=1) > 0.5
        assert len({tuple(row.flatten().tolist()) for row in decisions}) > 1  # the prompts chose different sets
        assert all(any(torch.equal(row, head_set) for head_set in SETS) for row in decisions)
        if cache == "bounded":
            stored = results[cache].past_key_values
            assert isinstance(stored, ElasticCache)
            for layer in range(3):
                for n, store in enumerate(stored.layers[layer].sequences):
                    assert store.ring_heads.tolist() == (~decisions[n, layer]).nonzero().flatten().tolist()
    assert torch.equal(results["bounded"].sequences, results["full"].sequences)
    torch.testing.assert_close(torch.stack(results["bounded"].scores), torch.stack(results["full"].scores),
                               atol=1e-5, rtol=1e-5)


def test_a_forced_head_set_runs_that_set_for_every_prompt_and_keeps_what_the_router_reads():
    """Oracle: `force_routing` with the same set gives the same logits; what the router reads, captured at its own
    call in an unforced forward."""
    model, router = _attached()
    ids = torch.randint(3, 90, (5, 37), generator=torch.Generator().manual_seed(11))
    pooled = _router_input(router, lambda: model(input_ids=ids))
    routing = runtime_of(model).routing
    for index, head_set in enumerate(SETS):
        force_head_set(model, index)
        with torch.no_grad():
            forced_set = model(input_ids=ids).logits
        assert all(torch.equal(decisions, head_set) for decisions in ea.routing_report(model).decisions)
        torch.testing.assert_close(routing.set_router_input, pooled)
        force_head_set(model, None)
        ea.force_routing(model, head_set)
        with torch.no_grad():
            torch.testing.assert_close(forced_set, model(input_ids=ids).logits)
        ea.force_routing(model, None)
    with torch.no_grad():
        model(input_ids=ids)
    assert routing.set_router_input is None  # the router chose again
    with pytest.raises(ConfigError, match="head set 3 does not exist: the router chooses among sets 0 to 2"):
        force_head_set(model, 3)
    per_head = tiny_model("llama", layers=2)
    ea.attach(per_head, ea.ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4),
              backend="reference")
    with pytest.raises(ConfigError, match="needs a head-set router"):
        force_head_set(per_head, 0)


def _expected_trainer(tmp_path, backbone, lm_loss="cross_entropy", pooling=None, path=((0, 1), (1, 0), (0, 0)),
                      msrs=(0.0, 0.75, 1.0), **extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    search = write_search(tmp_path / "search.json", [list(head) for head in path])
    elastic = {"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8, "head_set_choices": 3,
               "router_standardize": True, **(pooling or {})}
    config = TrainConfig.from_yaml(write_config(tmp_path, backbone, "run", elastic=elastic, checkpoint_every=0,
                                                initial_full_heads=str(search), head_set_choices_msrs=list(msrs),
                                                initial_full_probability=0.5, head_set_objective="expected",
                                                lm_loss=lm_loss, **extra))
    trainer = RouterTrainer(config, progress=False)
    trainer.setup()
    return trainer


@pytest.mark.parametrize("lm_loss", ["cross_entropy", "distillation"])
def test_the_expected_objective_weighs_each_sets_loss_by_the_routers_softmax(tmp_path, random_suite_backbone,
                                                                              lm_loss):
    """Oracle, in float64: each set's per-sample losses from a pack forward under `force_routing` with that set, the
    router's logits from the pooled keys of an unforced forward; sum_n,c softmax(logits / T)[n, c] L[n, c] / K and
    the expected MSRs, and the gradient of that expression for the router's parameters."""
    from elastic_attention.training.trainer import LM_LOSSES, forward_pack

    trainer = _expected_trainer(tmp_path, random_suite_backbone, lm_loss)
    model, device = trainer.model, torch.device("cpu")
    (router,) = ea.routers_of(model).values()
    router.temperature = 0.7
    pack = max(trainer.packs, key=lambda pack: len(pack.tasks))
    assert len(pack.tasks) >= 2
    lm_loss_value, msr, per_sample, tokens = trainer._expected_pack_terms(pack)
    lm_loss_value.backward()
    gradients = [parameter.grad.clone() for parameter in router.parameters()]
    router.zero_grad()

    sets = router.head_sets.bool()
    losses = []
    for head_set in sets:
        ea.force_routing(model, head_set)
        with torch.no_grad():
            token_losses, samples = LM_LOSSES[lm_loss](model, pack, device)
        losses.append(torch.bincount(samples, weights=token_losses.double(), minlength=len(pack.tasks)))
    ea.force_routing(model, None)
    losses = torch.stack(losses, dim=1)
    pooled = _router_input(router, lambda: forward_pack(model.eval(), pack, device, logits_to_keep=1))
    probabilities = torch.softmax(router.choice_logits(pooled).double() / 0.7, dim=-1)
    expected = (probabilities * losses).sum() / tokens.sum()
    torch.testing.assert_close(lm_loss_value.double(), expected, rtol=1e-5, atol=1e-7)
    set_msr = 1.0 - sets.double().mean(dim=(1, 2))
    torch.testing.assert_close(msr.detach().double(), probabilities.detach() @ set_msr, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(per_sample, (probabilities.detach() * losses).sum(dim=1), rtol=1e-5, atol=1e-7)
    assert (losses[:, 2] - losses[:, 0]).abs().min() > 1e-3  # the sets' losses differ, so their weights matter
    expected.backward()
    for gradient, parameter in zip(gradients, router.parameters()):
        torch.testing.assert_close(gradient.double(), parameter.grad.double(), rtol=1e-4, atol=1e-8)

    # A second visit runs no forward and gives the same terms, through the router's current weights.
    model.train()
    forwards = []
    hook = model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        again = trainer._expected_pack_terms(pack)
    finally:
        hook.remove()
    assert not forwards and len(trainer.set_losses) == 1
    for first, second in zip((lm_loss_value, msr, per_sample, tokens), again):
        torch.testing.assert_close(second.detach(), first.detach())
    with torch.no_grad():
        router.router_mlp[-1].bias.add_(torch.tensor([0.0, 0.0, 2.0]))
    moved = trainer._expected_pack_terms(pack)[1]
    assert bool((moved > msr.detach()).all())  # more weight on the all-sparse set


def test_a_run_on_the_expected_objective_trains_the_router_and_logs_its_expectations(tmp_path,
                                                                                    random_suite_backbone):
    trainer = _expected_trainer(tmp_path, random_suite_backbone, steps=3)
    (router,) = ea.routers_of(trainer.model).values()
    before = [parameter.detach().clone() for parameter in router.parameters()]
    trainer.finish(trainer.train())
    assert any(not torch.equal(old, new) for old, new in zip(before, router.parameters()))
    assert runtime_of(trainer.model).routing.forced_set is None
    logged = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert len(logged) == 3
    for row in logged:
        values = [float(value) for key, value in row.items() if key.startswith("msr/") and value not in ("", "nan")]
        assert values and all(0.0 < value < 1.0 for value in values)  # expectations, never a single set's 0 or 1
        assert float(row["lm_loss"]) > 0


def test_the_expected_objective_errors_name_the_fix(tmp_path):
    search = write_search(tmp_path / "search.json", [[0, 1], [1, 0], [0, 0]])
    with pytest.raises(ConfigError, match="`head_set_objective` must be one of"):
        TrainConfig(model="m", head_set_objective="exact")
    with pytest.raises(ConfigError, match="set `elastic.head_set_choices`"):
        TrainConfig(model="m", head_set_objective="expected")
    with pytest.raises(ConfigError, match="use `distributed: ddp` or one GPU"):
        TrainConfig(model="m", elastic={"head_set_choices": 3}, initial_full_heads=str(search),
                    head_set_choices_msrs=[0.0, 0.75, 1.0], head_set_objective="expected", distributed="fsdp")


def test_a_run_given_the_set_losses_file_trains_the_same_router_without_a_backbone_forward(tmp_path,
                                                                                          random_suite_backbone):
    """Oracle: the run that computed the losses. A second run with the same settings and its file makes no forward
    of the backbone (calibration included) and ends with the same router weights, multipliers and metrics."""
    forwards = []
    original_setup = RouterTrainer.setup

    def counting_setup(self, *args, **kwargs):  # count every backbone forward from the model's loading on
        from transformers import PreTrainedModel

        hook = torch.nn.modules.module.register_module_forward_pre_hook(
            lambda module, inputs: forwards.append(1) if isinstance(module, PreTrainedModel) else None)
        try:
            original_setup(self, *args, **kwargs)
        finally:
            hook.remove()

    RouterTrainer.setup = counting_setup
    try:
        first = _expected_trainer(tmp_path / "a", random_suite_backbone, steps=4)
        assert forwards  # the control: its calibration runs the backbone
        first_summary = first.finish(first.train())
        written = Path(first_summary["set_losses"])
        assert written == tmp_path / "a" / "run" / "set_losses.safetensors"
        assert len(first.set_losses) == len(first.packs)
        forwards.clear()
        second = _expected_trainer(tmp_path / "b", random_suite_backbone, steps=4, set_losses_file=str(written))
    finally:
        RouterTrainer.setup = original_setup
    model_forwards = []
    hook = second.model.register_forward_pre_hook(lambda module, args: model_forwards.append(1))
    try:
        second.train()
    finally:
        hook.remove()
    assert not forwards and not model_forwards
    for old, new in zip(first.model.parameters(), second.model.parameters()):
        if old.requires_grad:
            torch.testing.assert_close(new, old, rtol=0, atol=0)
    torch.testing.assert_close(second.objective.lambda1, first.objective.lambda1, rtol=0, atol=0)
    assert [row["lm_loss"] for row in second.history] == [row["lm_loss"] for row in first.history]


def test_a_run_pooling_other_spans_keeps_the_files_losses_and_reads_its_router_inputs_again(tmp_path,
                                                                                            random_suite_backbone):
    """Oracle: a run pooling those spans that computes its packs' losses itself. Given the file of a run that pooled
    the default spans, a run pooling others keeps the file's losses and token counts and holds that run's inputs."""
    from safetensors import safe_open

    first = _expected_trainer(tmp_path / "a", random_suite_backbone, steps=1)
    written = first.finish(first.train())["set_losses"]
    with safe_open(written, "pt") as handle:
        assert json.loads(handle.metadata()["router_pooling"]) == [100, 100]
    spans = {"pool_first": 5, "pool_last": 3}
    own = _expected_trainer(tmp_path / "b", random_suite_backbone, steps=1, pooling=spans)
    own.train()
    read = _expected_trainer(tmp_path / "c", random_suite_backbone, steps=1, pooling=spans, set_losses_file=written)
    shared = [pack for pack in own.packs if id(pack) in own.set_losses]
    assert shared
    for index, pack in enumerate(own.packs):
        if id(pack) not in own.set_losses:
            continue
        losses, router_input, tokens = own.set_losses[id(pack)]
        file_losses, file_input, file_tokens = first.set_losses[id(first.packs[index])]
        read_losses, read_input, read_tokens = read.set_losses[id(read.packs[index])]
        torch.testing.assert_close(read_losses, file_losses, rtol=0, atol=0)
        torch.testing.assert_close(losses, file_losses, rtol=1e-5, atol=1e-5)  # the losses ignore the pooling
        assert torch.equal(read_tokens, tokens) and torch.equal(file_tokens, tokens)
        torch.testing.assert_close(read_input, router_input, rtol=1e-6, atol=1e-6)
        assert not torch.allclose(file_input, router_input)  # the control: other spans, other inputs


def test_a_set_losses_file_of_other_packs_or_sets_is_refused(tmp_path, random_suite_backbone):
    first = _expected_trainer(tmp_path / "a", random_suite_backbone, steps=1)
    written = first.finish(first.train())["set_losses"]
    with pytest.raises(ConfigError, match="was written for other packs .* same model, data settings and tokenizer"):
        _expected_trainer(tmp_path / "b", random_suite_backbone, steps=1, set_losses_file=written,
                          data={"tasks": ["needle_single", "local_recall"], "lengths": [200, 260], "rows": 16,
                                "budget": 600, "seed": 5})  # write_config's data but for the seed
    with pytest.raises(ConfigError, match="`set_losses_file` .* is not a file"):
        _expected_trainer(tmp_path / "c", random_suite_backbone, set_losses_file=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="holds the losses of `head_set_objective: expected`"):
        TrainConfig(model="m", set_losses_file=written)
    with pytest.raises(ConfigError, match=r"sets of MSR \[0.0, 0.75, 1.0\], this run's sets have \[0.0, 0.5, 1.0\]"):
        _expected_trainer(tmp_path / "d", random_suite_backbone, steps=1, set_losses_file=written, msrs=(0.0, 0.5, 1.0))


def test_a_set_losses_file_of_other_heads_at_the_same_msrs_is_refused_unless_it_predates_set_digests(
        tmp_path, random_suite_backbone, caplog):
    """Oracle: the sets worked out from the two paths by hand. The last head of the path differs, so the middle set
    (MSR 0.75) runs head (1, 1) full in one run and head (0, 0) in the other; the MSRs alone cannot tell them apart."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    first = _expected_trainer(tmp_path / "a", random_suite_backbone, steps=1)
    written = first.finish(first.train())["set_losses"]
    other_path = ((0, 1), (1, 0), (1, 1))
    with pytest.raises(ConfigError, match=r"other head sets than this run's at set \[1\] \(same MSRs, other heads\)"):
        _expected_trainer(tmp_path / "b", random_suite_backbone, steps=1, set_losses_file=written, path=other_path)

    with safe_open(written, "pt") as handle:  # a file written before the sets' digests were recorded
        metadata = {key: value for key, value in handle.metadata().items() if key != "set_digests"}
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    older = tmp_path / "older.safetensors"
    save_file(tensors, str(older), metadata=metadata)
    with caplog.at_level("WARNING", logger="elastic_attention.training.set_losses"):
        read = _expected_trainer(tmp_path / "c", random_suite_backbone, steps=1, set_losses_file=str(older),
                                 path=other_path)
    assert len(read.set_losses) == len(first.set_losses)
    assert "records no digests of its head sets" in caplog.text  # said, not silent



@pytest.mark.parametrize("budget", [1100, 300], ids=["steps_fit", "first_visits_spend_it"])
def test_first_visit_forwards_spend_the_budget_but_do_not_run_the_schedules_ahead(tmp_path, random_suite_backbone,
                                                                                 monkeypatch, budget):
    """Fake clock: under the expected objective each pack's first visit takes 200 s, each step 1 s more, 6 steps of
    one pack. Oracle: the clock replayed by hand and the rule written out: the steps' own seconds over what the budget
    leaves them once every first visit is paid (those ahead at the mean cost so far), or, when the first visits alone
    would spend it, the share of the budget spent. With 1100 s the run ends by its steps and its schedules stay on
    them, where taking the first visits as the steps' pace (elapsed / 1100 * 6) would have run ahead; with 300 s the
    budget stops it in the first epoch and the schedules follow the share spent."""
    from elastic_attention.training import train
    from elastic_attention.training import trainer as trainer_module

    clock = [0.0]
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    one_step, first_visit = trainer_module.RouterTrainer.train_step, trainer_module.RouterTrainer._pack_under_each_set

    def one_second_step(self):
        clock[0] += 1.0
        return one_step(self)

    def slow_first_visit(self, pack):
        clock[0] += 200.0
        return first_visit(self, pack)

    monkeypatch.setattr(trainer_module.RouterTrainer, "train_step", one_second_step)
    monkeypatch.setattr(trainer_module.RouterTrainer, "_pack_under_each_set", slow_first_visit)
    search = write_search(tmp_path / "search.json", [[0, 1], [1, 0], [0, 0]])
    config = TrainConfig.from_yaml(write_config(
        tmp_path, random_suite_backbone, "visits", steps=6, max_seconds=budget, lr_schedule="cosine",
        warmup_fraction=0.0, packs_per_step=1, checkpoint_every=0, initial_full_heads=str(search),
        head_set_choices_msrs=[0.0, 0.75, 1.0], head_set_objective="expected",
        data={"tasks": ["needle_single", "local_recall"], "lengths": [200, 260], "rows": 4, "budget": 600},
        elastic={"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8, "head_set_choices": 3}))
    summary = train(config, progress=False)
    packs = summary["packs_run_under_each_set"]
    assert 2 <= packs <= 4
    elapsed, visits, positions, paced = 0.0, 0, [], []
    for step in range(6):  # the clock as the trainer reads it before each step (every pack is first seen by step 4)
        if elapsed >= budget:
            break
        pending = 200.0 * (packs - visits) if visits else 0.0
        left = budget - 200.0 * visits - pending
        positions.append(max(step, elapsed / budget * 6) if left <= 0 else
                         max(step, (elapsed - 200.0 * visits) / left * 6))
        paced.append(max(step, elapsed / budget * 6))
        if step < packs:  # each step of the first epoch visits a new pack
            visits, elapsed = visits + 1, elapsed + 200.0
        elapsed += 1.0
    assert summary["steps"] == len(positions) and summary["first_visit_seconds"] == 200.0 * visits
    if budget == 1100:
        assert positions == pytest.approx(list(range(6)))
        assert all(paced[step] > step for step in range(1, packs + 1))
    else:
        assert summary["stopped_by"] == "max_seconds" and positions[-1] > len(positions)
    rows = list(csv.DictReader((tmp_path / "visits" / "metrics.csv").open()))
    assert [float(row["temperature"]) for row in rows] == pytest.approx(
        [config.temperature.at(position, 6) for position in positions])
    assert [float(row["lr"]) for row in rows] == pytest.approx(
        [config.router_lr * 0.5 * (1 + math.cos(math.pi * position / 6)) for position in positions])


def test_a_checkpoint_carries_the_first_visits_and_a_resume_counts_on_from_them(tmp_path, random_suite_backbone,
                                                                                monkeypatch):
    """Fake clock, each first visit 10 s: the checkpoint of step 2 holds the two visits so far (20 s), and the resumed
    run, whose step 2 computes its pack's set losses again (they are not in the checkpoint), counts on from there
    (30 s); a resume that dropped them would report 10 s."""
    from elastic_attention.training import train
    from elastic_attention.training import trainer as trainer_module

    clock = [0.0]
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    first_visit = trainer_module.RouterTrainer._pack_under_each_set

    def ten_second_visit(self, pack):
        clock[0] += 10.0
        return first_visit(self, pack)

    monkeypatch.setattr(trainer_module.RouterTrainer, "_pack_under_each_set", ten_second_visit)
    search = write_search(tmp_path / "search.json", [[0, 1], [1, 0], [0, 0]])
    config = TrainConfig.from_yaml(write_config(
        tmp_path, random_suite_backbone, "resume", steps=3, max_seconds=1000, packs_per_step=1, checkpoint_every=1,
        initial_full_heads=str(search), head_set_choices_msrs=[0.0, 0.75, 1.0], head_set_objective="expected",
        data={"tasks": ["needle_single", "local_recall"], "lengths": [200, 260], "rows": 4, "budget": 600},
        elastic={"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8, "head_set_choices": 3}))
    first = train(config, progress=False)
    assert first["first_visit_seconds"] == 10.0 * min(3, first["packs_run_under_each_set"])
    saved = json.loads((tmp_path / "resume" / "checkpoints" / "step-000002" / "state.json").read_text())
    assert (saved["first_visits"], saved["first_visit_seconds"]) == (2, 20.0)
    shutil.rmtree(tmp_path / "resume" / "router")
    (tmp_path / "resume" / "summary.json").unlink()
    shutil.rmtree(tmp_path / "resume" / "checkpoints" / "step-000003")  # as the run left it before its last step
    (tmp_path / "resume" / "checkpoints" / "latest").write_text("step-000002")
    resumed = train(config, resume=True, progress=False)
    assert resumed["steps"] == 3 and resumed["first_visit_seconds"] == 30.0
