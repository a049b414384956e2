"""scripts/head_set_search.py: the greedy search finds the brute-force optimum where costs add up, never passes a
target, and scores a head set by the answer cross-entropy the plain model gives under full attention."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from conftest import load_script

TINY = Path(__file__).resolve().parents[1] / "src" / "elastic_attention" / "assets" / "backbone_tiny"


@pytest.fixture(scope="module")
def search():
    return load_script("head_set_search")


@pytest.mark.parametrize("step", [1, 3, 7])
def test_additive_costs_give_the_cheapest_sets(search, step):
    """Oracle: with a cost per sparse head that adds up, the best set of k sparse heads is found by trying them all."""
    shape = (3, 2)
    costs = torch.tensor([[0.7, 0.1], [0.4, 0.9], [0.2, 0.3]], dtype=torch.float64)

    def score(routing):
        return float(costs[~routing].sum())

    seen = []
    sets, rounds = search.greedy_prune(score, shape, [4, 2], step, on_round=seen.append)
    assert seen == rounds and sorted(sets) == [2, 4]
    cells = list(itertools.product(range(3), range(2)))
    for sparse, routing in sets.items():
        best = min(itertools.combinations(cells, sparse), key=lambda chosen: sum(costs[c] for c in chosen))
        assert sorted(map(tuple, (~routing).nonzero().tolist())) == sorted(best)
    counts = [record["sparse_heads"] for record in rounds]
    assert 2 in counts and counts[-1] == 4 and all(b - a <= step for a, b in zip([0] + counts, counts))
    assert rounds[-1]["score"] == pytest.approx(score(sets[4]))


def test_bad_targets_are_refused(search):
    with pytest.raises(ValueError, match="targets must lie in 1..6"):
        search.greedy_prune(lambda routing: 0.0, (3, 2), [7], 1)
    with pytest.raises(ValueError, match="step must be at least 1"):
        search.greedy_prune(lambda routing: 0.0, (3, 2), [2], 0)


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="needs a CUDA device")])


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_score_of_full_attention_is_the_plain_models_answer_cross_entropy(search, device):
    """Oracle: the backbone without elastic attention, its answer tokens' cross-entropy computed here in float64."""
    from elastic_attention import ElasticConfig, attach
    from elastic_attention.evaluation.pipeline import load_backbone
    from elastic_attention.evaluation.suites import suite_of
    from elastic_attention.rows import encode_row
    from elastic_attention.training.data import pack_rows

    plain, tokenizer = load_backbone(TINY, device=device, dtype="float32")
    model, _ = load_backbone(TINY, device=device, dtype="float32")
    attach(model, ElasticConfig(configuration="fa-ssa", block_size=32, sink_tokens=32, local_tokens=128))
    rows = suite_of("needle_single").generate("needle_single", 700, 3, 3, tokenizer)
    encoded = [encode_row(tokenizer, row) for row in rows]
    packs = pack_rows(encoded, 1500)
    assert len(packs) == 2  # two rows in one pack, one in the other: the pack boundaries must not leak
    total, count = 0.0, 0
    with torch.no_grad():
        for row in encoded:
            ids = torch.tensor([row.prompt_ids + row.answer_ids], device=device)
            logits = plain(input_ids=ids).logits[0, len(row.prompt_ids) - 1 : -1].double()
            targets = torch.tensor(row.answer_ids, device=device)
            total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
            count += len(row.answer_ids)
    score = search.answer_cross_entropy(model, packs, torch.device(device))
    tolerance = 1e-3 if device == "cuda" else 1e-4  # TF32 matrix products on the GPU
    assert score(torch.ones(4, 2, dtype=torch.bool)) == pytest.approx(total / count, abs=tolerance)
    assert score(torch.zeros(4, 2, dtype=torch.bool)) > total / count


def test_the_script_writes_each_msrs_set_and_its_accuracy(search, tmp_path):
    out = tmp_path / "search.json"
    result = search.main(["--model", str(TINY), "--config", "configs/tiny_finding.yaml", "--task", "needle_single",
                          "--length", "1024", "--msr", "0.25,0.5", "--step", "3", "--search-samples", "2",
                          "--pack-tokens", "2200", "--samples", "3", "--device", "cpu", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [entry["msr_asked"] for entry in result["sets"]] == [0.25, 0.5]
    for entry in result["sets"]:
        routing = torch.tensor(entry["full_heads"])
        assert int((~routing).sum()) == round(entry["msr_asked"] * routing.numel())
        assert entry["msr"] == pytest.approx(entry["msr_asked"])  # every row routed by the set
    assert [record["sparse_heads"] for record in result["rounds"]] == [2, 4]
