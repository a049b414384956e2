"""`elastic_attention.head_sets.search` and `elastic-attention search-heads`: the greedy search finds the brute-force
optimum where costs add up, never passes a target, records its path head by head, weighs every task alike in a joint
search, and scores a head set by the answer cross-entropy the plain model gives under full attention; the command runs
end to end on the shipped tiny backbone (CPU) and refuses bad starts with one line."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from elastic_attention.assets import TINY_BACKBONE as TINY
from elastic_attention.cli import main as cli_main


@pytest.fixture(scope="module")
def search():
    from elastic_attention.head_sets import search

    return search


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


def test_a_joint_search_weighs_every_task_alike_and_its_path_gives_every_set(search):
    """Oracle: brute force over every set of k sparse heads of the joint score, the mean over two tasks of their
    additive costs; one task's costs are ten times the other's, so a sum of the raw costs would pick other heads."""
    from elastic_attention.head_sets import HeadSets

    shape = (2, 3)
    costs = {"wide": torch.tensor([[1.0, 9.0, 3.0], [8.0, 2.0, 7.0]], dtype=torch.float64),
             "narrow": torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.4]], dtype=torch.float64)}
    means = {task: cost / cost.sum() for task, cost in costs.items()}  # each task's loss on its own scale
    score = search.joint_score(lambda routing: {task: float(mean[~routing].sum()) for task, mean in means.items()})
    sets, rounds = search.greedy_prune(score, shape, [1, 3, 5], 2)
    cells = list(itertools.product(range(2), range(3)))

    def oracle(sparse, cost):
        return sorted(min(itertools.combinations(cells, sparse),
                          key=lambda chosen: sum(float(c[~_routing(shape, chosen)].sum()) for c in cost.values())))

    path = [tuple(head) for record in rounds for head in record["moved"]]
    assert len(set(path)) == len(path) == 5 and set(path) == {cell for cell in cells if not sets[5][cell]}
    heads = HeadSets(shape=shape, sets={}, path=tuple(path))
    for sparse, routing in sets.items():
        assert sorted(map(tuple, (~routing).nonzero().tolist())) == oracle(sparse, means)
        assert torch.equal(heads.at(sparse / 6), routing)  # the path's point is the kept set
    assert oracle(1, means) != oracle(1, costs)  # summing the raw losses would have chosen another head
    assert [len(record["moved"]) for record in rounds] == [1, 2, 2]


def _routing(shape, sparse_heads):
    routing = torch.ones(shape, dtype=torch.bool)
    for head in sparse_heads:
        routing[head] = False
    return routing


def test_bad_targets_are_refused(search):
    with pytest.raises(ValueError, match="targets must lie in 1..6"):
        search.greedy_prune(lambda routing: 0.0, (3, 2), [7], 1)
    with pytest.raises(ValueError, match="step must be at least 1"):
        search.greedy_prune(lambda routing: 0.0, (3, 2), [2], 0)
    with pytest.raises(ValueError, match="targets must lie in 3..6"):
        search.greedy_prune(lambda routing: 0.0, (3, 2), [2], 1, start=_routing((3, 2), [(0, 0), (1, 1)]))
    with pytest.raises(ValueError, match=r"start set must be a \(3, 2\) bool tensor"):
        search.greedy_prune(lambda routing: 0.0, (3, 2), [4], 1, start=torch.ones(2, 3, dtype=torch.bool))


@pytest.mark.parametrize("step", [1, 2])
def test_a_search_from_a_start_set_keeps_its_sparse_heads_and_finds_the_cheapest_rest(search, step):
    """Oracle: brute force over every set of k sparse heads that holds the start's sparse heads, with additive costs
    that would have made other heads sparse first from full attention."""
    shape = (2, 3)
    costs = torch.tensor([[5.0, 0.1, 0.3], [0.2, 4.0, 0.6]], dtype=torch.float64)
    start = _routing(shape, [(0, 0), (1, 1)])  # the two dearest heads already sparse

    def score(routing):
        return float(costs[~routing].sum())

    sets, rounds = search.greedy_prune(score, shape, [3, 5], step, start=start)
    cells = [cell for cell in itertools.product(range(2), range(3)) if start[cell]]
    for sparse, routing in sets.items():
        best = min(itertools.combinations(cells, sparse - 2), key=lambda chosen: sum(costs[c] for c in chosen))
        assert sorted(map(tuple, (~routing).nonzero().tolist())) == sorted([(0, 0), (1, 1), *best])
    assert bool(start[0, 1]) and rounds[0]["sparse_heads"] == 3  # the start itself is left as it was


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
    rows = [row for task, count in (("needle_single", 3), ("local_recall", 2))
            for row in suite_of(task).generate(task, 700, 3, count, tokenizer)]
    encoded = [encode_row(tokenizer, row) for row in rows]
    packs = pack_rows(encoded, 1500)
    assert len(packs) == 3 and len(set(packs[1].tasks)) == 2  # two rows a pack: the boundaries must not leak
    sums = {"needle_single": [0.0, 0], "local_recall": [0.0, 0]}
    with torch.no_grad():
        for row, encoded_row in zip(rows, encoded):
            ids = torch.tensor([encoded_row.prompt_ids + encoded_row.answer_ids], device=device)
            logits = plain(input_ids=ids).logits[0, len(encoded_row.prompt_ids) - 1 : -1].double()
            targets = torch.tensor(encoded_row.answer_ids, device=device)
            sums[row.task][0] += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
            sums[row.task][1] += len(encoded_row.answer_ids)
    per_task = {task: total / count for task, (total, count) in sums.items()}
    tolerance = 1e-3 if device == "cuda" else 1e-4  # TF32 matrix products on the GPU
    measured = search.task_cross_entropy(model, packs, torch.device(device))(torch.ones(4, 2, dtype=torch.bool))
    assert measured == pytest.approx(per_task, abs=tolerance)
    score = search.answer_cross_entropy(model, packs, torch.device(device))
    joint = sum(per_task.values()) / 2  # each task weighs the same
    assert score(torch.ones(4, 2, dtype=torch.bool)) == pytest.approx(joint, abs=tolerance)
    assert score(torch.zeros(4, 2, dtype=torch.bool)) > joint


#: The tiny backbone's search at 512 tokens, one search row per task: a run of seconds on a CPU.
COMMON = ["search-heads", "--model", str(TINY), "--suite", "synthetic", "--length", "512", "--search-samples", "1",
          "--pack-tokens", "1200", "--device", "cpu"]


def test_the_command_writes_its_path_each_msrs_set_and_their_accuracy(tmp_path, capsys):
    from elastic_attention.head_sets import read_head_sets

    out = tmp_path / "search.json"
    tasks = ["needle_single", "local_recall"]
    assert cli_main([*COMMON, "--tasks", ",".join(tasks), "--msr", "0.25,0.5", "--step", "3", "--samples", "1",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "answer cross-entropy: full" in printed.err and "MSR 0.500: 4 of 8 KV heads sparse; kept" in printed.out
    result = json.loads(out.read_text())
    assert result["tasks"] == tasks and sorted(result["task_cross_entropy_full"]) == sorted(tasks)
    assert result["elastic"]["local_tokens"] == 256  # eval's default settings without --config
    assert [entry["msr_asked"] for entry in result["sets"]] == [0.25, 0.5]
    assert [record["sparse_heads"] for record in result["rounds"]] == [2, 4]
    heads = read_head_sets(out)
    assert heads.path == tuple(tuple(head) for record in result["rounds"] for head in record["moved"])
    for entry in result["sets"]:
        routing = torch.tensor(entry["full_heads"])
        assert int((~routing).sum()) == round(entry["msr_asked"] * routing.numel())
        assert torch.equal(heads.at(entry["msr_asked"]), routing)
        assert entry["msr"] == pytest.approx(entry["msr_asked"])  # every row routed by the set
        assert sorted(entry["accuracy"]) == sorted(tasks) and sorted(entry["kept"]) == sorted(tasks)
    between = heads.at(3 / 8)  # a point of the path between two kept sets
    assert int((~between).sum()) == 3 and bool((between | ~torch.tensor(result["sets"][1]["full_heads"])).all())


def test_a_search_started_from_a_point_of_another_path_goes_on_from_it(tmp_path, capsys):
    """The second search's path begins with the first's up to the start, and its sets hold that point's sparse
    heads; a start that is not a point of the file, or MSRs not above it, are refused with one line and status 2."""
    from elastic_attention.head_sets import read_head_sets

    first = tmp_path / "joint.json"
    assert cli_main([*COMMON, "--tasks", "needle_single,local_recall", "--msr", "0.25", "--step", "2",
                     "--samples", "0", "--out", str(first)]) == 0
    second = tmp_path / "needle.json"
    assert cli_main([*COMMON, "--tasks", "needle_single", "--msr", "0.5,0.625", "--step", "1", "--samples", "0",
                     "--start", f"{first}@0.25", "--out", str(second)]) == 0
    result = json.loads(second.read_text())
    earlier, later = read_head_sets(first), read_head_sets(second)
    assert result["start"] == f"{first}@0.25" and later.path[:2] == earlier.path[:2] and len(later.path) == 5
    assert [record["sparse_heads"] for record in result["rounds"]] == [3, 4, 5]
    for msr in (0.5, 0.625):
        assert not bool((later.at(msr) & ~earlier.at(0.25)).any())  # the start's sparse heads stay sparse
    capsys.readouterr()
    refused = str(tmp_path / "refused.json")
    assert cli_main([*COMMON, "--tasks", "needle_single", "--msr", "0.25", "--samples", "0",
                     "--start", f"{first}@0.25", "--out", refused]) == 2
    assert "every MSR must lie above the start's (0.250)" in capsys.readouterr().err
    head_set = tmp_path / "one_set.json"  # a set with no path: not a point the search can go on from
    head_set.write_text(json.dumps({"sets": [{"msr_asked": 0.25, "full_heads": earlier.at(0.25).tolist()}]}))
    assert cli_main([*COMMON, "--tasks", "needle_single", "--msr", "0.5", "--samples", "0",
                     "--start", f"{head_set}@0.25", "--out", refused]) == 2
    error = capsys.readouterr().err
    assert "not a point of that file's path" in error and len(error.strip().splitlines()) == 1
    assert not Path(refused).exists()


@pytest.mark.parametrize("argument, message", [(["--msr", "0,0.5"], "numbers in (0, 1]"),
                                               (["--step", "0"], "positive integer"),
                                               (["--samples", "-1"], "at least 0"),
                                               (["--suite", "ruler"], "invalid choice")])
def test_bad_arguments_are_refused_before_the_model_loads(tmp_path, capsys, argument, message):
    with pytest.raises(SystemExit) as stopped:
        cli_main([*COMMON, "--tasks", "needle_single", "--out", str(tmp_path / "out.json"), *argument])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_the_help_names_the_command_its_defaults_and_an_example(capsys):
    with pytest.raises(SystemExit):
        cli_main(["search-heads", "--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: elastic-attention search-heads")
    assert "(default: 0.5,0.6,0.7)" in text and "needle_multivalue" in text and "passkey" in text
    assert "example:\n  elastic-attention search-heads --model" in text and "issue" not in text.lower()


def test_the_help_lists_each_search_suites_tasks_as_the_suites_have_them():
    from elastic_attention.cli import SEARCH_TASKS
    from elastic_attention.evaluation.suites import get_suite

    assert {suite: tuple(get_suite(suite).tasks) for suite in SEARCH_TASKS} == SEARCH_TASKS
