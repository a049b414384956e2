"""router_input_probe.py: the router's input it reads is the router's own, and its per-task table follows a
separation built by hand."""

import json

import pytest
import torch

import router_input_probe


@pytest.fixture(scope="module")
def random_suite_backbone(tmp_path_factory):
    """A tiny random Qwen3 with the suite tokenizer, saved like a real checkpoint (as tests/conftest.py's)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from elastic_attention.evaluation.synthetic.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    path = tmp_path_factory.mktemp("random_suite_backbone")
    Qwen3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_held_out_task_on_the_trained_side_of_the_separation_is_assigned_its_kind():
    """Oracle: features whose first coordinate is the kind (+1 sensitive, -1 robust) plus noise, except a held-out
    robust task that looks sensitive there: it is assigned the wrong kind, the others their own."""
    probe = router_input_probe
    generator = torch.Generator().manual_seed(0)
    tasks = {"a": ("sensitive", 1.0), "b": ("robust", -1.0), "c": ("sensitive", 1.0), "d": ("robust", 1.0)}
    names = [task for task in tasks for _ in range(20)]
    features = torch.randn(len(names), 2, generator=generator) * 0.1  # the kind, and a coordinate of noise alone
    features[:, 0] += torch.tensor([tasks[name][1] for name in names])
    table = probe.kind_table(features, names, {task: kind for task, (kind, _) in tasks.items()}, held_out={"c", "d"})
    shares = {record["task"]: record["predicted_as_its_kind"] for record in table}
    assert shares == {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}
    assert [record["held_out"] for record in table] == [False, False, True, True]
    # unseen rows of the same tasks: a's drawn on the other side of the separation are counted wrong
    unseen_names = ["a"] * 4 + ["b"] * 2
    unseen = torch.tensor([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]])
    table = probe.kind_table(features, names, {task: kind for task, (kind, _) in tasks.items()}, held_out={"c", "d"},
                             unseen=(unseen, unseen_names))
    assert {record["task"]: record.get("predicted_as_its_kind_unseen_rows") for record in table} == {
        "a": 0.5, "b": 1.0, "c": None, "d": None}


@pytest.mark.slow  # a study's script end to end on a model: make test-slow and CI run it
def test_the_probe_reads_the_pooled_keys_the_router_reads(random_suite_backbone, tmp_path):
    import elastic_attention as ea
    from elastic_attention.evaluation.pipeline import load_backbone

    probe = router_input_probe
    model, tokenizer = load_backbone(random_suite_backbone, "cpu")
    features, names = probe.router_inputs(model, tokenizer, "synthetic", ["needle_single", "local_recall"], [300], 2,
                                          layer=1)
    assert names == ["needle_single"] * 2 + ["local_recall"] * 2 and features.shape == (4, 2 * 16)
    assert not ea.is_attached(model)
    # the same rows through a whole forward, read at the router of layer 1 as it routes
    from elastic_attention.chat import render_prompt
    from elastic_attention.evaluation.suites import get_suite

    ea.attach(model, ea.ElasticConfig(routed_layers=(1,)), backend="reference")
    seen = []
    ea.routers_of(model)[1].register_forward_pre_hook(lambda module, args: seen.append(args[0][0].flatten()))
    for row in get_suite("synthetic").generate("needle_single", 300, 0, 2, tokenizer):
        ids = tokenizer(render_prompt(tokenizer, row.prompt), return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            model(input_ids=ids.input_ids, use_cache=False, logits_to_keep=1)
    torch.testing.assert_close(torch.stack(seen), features[:2])
    table = probe.main(["--model", str(random_suite_backbone), "--suite", "synthetic", "--held-out", "local_count",
                        "--lengths", "300", "--rows", "2", "--layers", "0,1", "--unseen-seed", "3", "--device", "cpu",
                        "--out", str(tmp_path / "probe.json")])
    document = json.loads((tmp_path / "probe.json").read_text())
    assert document["results"] == table and document["layers"] == [0, 1] and len(table) == 14
    assert [record["layer"] for record in table] == [0] * 7 + [1] * 7
    assert all(record["unseen_rows"] == 2 and 0 <= record["predicted_as_its_kind_unseen_rows"] <= 1 for record in table)


def test_the_probe_splits_the_tasks_it_is_told_to(random_suite_backbone, tmp_path):
    """--tasks keeps only those tasks' rows; --positive puts the named ones on one side, whatever their kind."""
    probe = router_input_probe
    table = probe.main(["--model", str(random_suite_backbone), "--suite", "synthetic",
                        "--tasks", "needle_single,local_recall,local_count", "--positive", "local_recall",
                        "--lengths", "300", "--rows", "2", "--device", "cpu", "--out", str(tmp_path / "probe.json")])
    assert [record["task"] for record in table] == ["needle_single", "local_recall", "local_count"]
    assert [record["kind"] for record in table] == ["other", "positive", "other"]
    assert json.loads((tmp_path / "probe.json").read_text())["positive"] == ["local_recall"]


def test_the_probe_refuses_a_split_with_one_side(random_suite_backbone):
    import pytest

    probe = router_input_probe
    with pytest.raises(SystemExit):
        probe.main(["--model", str(random_suite_backbone), "--suite", "synthetic", "--tasks", "needle_single",
                    "--positive", "needle_single", "--device", "cpu"])
    with pytest.raises(SystemExit):
        probe.main(["--model", str(random_suite_backbone), "--suite", "synthetic", "--tasks", "needle_single",
                    "--positive", "local_recall", "--device", "cpu"])
