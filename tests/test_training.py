"""Router training: packing, labels, the objective and its multipliers, the CLI with kill and resume, gloo DDP."""

import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from safetensors.torch import load_file

from elastic_attention import ConfigError, InputError
from elastic_attention.training import DataConfig, Row, SparsityObjective, TrainConfig, encode_row, pack_rows
from elastic_attention.training.train_config import SUITE_TARGETS
from elastic_attention.training.data import IGNORE_INDEX, EncodedRow, load_rows
from elastic_attention.training.trainer import RouterTrainer

ROOT = Path(__file__).resolve().parents[1]


def encoded(prompt, answer, task="t"):
    return EncodedRow(list(range(100, 100 + prompt)), list(range(500, 500 + answer)), task)


def test_packing_keeps_boundaries_spans_and_answer_only_labels():
    rows = [encoded(5, 2, "a"), encoded(3, 1, "b"), encoded(6, 3, "a"), encoded(2, 1, "b")]
    packs = pack_rows(rows, budget=12)
    assert [pack.tasks for pack in packs] == [("a", "b"), ("a", "b")]
    first = packs[0]
    assert first.spans == ((0, 7, 5), (7, 4, 3))
    assert first.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3]
    assert first.labels.tolist() == [IGNORE_INDEX] * 5 + [500, 501] + [IGNORE_INDEX] * 3 + [500]
    assert first.input_ids.tolist()[5:7] == [500, 501]
    whole = pack_rows(rows, budget=12, answer_only=False)[0]
    assert whole.labels.tolist()[0] == IGNORE_INDEX and whole.labels.tolist()[7] == IGNORE_INDEX
    assert whole.labels.tolist()[1:7] == whole.input_ids.tolist()[1:7]


def test_overlong_rows_are_reported_never_cut(caplog):
    rows = [encoded(5, 2), encoded(30, 2), encoded(3, 1)]
    with pytest.raises(InputError, match="1 rows are longer than the packing budget of 16 tokens"):
        pack_rows(rows, budget=16)
    packs = pack_rows(rows, budget=16, on_overlong="skip")
    assert sum(len(pack.spans) for pack in packs) == 2
    assert "skipped 1 rows" in caplog.text


def test_rows_render_through_the_chat_template(random_suite_backbone):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_suite_backbone)
    row = Row(context="the cat sees a dog .", question="question : what is the value of k3 ?", answer="v4",
              task="needle_single", instruction="instruction : find the value .")
    result = encode_row(tokenizer, row)
    assert tokenizer.decode(result.answer_ids) == "v4 <eos>"
    assert tokenizer.convert_ids_to_tokens(result.prompt_ids[-1]) == "<assistant>"


def test_jsonl_rows_and_their_errors(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"context": "c", "question": "q", "answer": "a", "task": "t"}\n')
    assert load_rows(path) == [Row("c", "q", "a", "t")]
    path.write_text('{"context": "c", "question": "q", "answer": "a", "task": "t"}\n\n{"context": "c", "answer": "a", "task": "t"}\n')
    with pytest.raises(InputError, match=r"rows.jsonl, line 3: no `question` column"):
        load_rows(path)
    (tmp_path / "rows.csv").write_text("context,question\n")
    with pytest.raises(InputError, match="unsupported row file"):
        load_rows(tmp_path / "rows.csv")


GOOD = {"context": "the cat sees a dog .", "question": "what ?", "answer": "v4", "task": "t"}
#: id -> (line 3 of the file, what the message says after "FILE, line 3"); parquet: the cases a typed column holds
BAD_ROWS = {
    "not_json": ("not json", ": not JSON"),
    "not_object": ('["a list"]', ": expected a JSON object, got list"),
    "not_string": (json.dumps({**GOOD, "question": None}), ": `question` must be a string, got None"),
    "missing": (json.dumps({key: value for key, value in GOOD.items() if key != "answer"}), ": no `answer` column"),
    "instruction": (json.dumps({**GOOD, "instruction": 5}), ": `instruction` must be a string, got 5"),
    "metadata": (json.dumps({"context": "c", "question": "q", "answer": "a", "metadata": "{oops"}),
                 ": `metadata` is neither a dict nor a dict literal"),
    "reference_column": (json.dumps({"context": None, "question": "q", "answer": "a", "metadata": "{}"}),
                         ": `context` must be a string, got None"),
    "overlong": (json.dumps({**GOOD, "context": "the cat sees a dog . " * 40}), ", \\d+ tokens\\); raise the budget"),
}
#: the cases a parquet file can hold (a column has one type; a key missing from a record reads as None), with what
#: its message says instead where that differs
PARQUET_ROWS = {"not_string": None, "missing": ": `answer` must be a string, got None", "overlong": None}


@pytest.mark.parametrize("case", [*(("jsonl", name) for name in BAD_ROWS), *(("parquet", name) for name in PARQUET_ROWS)],
                         ids="-".join)
def test_every_bad_row_is_named_by_its_file_and_line(tmp_path, random_suite_backbone, case):
    """Line 4 of a JSONL file (the blank line 2 counts), or row 3 of the same records in a parquet file; the
    over-long row is found only when packing, from its encoding."""
    from transformers import AutoTokenizer

    kind, name = case
    bad, detail = BAD_ROWS[name]
    lines = [json.dumps(GOOD), "", json.dumps(GOOD), bad]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    where = "line 4"
    if kind == "parquet":
        from datasets import Dataset

        records = [json.loads(line) for line in lines if line]
        path, where, detail = tmp_path / "rows.parquet", "row 3", PARQUET_ROWS[name] or detail
        Dataset.from_list([{key: record.get(key) for key in ("context", "question", "answer", "task")}
                           for record in records]).to_parquet(path)
    tokenizer = AutoTokenizer.from_pretrained(random_suite_backbone)
    with pytest.raises(InputError, match=re.escape(f"{path}, {where}") + detail):
        pack_rows([encode_row(tokenizer, row) for row in load_rows(path)], budget=120)


def test_objective_value_and_gradients():
    objective = SparsityObjective({"robust": 1.0, "sensitive": 0.7})
    with torch.no_grad():
        objective.lambda1.copy_(torch.tensor([0.5, 2.0]))
        objective.lambda2.copy_(torch.tensor([3.0, 4.0]))
    msr = torch.tensor([0.6, 0.9, 0.8], requires_grad=True)
    tasks = objective.task_indices(["robust", "sensitive", "sensitive"])
    loss = objective(msr, tasks)
    gap = torch.tensor([-0.4, 0.2, 0.1])
    expected = (0.5 * gap[0] + 3.0 * gap[0] ** 2) + ((2.0 * gap[1:] + 4.0 * gap[1:] ** 2).mean())
    torch.testing.assert_close(loss, expected)
    loss.backward()
    torch.testing.assert_close(msr.grad, torch.tensor([0.5 + 6.0 * -0.4, (2.0 + 8.0 * 0.2) / 2, (2.0 + 8.0 * 0.1) / 2]))
    torch.testing.assert_close(objective.lambda1.grad, torch.tensor([-0.4, 0.15]))
    with pytest.raises(InputError, match=r"tasks \['other'\] have no sparsity target"):
        objective.task_indices(["other"])


@pytest.mark.parametrize("linear_term", ["signed", "absolute"])
def test_multipliers_ascend(linear_term):
    objective = SparsityObjective({"sensitive": 0.7}, linear_term=linear_term)
    optimizer = torch.optim.AdamW(objective.parameters(), lr=0.1, maximize=True, weight_decay=0.0)
    for msr_value, expected_sign in ((0.9, 1.0), (0.5, -1.0 if linear_term == "signed" else 1.0)):
        with torch.no_grad():
            objective.lambda1.zero_()
        optimizer = torch.optim.AdamW(objective.parameters(), lr=0.1, maximize=True, weight_decay=0.0)
        loss = objective(torch.tensor([msr_value]), objective.task_indices(["sensitive"]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # Ascent: the multiplier moves so as to raise the penalty of the current violation.
        assert torch.sign(objective.lambda1.detach()).item() == expected_sign
        assert objective.lambda2.item() > 0


def test_bounds_give_no_penalty_inside_the_band():
    objective = SparsityObjective({"t": 0.7}, bounds={"t": (0.6, 0.8)})
    gaps = objective.gap(torch.tensor([0.5, 0.65, 0.9]), objective.task_indices(["t"] * 3))
    torch.testing.assert_close(gaps, torch.tensor([-0.1, 0.0, 0.1]))
    with pytest.raises(ConfigError, match="bounds"):
        SparsityObjective({"t": 0.7}, bounds={"t": (0.9, 0.8)})
    with pytest.raises(ConfigError, match="linear_term"):
        SparsityObjective({"t": 0.7}, linear_term="squared")


def test_router_learning_rate_schedules():
    def scales(schedule):
        config = TrainConfig(model="m", steps=10, warmup_fraction=0.2, lr_schedule=schedule)
        return [RouterTrainer._lr_scale(SimpleNamespace(config=config), step) for step in range(10)]

    assert scales("constant") == [0.5] + [1.0] * 9
    cosine = scales("cosine")
    assert cosine[:3] == [0.5, 1.0, 1.0] and cosine[9] == pytest.approx((1 + math.cos(7 * math.pi / 8)) / 2)
    assert all(a > b for a, b in zip(cosine[2:], cosine[3:]))
    with pytest.raises(ConfigError, match="`lr_schedule` must be one of"):
        TrainConfig(model="m", lr_schedule="linear")


def test_config_validation_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="`model`"):
        TrainConfig()
    with pytest.raises(ConfigError, match="unknown training config keys \\['stepz'\\]"):
        TrainConfig.from_dict({"model": "m", "stepz": 3})
    with pytest.raises(ConfigError, match="`steps` must be at least 1"):
        TrainConfig(model="m", steps=0)
    with pytest.raises(ConfigError, match="`margin_limit` must be a positive number"):
        TrainConfig(model="m", margin_limit=0.0)
    with pytest.raises(ConfigError, match="`max_seconds` must be a positive number of seconds or null, got 0"):
        TrainConfig(model="m", max_seconds=0)
    for probability in (0.0, 1.0):
        with pytest.raises(ConfigError, match="`initial_full_probability` must be in \\(0, 1\\)"):
            TrainConfig(model="m", initial_full_probability=probability)
    with pytest.raises(ConfigError, match="suite tasks \\['local_count'\\] have no entry in `targets`"):
        TrainConfig.from_dict({"model": "m", "targets": {"needle_single": 0.7},
                               "data": {"tasks": ["needle_single", "local_count"]}})
    with pytest.raises(ConfigError, match="`sink_tokens`"):
        TrainConfig(model="m", elastic={"sink_tokens": 100})
    with pytest.raises(ConfigError, match="`lm_loss` must be one of \\('cross_entropy', 'distillation'\\), got 'kl'"):
        TrainConfig(model="m", lm_loss="kl")
    path = tmp_path / "c.yaml"
    path.write_text("model: m\nsteps: 3\ndata: {rows: 8}\n")
    config = TrainConfig.from_yaml(path, ["steps=5", "data.budget=2048", "temperature.kind=exponential"])
    assert (config.steps, config.data.budget, config.data.rows, config.temperature.kind) == (5, 2048, 8, "exponential")


@pytest.mark.parametrize(("override", "message"), [
    ("temperature.start=abc", "`temperature.start` must be a number, got 'abc'"),
    ("temperature.kind=3", "`temperature.kind` must be a string, got 3"),
    ("data.budget=lots", "`data.budget` must be an integer, got 'lots'"),
    ("data.lengths=[1024, x]", "`data.lengths` must be a list of int values"),
    ("targets.needle_single=high", "`targets.needle_single` must be a number in \\[0, 1\\], got 'high'"),
    ("targets.needle_single=1.5", "`targets.needle_single` must be a number in \\[0, 1\\], got 1.5"),
    ("targets.needle_singel=0.5", "`targets` names tasks \\['needle_singel'\\] that are not in `data.tasks`; known: "
                                  "\\['local_recall', 'needle_single'\\]"),
    ("targets=0.7", "`targets` and `bounds` must be sections"),
    ("bounds.needle_single=5", "`bounds.needle_single` must be a pair \\[lower, upper\\] of MSRs, got 5"),
    ("bounds.needle_single=[0.2, x]", "`bounds.needle_single` must be a number in \\[0, 1\\], got 'x'"),
    ("bounds.needle_single=[0.8, 0.2]", "`bounds.needle_single` must have lower <= upper"),
    ("bounds.local_recal=[0.8, 1.0]", "`bounds` names tasks \\['local_recal'\\] that are not in `data.tasks`"),
], ids=lambda value: value if "=" in value else "")
def test_nested_settings_are_typed_and_their_tasks_checked(tmp_path, override, message):
    path = tmp_path / "c.yaml"
    path.write_text("model: m\ndata: {tasks: [needle_single, local_recall]}\n"
                    "targets: {needle_single: 0.7, local_recall: 1.0}\n")
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_yaml(path, [override])


def test_default_targets_are_the_papers_for_the_datas_tasks():
    config = TrainConfig(model="m", data=DataConfig(tasks=("needle_single", "local_recall")))
    assert config.targets == {"needle_single": 0.7, "local_recall": 1.0}
    assert TrainConfig(model="m", data=DataConfig(source="rows.jsonl")).targets == SUITE_TARGETS


def write_head_sets(path, sets):
    """A search-heads result holding ``sets`` ({msr_asked: [layers][KV heads] bools})."""
    path.write_text(json.dumps({"sets": [{"msr_asked": msr, "full_heads": heads} for msr, heads in sets.items()]}))
    return path


def test_initial_full_heads_errors_name_the_fix(tmp_path):
    standardizing = {"router_standardize": True}
    one = write_head_sets(tmp_path / "one.json", {0.5: [[True, False], [False, True]]})
    two = write_head_sets(tmp_path / "two.json", {0.5: [[True, False], [False, True]], 0.75: [[True, False]] * 2})
    with pytest.raises(ConfigError, match="needs `initial_full_probability`"):
        TrainConfig(model="m", elastic=standardizing, initial_full_heads=str(one))
    with pytest.raises(ConfigError, match="set `elastic.router_standardize: true`"):
        TrainConfig(model="m", initial_full_probability=0.9, initial_full_heads=str(one))
    with pytest.raises(ConfigError, match="no file at .*missing.json"):
        TrainConfig(model="m", elastic=standardizing, initial_full_probability=0.9,
                    initial_full_heads=str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="holds the sets of MSR \\[0.5, 0.75\\]: pick one"):
        TrainConfig(model="m", elastic=standardizing, initial_full_probability=0.9, initial_full_heads=str(two))
    with pytest.raises(ConfigError, match="`initial_full_heads_msr` 0.6 is not among"):
        TrainConfig(model="m", elastic=standardizing, initial_full_probability=0.9, initial_full_heads=str(two),
                    initial_full_heads_msr=0.6)
    with pytest.raises(ConfigError, match="`initial_full_heads`, which is not set"):
        TrainConfig(model="m", initial_full_heads_msr=0.5)
    with pytest.raises(ConfigError, match="`sparse_outside_initial_heads` pins the heads outside `initial_full_heads`"):
        TrainConfig(model="m", sparse_outside_initial_heads=True)
    (tmp_path / "bad.json").write_text(json.dumps({"rounds": []}))
    with pytest.raises(ConfigError, match="not a head-set file"):
        TrainConfig(model="m", elastic=standardizing, initial_full_probability=0.9,
                    initial_full_heads=str(tmp_path / "bad.json"))
    numbers = write_head_sets(tmp_path / "numbers.json", {0.5: [[1, 0], [0, 1]]})
    with pytest.raises(ConfigError, match="list of booleans"):
        TrainConfig(model="m", elastic=standardizing, initial_full_probability=0.9, initial_full_heads=str(numbers))
    config = TrainConfig(model="m", elastic=standardizing, initial_full_probability=0.9, initial_full_heads=str(two),
                         initial_full_heads_msr=0.75)
    assert config.initial_head_set().tolist() == [[True, False], [True, False]]


def test_routers_start_from_a_head_set(tmp_path, random_suite_backbone):
    """Oracle: each KV head's first P(full), read from its router's biases, is p in the set and 1 - p outside it."""
    head_set = [[True, False], [False, True]]
    heads = write_head_sets(tmp_path / "search.json", {0.5: head_set})
    elastic = {**STANDARDIZING["elastic"]}
    config = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "run", elastic=elastic,
                                                initial_full_probability=0.8, initial_full_heads=str(heads)))
    trainer = RouterTrainer(config, progress=False)
    trainer.setup()
    from elastic_attention.integration import routers_of

    for (_, router), full in zip(sorted(routers_of(trainer.model).items()), head_set):
        logits = (router.router_mlp[-1].bias + router.head_bias).detach().double()
        expected = torch.tensor([0.8 if in_set else 0.2 for in_set in full], dtype=torch.float64)
        torch.testing.assert_close(torch.softmax(logits, -1)[:, 1], expected)
    assert all(router.pinned_heads() is None for router in routers_of(trainer.model).values())
    wrong = write_head_sets(tmp_path / "wrong.json", {0.5: [[True, False]] * 3})
    config = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "wrong", elastic=elastic,
                                                initial_full_probability=0.8, initial_full_heads=str(wrong)))
    with pytest.raises(ConfigError, match="the set is \\(3, 2\\).*the model routes \\(2, 2\\)"):
        RouterTrainer(config, progress=False).setup()


def test_heads_outside_the_set_stay_sparse_through_training(tmp_path, random_suite_backbone):
    """Oracle: the head set itself: after training, every head outside it is pinned in the adapter and sparse on
    every training sample, though it starts at P(full) 0.8 (1 minus the set's 0.2): only the pins hold it."""
    head_set = [[True, False], [False, True]]
    heads = write_head_sets(tmp_path / "search.json", {0.5: head_set})
    config = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "run", elastic=STANDARDIZING["elastic"],
                                                steps=3, initial_full_probability=0.2, initial_full_heads=str(heads),
                                                sparse_outside_initial_heads=True))
    trainer = RouterTrainer(config, progress=False)
    trainer.setup()
    outside = ~torch.tensor(head_set)
    trainer.finish(trainer.train())
    from elastic_attention.integration import routers_of

    saved = load_file(tmp_path / "run" / "router" / "router.safetensors")
    for row, index in enumerate(sorted(routers_of(trainer.model))):
        assert saved[f"layers.{index}.pinned_sparse"].bool().tolist() == outside[row].tolist()
    from elastic_attention import routing_report
    from elastic_attention.training.trainer import forward_pack

    model = trainer.model.eval()
    with torch.no_grad():
        for pack in trainer.packs:
            forward_pack(model, pack, torch.device("cpu"), logits_to_keep=1)
            decisions = routing_report(model).decisions  # [samples of the pack, layers, KV heads]
            assert not decisions[:, outside].any()


def test_a_run_starts_from_an_earlier_runs_adapter(tmp_path, random_suite_backbone):
    """Oracle: the adapter file itself: before its first step, a run with ``initial_router`` holds exactly the
    adapter's tensors (weights, input statistics, pins; no calibration over them), and it trains from there."""
    heads = write_head_sets(tmp_path / "search.json", {0.5: [[True, False], [False, True]]})
    first = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "first", elastic=STANDARDIZING["elastic"],
                                               steps=2, initial_full_probability=0.8, initial_full_heads=str(heads),
                                               sparse_outside_initial_heads=True))
    trainer = RouterTrainer(first, progress=False)
    trainer.setup()
    trainer.finish(trainer.train())
    adapter = routers(tmp_path / "first")
    assert any("pinned_sparse" in name for name in adapter)
    second = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "second",
                                                elastic=STANDARDIZING["elastic"], steps=1,
                                                initial_router=str(tmp_path / "first" / "router")))
    train_from_adapter(second, adapter)
    assert routers(tmp_path / "second").keys() == adapter.keys()


def train_from_adapter(config: TrainConfig, adapter: dict) -> None:
    """Run ``config`` (whose ``initial_router`` saved ``adapter``, its tensors by name), checking that before its
    first step the routers hold exactly the adapter's tensors."""
    from elastic_attention.adapters import router_state_dict

    trainer = RouterTrainer(config, progress=False)
    trainer.setup()
    started = router_state_dict(trainer.model)
    assert started.keys() == adapter.keys()
    for name, tensor in adapter.items():
        assert torch.equal(started[name].float(), tensor.float()), name
    trainer.finish(trainer.train())


def test_initial_router_errors_name_the_fix(tmp_path, random_suite_backbone):
    from transformers import AutoModelForCausalLM

    import elastic_attention as ea

    model = AutoModelForCausalLM.from_pretrained(random_suite_backbone)
    ea.attach(model, ea.ElasticConfig(**STANDARDIZING["elastic"]))
    ea.save_router(model, tmp_path / "adapter")
    elastic = STANDARDIZING["elastic"]
    with pytest.raises(ConfigError, match="`initial_router`: no router.safetensors in .*missing.*save_router"):
        TrainConfig(model="m", elastic=elastic, initial_router=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="`initial_router` starts the routers from an adapter.*set one of them"):
        TrainConfig(model="m", elastic=elastic, initial_router=str(tmp_path / "adapter"), initial_full_probability=0.9)
    with pytest.raises(ConfigError, match="trained with local_tokens=64 \\(here 96\\).*set `elastic` to the adapter.s"):
        TrainConfig(model="m", elastic={**elastic, "local_tokens": 96}, initial_router=str(tmp_path / "adapter"))
    (tmp_path / "adapter" / "elastic_config.json").write_text("{")
    with pytest.raises(ConfigError, match="`initial_router`: .*elastic_config.json is not JSON"):
        TrainConfig(model="m", elastic=elastic, initial_router=str(tmp_path / "adapter"))


def write_config(tmp_path, backbone, name, **extra):
    config = {
        "model": str(backbone),
        "output_dir": str(tmp_path / name),
        "elastic": {"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8},
        "data": {"tasks": ["needle_single", "local_recall"], "lengths": [200, 260], "rows": 16, "budget": 600},
        "targets": {"needle_single": 0.7, "local_recall": 1.0},
        "steps": 6,
        "packs_per_step": 2,
        "router_lr": 0.01,
        "checkpoint_every": 2,
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def cli(*args, env=None):
    return [sys.executable, "-m", "elastic_attention.cli", *args]


def routers(run_dir):
    return load_file(Path(run_dir) / "router" / "router.safetensors")


@pytest.mark.slow
def test_cli_run_killed_midway_resumes_to_the_uninterrupted_result(tmp_path, random_suite_backbone):
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    straight = write_config(tmp_path, random_suite_backbone, "straight")
    subprocess.run(cli("train", str(straight), "--no-progress"), check=True, env=environment, capture_output=True)

    interrupted = write_config(tmp_path, random_suite_backbone, "interrupted")
    process = subprocess.Popen(cli("train", str(interrupted), "--no-progress"), env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = tmp_path / "interrupted" / "checkpoints" / "step-000002" / "state.json"
    deadline = time.time() + 120
    while not checkpoint.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert checkpoint.exists() and not (tmp_path / "interrupted" / "router").exists()
    subprocess.run(cli("train", str(interrupted), "--resume", "--no-progress"), check=True, env=environment,
                   capture_output=True)
    for name, value in routers(tmp_path / "straight").items():
        torch.testing.assert_close(routers(tmp_path / "interrupted")[name], value, rtol=0, atol=0)
    metrics = (tmp_path / "interrupted" / "metrics.csv").read_text().splitlines()
    assert metrics == (tmp_path / "straight" / "metrics.csv").read_text().splitlines()
    assert (tmp_path / "interrupted" / "training.png").exists()


@pytest.mark.slow  # 18-25 s each on a 2-core Xeon: four short runs
@pytest.mark.parametrize("standardize, pins", [(False, False), (True, False), (True, True)],
                         ids=["paper_router", "standardizing_router", "pinned_heads"])
def test_resume_drops_metrics_logged_after_the_last_checkpoint(tmp_path, random_suite_backbone, standardize, pins):
    # A run killed after logging its third step but before the next checkpoint: resuming from the checkpoint after
    # two steps must not log the third twice. Simulated deterministically: finish a 3-step run, then remove its
    # adapter and its final checkpoint, and resume. A standardizing router's statistics (and pins) come from the
    # checkpoint.
    from elastic_attention.training import train

    elastic = {"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8,
               "router_standardize": standardize}
    extra = {}
    if pins:
        heads = write_head_sets(tmp_path / "search.json", {0.5: [[True, False], [False, True]]})
        extra = {"initial_full_probability": 0.9, "initial_full_heads": str(heads), "sparse_outside_initial_heads": True}
    straight = TrainConfig.from_yaml(
        write_config(tmp_path, random_suite_backbone, "straight", steps=3, elastic=elastic, **extra)
    )
    train(straight, progress=False)
    killed = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "killed", steps=3, elastic=elastic,
                                                **extra))
    train(killed, progress=False)
    run = tmp_path / "killed"
    assert len((run / "metrics.csv").read_text().splitlines()) == 4  # header + steps 0, 1, 2
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000003"
    for folder in (run / "router", run / "checkpoints" / "step-000003"):
        shutil.rmtree(folder)
    (run / "checkpoints" / "latest").write_text("step-000002")  # as the run left it before its final checkpoint
    train(killed, resume=True, progress=False)
    assert (run / "metrics.csv").read_text().splitlines() == (tmp_path / "straight" / "metrics.csv").read_text().splitlines()
    for name, value in routers(tmp_path / "straight").items():
        torch.testing.assert_close(routers(run)[name], value, rtol=0, atol=0)
    scales = [value for name, value in routers(run).items() if name.endswith("feature_scale")]
    assert len(scales) == (2 if standardize else 0) and all((scale != 1).all() for scale in scales)
    assert len([name for name in routers(run) if name.endswith("pinned_sparse")]) == (2 if pins else 0)


STANDARDIZING = {"elastic": {"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8,
                              "router_standardize": True}}
#: A head-set router on the expected objective (its two sets: the file's set at MSR 0.5 and every head sparse).
HEAD_SETS_EXPECTED = {"elastic": {**STANDARDIZING["elastic"], "head_set_choices": 2},
                      "initial_full_heads": "head_sets.json", "head_set_choices_msrs": [0.5, 1.0],
                      "initial_full_probability": 0.7, "head_set_objective": "expected"}


@pytest.mark.slow
@pytest.mark.parametrize("distributed, extra", [("ddp", {}), ("fsdp", {}),
                                               ("fsdp", {"fsdp_reshard_after_forward": False}),
                                               ("fsdp", STANDARDIZING),
                                               ("fsdp", {**STANDARDIZING, "initial_full_probability": 0.9,
                                                         "initial_full_heads": "head_sets.json"}),
                                               ("ddp", HEAD_SETS_EXPECTED)],
                         ids=["ddp", "fsdp", "fsdp_keep", "fsdp_standardizing_router", "fsdp_from_a_head_set",
                              "ddp_head_set_router_expected"])
def test_two_gloo_processes_match_one_process(tmp_path, random_suite_backbone, distributed, extra):
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ELASTIC_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    if "initial_full_heads" in extra:  # a file name: the file goes into this test's folder
        heads = write_head_sets(tmp_path / extra["initial_full_heads"], {0.5: [[True, False], [False, True]]})
        extra = {**extra, "initial_full_heads": str(heads)}
    single = write_config(tmp_path, random_suite_backbone, "single", steps=3, checkpoint_every=0, device="cpu",
                          **{key: value for key, value in extra.items() if key != "distributed"
                             and not key.startswith("fsdp_")})
    subprocess.run(cli("train", str(single), "--no-progress"), check=True, env=environment, capture_output=True)
    double = write_config(tmp_path, random_suite_backbone, "double", steps=3, checkpoint_every=0, device="cpu",
                          distributed=distributed, **extra)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "elastic_attention.cli", "train", str(double), "--no-progress"]
    result = subprocess.run(torchrun, env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    for name, value in routers(tmp_path / "single").items():
        torch.testing.assert_close(routers(tmp_path / "double")[name], value, rtol=1e-5, atol=1e-6)
    logged = [list(csv.DictReader((tmp_path / run / "metrics.csv").open())) for run in ("single", "double")]
    columns = [key for key in logged[0][0] if key.startswith(("lm_loss", "msr/"))]
    assert any(key.startswith("lm_loss/") for key in columns)
    for one, two in zip(*logged):  # the answer loss of each task gathered from both processes
        for key in columns:
            assert float(two[key]) == pytest.approx(float(one[key]), rel=1e-4, nan_ok=True), key


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path):
    """Every config's first line is the command that runs it; a router config's model ships in the repository or is
    a known model that `make real-model` fetches."""
    from elastic_attention.models import KNOWN_MODELS
    from elastic_attention.training.pretrain_config import PretrainConfig

    command = path.read_text().splitlines()[0].split()
    assert command[:2] == ["#", "elastic-attention"] and command[3] == f"configs/{path.name}"
    assert command[2] in ("train", "pretrain")
    if command[2] == "pretrain":
        PretrainConfig.from_yaml(path)
        return
    config = TrainConfig.from_yaml(path)
    fetched = [f"artifacts/{name}" for name in KNOWN_MODELS]
    assert (ROOT / config.model).exists() or Path(config.model).exists() or config.model in fetched


def test_supervised_loss_equals_the_models_own_loss_over_labelled_tokens():
    from conftest import tiny_model

    from elastic_attention.training.trainer import supervised_loss

    model = tiny_model("qwen3")
    rows = [EncodedRow([5, 6, 7, 8], [9, 10], "a"), EncodedRow([11, 12, 13], [14], "b")]
    packs = pack_rows(rows, budget=12)
    pack = packs[0]
    expected = model(input_ids=pack.input_ids[None], position_ids=pack.position_ids[None],
                     labels=pack.labels[None], use_cache=False).loss
    torch.testing.assert_close(supervised_loss(model, pack, torch.device("cpu")), expected)


def test_token_losses_belong_to_their_samples():
    """Oracle: each sample's answer cross-entropy computed alone, in float64, against its share of the pack's."""
    from conftest import tiny_model

    from elastic_attention.training.trainer import supervised_token_losses

    model = tiny_model("qwen3")
    rows = [EncodedRow([5, 6, 7, 8], [9, 10, 11], "a"), EncodedRow([12, 13], [14], "b"),
            EncodedRow([15, 16, 17, 18, 19], [20, 21], "a")]
    pack = pack_rows(rows, budget=32)[0]
    losses, samples = supervised_token_losses(model, pack, torch.device("cpu"))
    assert samples.tolist() == [0, 0, 0, 1, 2, 2]
    with torch.no_grad():
        for index, row in enumerate(rows):
            logits = model(input_ids=torch.tensor([row.prompt_ids + row.answer_ids])).logits[0].double()
            alone = torch.nn.functional.cross_entropy(logits[len(row.prompt_ids) - 1 : -1], torch.tensor(row.answer_ids),
                                                      reduction="none")
            torch.testing.assert_close(losses[samples == index].double(), alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("student", ["full", "sparse", "mixed"])
def test_distillation_is_the_kl_from_full_attention_at_each_answer_token(student):
    """Oracle: per row alone, float64 KL between the plain model's distribution (the teacher: no elastic attention)
    and the attached model's under the student's forced routing; zero when the student is full attention."""
    from conftest import tiny_model

    from elastic_attention import ElasticConfig, attach, force_routing
    from elastic_attention.training.trainer import distillation_token_losses

    rows = [EncodedRow(list(range(3, 60)), [9, 10, 11], "a"), EncodedRow(list(range(20, 70)), [14], "b"),
            EncodedRow(list(range(5, 41)), [15, 16], "a")]
    pack = pack_rows(rows, budget=256)[0]
    plain = tiny_model("qwen3")
    model = attach(tiny_model("qwen3"), ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4))
    routing = {"full": "full", "sparse": "sparse", "mixed": torch.tensor([[True, False], [False, True]])}[student]
    force_routing(model, routing)
    losses, samples = distillation_token_losses(model, pack, torch.device("cpu"))
    assert samples.tolist() == [0, 0, 0, 1, 2, 2]
    with torch.no_grad():
        for index, row in enumerate(rows):
            ids = torch.tensor([row.prompt_ids + row.answer_ids])
            answer = slice(len(row.prompt_ids) - 1, -1)
            teacher = torch.log_softmax(plain(input_ids=ids).logits[0, answer].double(), dim=-1)
            routed = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, answer].double(), dim=-1)
            expected = (teacher.exp() * (teacher - routed)).sum(-1)
            torch.testing.assert_close(losses[samples == index].double(), expected, rtol=1e-4, atol=1e-6)
            if student == "full":
                assert float(expected.abs().max()) < 1e-5
            else:
                assert float(expected.max()) > 1e-4  # the window hides part of these prompts
    assert runtime_forced(model).tolist() == (routing.tolist() if student == "mixed" else
                                              torch.full((2, 2), student == "full").tolist())


def test_a_distillation_run_logs_its_kl(tmp_path, random_suite_backbone):
    from elastic_attention.training import train

    config = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "distill", steps=2, checkpoint_every=0,
                                                lm_loss="distillation"))
    summary = train(config, progress=False)
    assert summary["steps"] == 2 and summary["config"]["lm_loss"] == "distillation"
    assert summary["teacher_cache_bytes"] > 0 and summary["config"]["teacher_cache"] is True
    rows = list(csv.DictReader((tmp_path / "distill" / "metrics.csv").open()))
    assert len(rows) == 2 and all(float(row["lm_loss"]) >= 0 for row in rows)
    assert all(float(row["lm_loss/needle_single"]) >= 0 for row in rows)


def test_a_time_budget_stops_the_run_with_its_schedules_run_out(tmp_path, random_suite_backbone, monkeypatch):
    """Each step takes 10 s of a fake clock; with 25 s for 6 steps the run stops after 3, its temperature and
    learning rate at the positions the budget sets (max of step / steps and elapsed / max_seconds, in steps)."""
    from elastic_attention.training import train
    from elastic_attention.training import trainer as trainer_module

    clock = [0.0]
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    one_step = trainer_module.RouterTrainer.train_step

    def ten_second_step(self):
        clock[0] += 10.0
        return one_step(self)

    monkeypatch.setattr(trainer_module.RouterTrainer, "train_step", ten_second_step)
    config = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "budget", steps=6, max_seconds=25,
                                                lr_schedule="cosine", warmup_fraction=0.0))
    summary = train(config, progress=False)
    assert (summary["steps"], summary["stopped_by"], summary["train_seconds"]) == (3, "max_seconds", 30.0)
    rows = list(csv.DictReader((tmp_path / "budget" / "metrics.csv").open()))
    positions = [0.0, 2.4, 4.8]  # max(step, 10 * step / 25 * 6)
    assert [float(row["temperature"]) for row in rows] == pytest.approx(
        [config.temperature.at(position, 6) for position in positions])
    assert float(rows[-1]["temperature"]) == config.temperature.end
    assert [float(row["lr"]) for row in rows] == pytest.approx(
        [config.router_lr * 0.5 * (1 + math.cos(math.pi * position / 6)) for position in positions])
    checkpoint = json.loads((tmp_path / "budget" / "checkpoints" / "step-000003" / "state.json").read_text())
    assert checkpoint["train_seconds"] == 30.0
    resumed = train(config, resume=True, progress=False)  # the budget is spent: nothing more to train
    assert (resumed["steps"], resumed["stopped_by"]) == (3, "max_seconds")


def runtime_forced(model):
    from elastic_attention.integration import runtime_of

    return runtime_of(model).forced


def test_distillation_trains_the_routers_through_their_decisions():
    from conftest import tiny_model

    from elastic_attention import ElasticConfig, attach, routers_of
    from elastic_attention.training.trainer import distillation_token_losses

    rows = [EncodedRow(list(range(3, 60)), [9, 10], "a"), EncodedRow(list(range(20, 70)), [14], "b")]
    pack = pack_rows(rows, budget=128)[0]
    model = attach(tiny_model("llama"), ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4))
    model.train()
    losses, _ = distillation_token_losses(model, pack, torch.device("cpu"), noise_seed=3)
    losses.mean().backward()
    assert runtime_forced(model) is None  # the routers decided the student's heads
    gradients = [p.grad for router in routers_of(model).values() for p in router.parameters()]
    assert all(g is not None for g in gradients) and any(float(g.abs().sum()) > 0 for g in gradients)


def test_routers_pool_the_prompt_of_a_training_sample_never_its_answer():
    """Oracle: the routers' inputs for each prompt run alone, as at inference, against the same prompts packed with
    their answers for training."""
    from conftest import tiny_model

    from elastic_attention import ElasticConfig, attach, routers_of
    from elastic_attention.training.trainer import supervised_loss

    rows = [EncodedRow(list(range(3, 40)), [70, 71, 72, 73, 74], "a"), EncodedRow(list(range(20, 45)), [80, 81], "b")]
    pack = pack_rows(rows, budget=128)[0]
    model = attach(tiny_model("qwen3"), ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4,
                                                      pool_first=4, pool_last=6))
    seen = []
    for router in routers_of(model).values():
        router.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    model.eval()
    with torch.no_grad():
        for row in rows:
            model(input_ids=torch.tensor([row.prompt_ids]), use_cache=False)
        alone = [torch.cat([seen[i], seen[i + len(seen) // 2]]) for i in range(len(seen) // 2)]
        seen.clear()
        supervised_loss(model, pack, torch.device("cpu"))
        torch.testing.assert_close(seen, alone)
        seen.clear()
        model(input_ids=pack.input_ids[None], position_ids=pack.position_ids[None], use_cache=False)
    assert not torch.allclose(seen[0], alone[0])  # without the prompt lengths, the answers would be pooled


def test_gradient_checkpointing_reproduces_the_router_gradients():
    from conftest import tiny_model

    from elastic_attention import ElasticConfig, attach, routers_of, routing_report
    from elastic_attention.training.trainer import enable_gradient_checkpointing, supervised_loss

    rows = [EncodedRow(list(range(3, 60)), [9, 10], "a"), EncodedRow(list(range(20, 70)), [14], "b")]
    pack = pack_rows(rows, budget=128)[0]
    gradients = []
    for checkpointing in (False, True):
        model = tiny_model("llama")
        attach(model, ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4))
        if checkpointing:
            enable_gradient_checkpointing(model)
        model.train()
        loss = supervised_loss(model, pack, torch.device("cpu"), noise_seed=7) + routing_report(model).msr.sum()
        loss.backward()
        gradients.append([p.grad.clone() for router in routers_of(model).values() for p in router.parameters()])
    assert any(g.abs().sum() > 0 for g in gradients[0])
    for plain, recomputed in zip(*gradients):
        torch.testing.assert_close(recomputed, plain, rtol=1e-5, atol=1e-7)


def test_a_run_owns_its_folder(tmp_path, random_suite_backbone):
    """A new run refuses a folder holding another run; --overwrite replaces it whole; --resume refuses a checkpoint
    made with other settings, naming each; a half-written checkpoint of a killed run is cleared."""
    from elastic_attention.training import train

    first = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "run", steps=2))
    train(first, progress=False)
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match="holds another run .*checkpoints, metrics.csv.*--overwrite.*--resume"):
        train(first, progress=False)
    staging = run / "checkpoints" / ".staging-leftover"
    staging.mkdir()
    other = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "run", steps=3, seed=5,
                                               elastic={"block_size": 32, "sink_tokens": 0, "local_tokens": 64,
                                                        "xa_stride": 8}))
    with pytest.raises(ConfigError) as refused:
        train(other, resume=True, progress=False)
    message = str(refused.value)
    assert "seed: checkpoint 0, now 5" in message and "steps: checkpoint 2, now 3" in message
    assert "'sink_tokens': 0" in message and "output_dir:" not in message
    with pytest.raises(ConfigError, match="choose one"):
        train(first, resume=True, overwrite=True, progress=False)
    train(other, overwrite=True, progress=False)
    assert not staging.exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000002", "step-000003"]
    assert len((run / "metrics.csv").read_text().splitlines()) == 4  # header + the new run's three steps


def test_rows_in_the_authors_layout_load_as_their_training_reads_them(tmp_path, random_suite_backbone):
    """A parquet in their layout (metadata as a dict and as a dict literal, their task classes) becomes rows with
    their task names, order and wording; their target table covers every class; the rows train."""
    import ast
    import json

    from datasets import Dataset

    from elastic_attention.training import train
    from elastic_attention.training.data import REFERENCE_TARGETS

    records = [
        {"context": "\ufeffthe cat sees a dog .", "question": "question : what is the value of k3 ?",
         "answer": "v4", "metadata": {"task": "Single QA", "is_prefix": True, "length": 30}},
        {"context": "the dog sees a cat .", "question": "question : what is the value of k5 ?", "answer": "v6",
         "metadata": str({"task": "Summarization", "is_prefix": False, "length": 30})},
        {"context": "a b c", "question": "d", "answer": "e", "metadata": {"task": "Math", "is_prefix": False}},
    ]
    path = tmp_path / "theirs.parquet"  # a parquet column holds one type: the dicts written as literals
    Dataset.from_list([{**r, "metadata": str(r["metadata"])} for r in records]).to_parquet(path)
    rows = load_rows(path)
    as_dicts = tmp_path / "theirs.jsonl"
    literal = ast.literal_eval
    as_dicts.write_text("".join(json.dumps({**r, "metadata": literal(r["metadata"]) if isinstance(r["metadata"], str)
                                            else r["metadata"]}) + "\n" for r in records))
    assert load_rows(as_dicts) == rows
    assert [row.task for row in rows] == ["Single QA", "Summarization", "Other"]
    assert rows[0].prompt == "question : what is the value of k3 ?\nthe cat sees a dog ."
    assert rows[1].prompt.startswith("You are given several news passages.") and rows[1].prompt.endswith("Summary:")
    assert set(row.task for row in rows) <= set(REFERENCE_TARGETS)
    (tmp_path / "bad.jsonl").write_text('{"context": "c", "question": "q", "answer": "a", "metadata": "{oops"}\n')
    with pytest.raises(InputError, match="bad.jsonl, line 1: `metadata` is neither a dict nor a dict literal"):
        load_rows(tmp_path / "bad.jsonl")
    everything = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "everything", steps=2,
                                                    data={"source": str(path), "budget": 600},
                                                    targets=dict(REFERENCE_TARGETS), checkpoint_every=0))
    with pytest.raises(ConfigError, match="`targets` names tasks \\['Code', 'In-Context Learning', 'MultiHop QA'\\] "
                                          "that are not in the rows of .*theirs.parquet; known: \\['Other', "
                                          "'Single QA', 'Summarization'\\]"):
        train(everything, progress=False)
    present = {task: REFERENCE_TARGETS[task] for task in ("Single QA", "Summarization", "Other")}
    config = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "theirs", steps=2,
                                                data={"source": str(path), "budget": 600},
                                                targets=present, checkpoint_every=0))
    summary = train(config, progress=False)
    assert summary["steps"] == 2


def test_the_teacher_cache_gives_the_same_losses_without_a_second_teacher_forward():
    """A pack's second visit takes the teacher's log-probabilities from the cache: the same KL as a fresh teacher
    forward (float32, exactly), and only the student's forward runs."""
    from conftest import tiny_model

    from elastic_attention import ElasticConfig, attach, force_routing
    from elastic_attention.training.trainer import TeacherCache, distillation_token_losses

    rows = [EncodedRow(list(range(3, 60)), [9, 10, 11], "a"), EncodedRow(list(range(20, 70)), [14], "b")]
    pack = pack_rows(rows, budget=256)[0]
    model = attach(tiny_model("qwen3"), ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4))
    force_routing(model, torch.tensor([[True, False], [False, True]]))
    forwards = []
    model.register_forward_hook(lambda module, args, output: forwards.append(1))
    cache, cpu = TeacherCache(), torch.device("cpu")
    fresh, samples = distillation_token_losses(model, pack, cpu)
    first, _ = distillation_token_losses(model, pack, cpu, teacher_cache=cache)
    before = len(forwards)
    again, again_samples = distillation_token_losses(model, pack, cpu, teacher_cache=cache)
    assert len(forwards) - before == 1  # the student alone
    assert torch.equal(first, fresh) and torch.equal(again, fresh) and torch.equal(again_samples, samples)
    assert cache.values == 4 * model.config.vocab_size  # four supervised tokens


def test_schedule_position_spreads_what_the_budget_leaves_over_the_steps():
    from elastic_attention.training.trainer import schedule_position

    assert schedule_position(3, 10, 50.0, 100.0) == 5.0  # half the budget spent: half the schedule
    assert schedule_position(6, 10, 50.0, 100.0) == 6.0  # the steps ahead of the clock
    assert schedule_position(2, 10, 60.0, 100.0, first_visit_seconds=50.0) == 2.0  # 10 of the 50 s left
    assert schedule_position(2, 10, 75.0, 100.0, first_visit_seconds=50.0) == 5.0
    assert schedule_position(2, 10, 75.0, 100.0, 40.0, pending_first_visit_seconds=10.0) == 7.0  # 35 s of 50
    # first visits alone would spend the budget: the share of it spent, not the end at once
    assert schedule_position(1, 100, 11.0, 400.0, 10.0, pending_first_visit_seconds=490.0) == 2.75


def test_fresh_rows_give_every_epoch_rows_no_other_epoch_had(tmp_path, random_suite_backbone):
    """Oracle: the suite's own rows at each epoch's seed (seed + e * 1000003), packed the same way: epoch e's packs
    hold exactly those, no row repeats across epochs, and without fresh_rows every epoch repeats epoch 0's packs."""
    from elastic_attention.evaluation.suites import get_suite
    from elastic_attention.rows import encode_row
    from elastic_attention.training.data import EPOCH_SEED_STRIDE

    config = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "fresh", steps=5,
                                                data={"tasks": ["needle_single", "local_recall"], "lengths": [200],
                                                      "rows": 4, "budget": 400, "seed": 5, "fresh_rows": True}))
    trainer = RouterTrainer(config, progress=False)
    trainer.setup()
    per_epoch = len(trainer.packs)
    suite = get_suite("synthetic")
    seen = set()
    for epoch in range(3):
        seed = 5 + epoch * EPOCH_SEED_STRIDE
        rows = [row for index in range(2) for row in
                [suite.generate(task, 200, seed, 2, trainer.tokenizer)[index] for task in ("needle_single",
                                                                                           "local_recall")]]
        expected = sorted(tuple(encode_row(trainer.tokenizer, row).prompt_ids) for row in rows)
        packs = trainer.epochs.of(epoch)
        got = sorted(tuple(ids) for pack in packs for ids in _prompts_of(pack))
        assert got == expected
        assert not seen & set(got)
        seen |= set(got)
    for step in range(4):  # packs_per_step 2: each pack of a step from its position's epoch
        for offset, pack in enumerate(trainer.step_packs(step)):
            assert any(pack is other for other in trainer.epochs.of((2 * step + offset) // per_epoch))
    summary = trainer.train()
    assert summary["steps"] == 5
    trainer.cleanup()

    repeated = TrainConfig.from_yaml(write_config(tmp_path, random_suite_backbone, "repeated",
                                                  data={"tasks": ["needle_single", "local_recall"], "lengths": [200],
                                                        "rows": 4, "budget": 400, "seed": 5}))
    again = RouterTrainer(repeated, progress=False)
    again.setup()
    assert all(again.epochs.of(epoch) is again.packs for epoch in range(3))
    again.cleanup()


def _prompts_of(pack):
    """Each sample's prompt ids in a pack."""
    ids = pack.input_ids.view(-1).tolist()
    return [ids[start : start + prompt_length] for start, _, prompt_length in pack.spans]


@pytest.mark.parametrize(("extra", "message"), [
    ({"data": {"source": "rows.jsonl", "fresh_rows": True}}, "is a row file"),
    ({"data": {"fresh_rows": True}, "head_set_objective": "expected", "elastic": {"head_set_choices": 2}},
     "no pack is visited twice"),
    ({"data": {"fresh_rows": True}, "lm_loss": "distillation"}, "teacher_cache: false"),
    ({"elastic": {"head_set_choices": 2, "signal_layer": 1, "signal_thresholds": [0.2]}}, "no weights to train"),
    ({"router_objective": "teacher"}, "must be one of"),
    ({"router_objective": "both", "signal_teacher_threshold": 0.0}, "must be in \\(0, 1\\]"),
    ({"router_objective": "both", "signal_teacher_weight": -1.0}, "`signal_teacher_weight` positive"),
    ({"router_objective": "both", "signal_teacher_layer": -2}, "a layer index \\(>= 0\\) or null"),
    ({"router_objective": "both", "signal_teacher_layer": 2.5}, "must be an integer"),
    ({"signal_teacher_layer": 3}, "which `router_objective: paper` does not use"),
])
def test_fresh_rows_and_signal_routers_refuse_what_they_cannot_train(extra, message):
    from elastic_attention.training.train_config import DataConfig

    if "data" in extra:
        extra = {**extra, "data": DataConfig(**extra["data"])}
    with pytest.raises(ConfigError, match=message):
        TrainConfig(model="m", **extra)
