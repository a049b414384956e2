"""A head-set router's safety floor: an unsure prompt never runs a set sparser than the floor set; the config checks
it, the adapter carries it, reports and `generate` show it, and its threshold is calibrated on validation rows."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import tiny_model

import elastic_attention as ea
from elastic_attention.errors import ConfigError
from elastic_attention.router.floor import floor_threshold

#: Four sets of a 3-layer, 2-KV-head model: all full (MSR 0), three heads full (0.5), one head full, all sparse (1).
SETS = torch.tensor([[[1, 1], [1, 1], [1, 1]], [[1, 0], [0, 1], [1, 0]], [[0, 0], [1, 0], [0, 0]],
                     [[0, 0], [0, 0], [0, 0]]], dtype=torch.bool)
MSRS = [0.0, 0.5, 5 / 6, 1.0]


def _attached(config):
    model = tiny_model("llama", layers=3)
    ea.attach(model, config, backend="reference")
    (router,) = ea.routers_of(model).values()
    router.set_head_sets(SETS)
    with torch.no_grad():  # a random router far enough from uniform that prompts prefer different sets, unsure or not
        for parameter in router.parameters():
            parameter.mul_(40.0)
    return model, router


def _slow_choice(probabilities: list[float], floor_set: int, confidence: float) -> int:
    """The floor's rule for one prompt, written out: the most probable set, unless it is sparser than the floor set
    and below the confidence; then the most probable of the sets no sparser than the floor set."""
    preferred = max(range(len(probabilities)), key=lambda index: (probabilities[index], -index))
    if MSRS[preferred] <= MSRS[floor_set] or probabilities[preferred] >= confidence:
        return preferred
    allowed = [index for index in range(len(MSRS)) if MSRS[index] <= MSRS[floor_set]]
    return max(allowed, key=lambda index: (probabilities[index], -index))


@pytest.mark.parametrize("confidence", [0.0, 0.5, 0.9, 0.97, 1.0])
def test_the_floor_follows_the_per_prompt_rule_in_every_routed_layer(confidence):
    config = ea.ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4, head_set_choices=4,
                              floor_set=1, floor_confidence=confidence)
    model, router = _attached(config)
    ids = torch.randint(3, 90, (23, 37), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(input_ids=ids)
    report = ea.routing_report(model)
    decision = report.head_sets.decision
    assert len(set(decision.preferred.tolist())) > 2
    for row in range(ids.shape[0]):
        expected = _slow_choice(decision.probabilities[row].tolist(), 1, confidence)
        assert int(decision.choice[row]) == expected
        assert torch.equal(report.decisions[row], SETS[expected])
    moved = decision.floor_acted
    top = decision.probabilities.max(dim=-1).values
    sparser = torch.tensor([MSRS[int(index)] > 0.5 for index in decision.preferred])
    assert torch.equal(moved, sparser & (top < confidence))
    assert confidence < 0.9 or bool(moved.any())
    assert all(MSRS[int(choice)] <= 0.5 for choice in decision.choice[moved])


def test_the_config_checks_the_floor_and_the_adapter_carries_it(tmp_path):
    base = dict(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)
    with pytest.raises(ConfigError, match="set `head_set_choices` too"):
        ea.ElasticConfig(**base, floor_set=1)
    with pytest.raises(ConfigError, match="0 to 3"):
        ea.ElasticConfig(**base, head_set_choices=4, floor_set=4)
    with pytest.raises(ConfigError, match="needs `floor_set`"):
        ea.ElasticConfig(**base, head_set_choices=4, floor_confidence=0.5)
    with pytest.raises(ConfigError, match="in \\[0, 1\\]"):
        ea.ElasticConfig(**base, head_set_choices=4, floor_set=1, floor_confidence=1.5)
    config = ea.ElasticConfig(**base, head_set_choices=4, floor_set=1, floor_confidence=0.6)
    assert ea.ElasticConfig.from_json(config.to_json()) == config
    model, _ = _attached(config)
    ea.save_router(model, tmp_path / "adapter")
    fresh = tiny_model("llama", layers=3)
    ea.load_router(fresh, tmp_path / "adapter", backend="reference")
    (loaded,) = ea.routers_of(fresh).values()
    assert (loaded.floor_set, loaded.floor_confidence) == (1, 0.6)
    # an adapter written before the floor existed has neither field: no floor
    older = {key: value for key, value in dataclasses.asdict(config).items() if not key.startswith("floor_")}
    assert ea.ElasticConfig.from_dict({"format_version": 1, **older}).floor_set is None


def test_the_report_line_names_the_set_and_the_floor():
    config = ea.ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4, head_set_choices=4,
                              floor_set=1, floor_confidence=1.0)
    model, router = _attached(config)
    with torch.no_grad():
        router.router_mlp[-1].weight.zero_()  # probabilities softmax([0, 1, 0, 3]) = 0.04, 0.11, 0.04, 0.81
        router.router_mlp[-1].bias.copy_(torch.tensor([0.0, 1.0, 0.0, 3.0]))
        model(input_ids=torch.randint(3, 90, (1, 30), generator=torch.Generator().manual_seed(1)))
    line = ea.routing_report(model).head_sets.line(0)
    assert line == ("head set 1 of 4: MSR 0.50, 3 of 6 KV heads full; the safety floor moved it from set 3 (MSR "
                    "1.00, probability 0.81 < 1.00)")
    runtime = ea.integration.runtime_of(model)
    runtime.routing.routers[0].floor_confidence = 0.0
    with torch.no_grad():
        model(input_ids=torch.randint(3, 90, (1, 30), generator=torch.Generator().manual_seed(1)))
    assert ea.routing_report(model).head_sets.line(0) == "head set 3 of 4: MSR 1.00, 0 of 6 KV heads full, " \
                                                         "probability 0.81"


def test_the_threshold_catches_the_rows_that_need_the_floor():
    confidence = torch.tensor([0.95, 0.40, 0.62, 0.80, 0.55, 0.99, 0.62])
    needs = torch.tensor([False, True, True, False, True, False, False])
    calibration = floor_threshold(confidence, needs)
    assert calibration.threshold == math.nextafter(0.62, math.inf) or calibration.threshold > 0.62
    assert float(torch.tensor(0.62).double()) < calibration.threshold  # the neediest row's confidence falls below
    assert (calibration.need, calibration.caught, calibration.moved_without_need) == (3, 3, 1)  # 0.62 twice
    # a miss allowed: the most confident needy row keeps its set
    loose = floor_threshold(confidence, needs, max_missed=0.34)
    assert 0.55 < loose.threshold <= 0.62 + 1e-6 and loose.caught == 2
    assert floor_threshold(confidence, torch.zeros(7, dtype=torch.bool)).threshold == 0.0
    assert floor_threshold(torch.tensor([1.0]), torch.tensor([True])).threshold == 1.0
    with pytest.raises(ValueError, match="max_missed"):
        floor_threshold(confidence, needs, max_missed=1.0)


def test_generate_prints_a_head_set_routers_choice_in_one_line(tmp_path, capsys):
    from elastic_attention.assets import TINY_BACKBONE
    from elastic_attention.cli import main as cli_main
    from elastic_attention.evaluation.pipeline import load_backbone

    model, _ = load_backbone(TINY_BACKBONE, "cpu")
    ea.attach(model, ea.ElasticConfig(block_size=32, sink_tokens=32, local_tokens=128, xa_stride=8,
                                      head_set_choices=2, floor_set=0, floor_confidence=0.9))
    (router,) = ea.routers_of(model).values()
    sets = torch.zeros(router.head_sets.shape, dtype=torch.bool)
    sets[0] = True
    router.set_head_sets(sets)
    ea.save_router(model, tmp_path / "router")
    assert cli_main(["generate", "--model", str(TINY_BACKBONE), "--router", str(tmp_path / "router"),
                     "--prompt", "word " * 300, "--max-new-tokens", "2", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "  layer " not in printed
    (line,) = [text for text in printed.splitlines() if text.startswith("  head set ")]
    assert "of 2: MSR" in line and "safety floor" in line
