"""The retrieval-signal teacher: its targets against the signal measured on the plain model, its loss against a
per-row rule, and training on it alone moving the routers toward its targets."""

from __future__ import annotations

import pytest
import torch
import yaml
from conftest import tiny_model

import elastic_attention as ea
from elastic_attention.patterns import SequenceLayout
from elastic_attention.router.retrieval_signal import retrieval_signal
from elastic_attention.training.data import Pack
from elastic_attention.training.signal_teacher import sparsest_covering_set, teacher_loss, teacher_targets

ELASTIC = dict(block_size=4, sink_tokens=4, local_tokens=8, xa_stride=4, signal_queries=5)


def _pack(lengths, prompts, seed=0):
    """A pack of random samples of ``lengths`` tokens, the first ``prompts`` of each its prompt."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (sum(lengths),), generator=generator)
    positions = torch.cat([torch.arange(length) for length in lengths])
    starts = [sum(lengths[:index]) for index in range(len(lengths))]
    labels = torch.full_like(ids, -100)
    for start, length, prompt in zip(starts, lengths, prompts):
        labels[start + prompt : start + length] = ids[start + prompt : start + length]
    return Pack(input_ids=ids, labels=labels, position_ids=positions, tasks=tuple("t" for _ in lengths),
                spans=tuple(zip(starts, lengths, prompts)))


def _plain_signals(pack, layers=3):
    """[N, layers, Hkv] the signal of every layer, on the plain (not attached) model's own queries and keys, each
    sample alone (its prompt only)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model = tiny_model("llama", layers=layers)
    seen = {}

    def capture(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        seen[module.layer_idx] = (query, key, scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)

    AttentionInterface.register("capture_teacher_test", capture)
    model.set_attn_implementation("capture_teacher_test")
    rows = []
    for start, length, prompt in pack.spans:
        with torch.no_grad():
            model(input_ids=pack.input_ids[None, start : start + length])
        layout = SequenceLayout.dense(1, length)
        rows.append(torch.stack([retrieval_signal(*seen[layer][:2], layout, seen[layer][2], queries=5, block_size=4,
                                                  sink_tokens=4, local_tokens=8, prompt_lengths=[prompt])[0]
                                 for layer in range(layers)]))
    return torch.stack(rows)


def test_the_targets_are_the_signal_of_each_samples_prompt_under_full_attention():
    pack = _pack([37, 29, 41], [30, 29, 33])
    expected = _plain_signals(pack)
    model = tiny_model("llama", layers=3)
    ea.attach(model, ea.ElasticConfig(**ELASTIC), backend="reference")
    threshold = float(expected.flatten().sort().values[expected.numel() // 2])
    inputs, needed = teacher_targets(model, pack, torch.device("cpu"), threshold)
    assert torch.equal(needed, expected >= threshold)
    assert 0 < int(needed.sum()) < needed.numel()
    assert sorted(inputs) == [0, 1, 2] and inputs[0].shape == (3, 2, 16)
    assert ea.routing_report(model).msr.max() == 0.0 and ea.integration.runtime_of(model).routing.forced is None



def test_the_per_prompt_teacher_needs_every_head_of_a_prompt_whose_layer_signal_reaches_the_threshold():
    pack = _pack([37, 29, 41, 23, 31], [30, 29, 33, 20, 17], seed=4)
    expected = _plain_signals(pack)  # [N, layers, Hkv]
    model = tiny_model("llama", layers=3)
    ea.attach(model, ea.ElasticConfig(**ELASTIC), backend="reference")
    prompt_signal = [max(float(value) for value in expected[row, 1]) for row in range(5)]  # layer 1, per prompt
    threshold = sorted(prompt_signal)[2]
    _, needed = teacher_targets(model, pack, torch.device("cpu"), threshold, layer=1)
    assert needed.shape == (5, 3, 2)
    for row in range(5):
        assert bool(needed[row].all()) == (prompt_signal[row] >= threshold) and bool(needed[row].any()) == bool(
            needed[row].all())
    assert 0 < int(needed[:, 0, 0].sum()) < 5
    with pytest.raises(ea.ConfigError, match="`signal_teacher_layer` 3 is not a routed layer"):
        teacher_targets(model, pack, torch.device("cpu"), threshold, layer=3)

def test_per_head_routers_learn_the_teachers_heads():
    """Oracle: the cross-entropy of each head's logits against its target, written per head; then training on it
    alone makes the routers' argmax agree with the targets on the pack it saw."""
    pack = _pack([37, 29, 41], [30, 29, 33], seed=1)
    model = tiny_model("llama", layers=3)
    ea.attach(model, ea.ElasticConfig(**ELASTIC), backend="reference")
    expected = _plain_signals(pack)
    inputs, needed = teacher_targets(model, pack, torch.device("cpu"), float(expected.median()))
    routers = ea.routers_of(model)
    loss, msr = teacher_loss(model, inputs, needed)
    slow, count = 0.0, 0
    for n in range(3):
        for position, layer in enumerate(sorted(routers)):
            logits = routers[layer].logits(inputs[layer])[n].detach().double()
            for head in range(2):
                slow -= float(torch.log_softmax(logits[head], -1)[int(needed[n, position, head])])
                count += 1
    assert float(loss.detach()) == pytest.approx(slow / count, rel=1e-5)
    assert msr.shape == (3,)
    optimizer = torch.optim.Adam([p for r in routers.values() for p in r.parameters()], lr=0.01)
    for _ in range(150):
        optimizer.zero_grad()
        teacher_loss(model, inputs, needed)[0].backward()
        optimizer.step()
    chosen = torch.stack([routers[layer].logits(inputs[layer]).argmax(-1) for layer in sorted(routers)], dim=1)
    assert torch.equal(chosen.bool(), needed)


#: Head sets of a 3-layer, 2-KV-head model: with every head full (every prompt has a covering set), and without.
WITH_FULL = [[[1, 1], [1, 1], [1, 1]], [[1, 0], [0, 1], [1, 1]], [[0, 0], [0, 0], [0, 0]]]
WITHOUT_FULL = [[[1, 0], [1, 1], [0, 1]], [[1, 0], [0, 1], [0, 0]], [[0, 0], [0, 0], [0, 0]]]


@pytest.mark.parametrize("sets", [WITH_FULL, WITHOUT_FULL], ids=["with the full set", "without"])
def test_a_head_set_router_learns_the_sparsest_set_that_keeps_the_needed_heads(sets):
    pack = _pack([37, 29, 41, 23], [30, 29, 33, 20], seed=2)
    expected = _plain_signals(pack)
    model = tiny_model("llama", layers=3)
    ea.attach(model, ea.ElasticConfig(**ELASTIC, head_set_choices=3), backend="reference")
    (router,) = ea.routers_of(model).values()
    sets = torch.tensor(sets, dtype=torch.bool)
    router.set_head_sets(sets)
    inputs, needed = teacher_targets(model, pack, torch.device("cpu"), float(expected.quantile(0.6)))

    def slow_target(row):
        covering = [index for index in range(3) if not bool((needed[row] & ~sets[index]).any())]
        msrs = [1 - float(sets[index].float().mean()) for index in range(3)]
        return max(covering, key=lambda index: msrs[index]) if covering else min(range(3), key=lambda i: msrs[i])

    targets = torch.tensor([slow_target(row) for row in range(4)])
    assert len(set(targets.tolist())) > 1
    uncovered = [row for row in range(4) if all(bool((needed[row] & ~sets[index]).any()) for index in range(3))]
    assert bool(uncovered) == (sets.sum(dim=(1, 2)).max() < sets[0].numel())  # the fallback is exercised without
    assert torch.equal(sparsest_covering_set(needed, sets, 1 - sets.float().mean(dim=(1, 2))), targets)
    loss, _ = teacher_loss(model, inputs, needed)
    logits = router.choice_logits(inputs[0])
    assert float(loss.detach()) == pytest.approx(float(torch.nn.functional.cross_entropy(logits, targets).detach()),
                                                 rel=1e-5)
    optimizer = torch.optim.Adam(router.parameters(), lr=0.01)
    for _ in range(150):
        optimizer.zero_grad()
        teacher_loss(model, inputs, needed)[0].backward()
        optimizer.step()
    assert torch.equal(router.choice_logits(inputs[0]).argmax(-1), targets)


def test_a_run_on_the_teacher_alone_lowers_its_loss(tmp_path, random_suite_backbone):
    from elastic_attention.training.train_config import TrainConfig
    from elastic_attention.training.trainer import RouterTrainer

    config = {
        "model": str(random_suite_backbone), "output_dir": str(tmp_path / "run"),
        "elastic": {"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8, "signal_queries": 16},
        "data": {"tasks": ["needle_single", "local_recall"], "lengths": [200, 260], "rows": 8, "budget": 600},
        "targets": {"needle_single": 0.7, "local_recall": 1.0},
        "router_objective": "signal_teacher", "signal_teacher_threshold": 0.3,
        "steps": 12, "packs_per_step": 2, "router_lr": 0.01, "warmup_fraction": 0.0, "lr_schedule": "constant",
    }
    path = tmp_path / "teacher.yaml"
    path.write_text(yaml.safe_dump(config))
    trainer = RouterTrainer(TrainConfig.from_yaml(path), progress=False)
    trainer.setup()
    summary = trainer.train()
    losses = [row["teacher_loss"] for row in trainer.history]
    assert summary["steps"] == 12 and all(row["lm_loss"] == 0.0 for row in trainer.history)
    assert sum(losses[-4:]) < sum(losses[:4])
    trainer.cleanup()
