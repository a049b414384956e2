"""The pretraining recipe: the CLI for two CPU steps of the shipped tiny backbone's config, resume, the data stream
the shipped backbones were trained on and the rows they were evaluated on, and the dense sequences' supervision (each
supervised token recovered by a slow parse of the words before it)."""

from __future__ import annotations

import csv
import math
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from elastic_attention.chat import encode_prompt
from elastic_attention.cli import main as cli_main
from elastic_attention.errors import ConfigError
from elastic_attention.evaluation.seeded_random import SampleRandom
from elastic_attention.evaluation.synthetic import TASKS, generate
from elastic_attention.evaluation.synthetic.tokenizer import build_tokenizer
from elastic_attention.training.backbone import build_backbone_config, rope_theta_of
from elastic_attention.training.data import IGNORE_INDEX
from elastic_attention.training.pretrain import learning_rate, pretrain
from elastic_attention.training.pretrain_eval import EVAL_SEED
from elastic_attention.training.pretrain_config import PretrainConfig, PretrainData
from elastic_attention.training.pretrain_data import StepBatches, dense_needle_sequence, sequence_length

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "backbone_tiny.yaml"
SMALL = ROOT / "configs" / "backbone_small.yaml"

#: Two CPU steps of the tiny config: 2048-token steps of 256-token sequences, a 256-token evaluation.
CPU_SMOKE = ["max_steps=2", "max_seconds=null", "data.max_len=256", "data.tokens_per_step=2048", "eval.length=256",
             "eval.samples=1", "num_workers=0", "device=cpu"]

#: A much smaller shape for the resume test (every step and evaluation in milliseconds).
MINI = ["model.num_layers=1", "model.hidden_size=64", "model.num_heads=2", "model.num_kv_heads=1",
        "model.head_dim=32", "model.intermediate_size=128", "data.max_len=320", "data.min_len=192",
        "data.warmup_len=192", "data.length_warmup_steps=1", "data.suite_start_step=1", "data.local_start_step=1",
        "data.tokens_per_step=768", "eval.length=192", "eval.samples=1", "num_workers=0", "device=cpu",
        "max_seconds=null", "log_every=1"]


def dense_words(seed: int, length: int, **rates) -> tuple[list[str], list[int]]:
    """A dense pretraining sequence as words, and its supervised positions (each labelled with its own token)."""
    ids = build_tokenizer().get_vocab()
    words = {index: word for word, index in ids.items()}
    input_ids, labels = dense_needle_sequence(SampleRandom(seed), length, ids, **rates)
    assert len(input_ids) == len(labels) == length
    supervised = [t for t, label in enumerate(labels) if label != IGNORE_INDEX]
    assert all(labels[t] == input_ids[t] for t in supervised)
    return [words[i] for i in input_ids], supervised


@pytest.fixture()
def one_thread():
    # Two intra-op threads on a two-vCPU VM are often several times slower than one for this tiny model.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cli_two_cpu_steps_of_the_tiny_config_save_a_loadable_backbone(tmp_path, one_thread, capsys) -> None:
    out = tmp_path / "run"
    assert cli_main(["pretrain", str(TINY), *CPU_SMOKE, f"output_dir={out}", "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"steps": 2, "tokens": 2 * 2048, "train_seconds": printed["train_seconds"],
                       "model": str(out / "model")}
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "model" / "train_summary.json").read_text() == (out / "summary.json").read_text()
    assert summary["steps"] == 2 and summary["config"]["model"]["head_dim"] == 128
    assert set(summary["eval"]["accuracy"]) >= {"needle_single", "local_count"}
    with (out / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [row["step"] for row in rows] == ["1"]  # step 1, then every log_every (50) steps
    assert float(rows[0]["loss"]) == pytest.approx(float(rows[0]["dense"])) and rows[0]["suite"] == "nan"
    assert (out / "training.png").exists() and not (out / "checkpoints").exists()

    model = transformers.AutoModelForCausalLM.from_pretrained(out / "model", local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "model", local_files_only=True)
    config = model.config
    assert config.model_type == "qwen3" and rope_theta_of(config) == 1e6
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (256, 4, 128)
    assert config.num_attention_heads == 2 * config.num_key_value_heads
    assert model.dtype == torch.bfloat16
    assert sum(path.stat().st_size for path in (out / "model").glob("*.safetensors")) <= 10 * 1024 * 1024
    shipped = ROOT / "src" / "elastic_attention" / "assets" / "backbone_tiny"
    assert sorted(p.name for p in (out / "model").iterdir()) == sorted(p.name for p in shipped.iterdir())
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "question : what is the value of k3 ?"}], tokenize=False,
        add_generation_prompt=True,
    )
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size) and torch.isfinite(logits.float()).all()

    assert cli_main(["pretrain", str(TINY), *CPU_SMOKE, f"output_dir={out}"]) == 2  # a folder holding a run
    assert "holds another run (model, metrics.csv" in capsys.readouterr().err


def test_a_resumed_run_replays_the_uninterrupted_one(tmp_path, one_thread) -> None:
    """Kill after the step-2 checkpoint of a 3-step run (simulated: the step-3 checkpoint and model removed), resume:
    the same weights, bit for bit, and the same logged losses."""
    def run(name, resume=False, *overrides):
        config = PretrainConfig.from_yaml(TINY, [*MINI, "max_steps=3", "checkpoint_every=2", *overrides,
                                                 f"output_dir={tmp_path / name}"])
        return pretrain(config, resume=resume, progress=False)

    straight = run("straight")
    run("killed")
    killed = tmp_path / "killed"
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["latest", "step-000002", "step-000003"]
    shutil.rmtree(killed / "model")
    shutil.rmtree(killed / "checkpoints" / "step-000003")
    (killed / "checkpoints" / "latest").write_text("step-000002")
    summary = run("killed", resume=True)
    for key in ("steps", "tokens", "supervised_tokens"):
        assert summary[key] == straight[key]
    weights = [(tmp_path / name / "model" / "model.safetensors").read_bytes() for name in ("straight", "killed")]
    assert weights[0] == weights[1]

    def losses(name):
        with (tmp_path / name / "metrics.csv").open() as file:
            return [(row["step"], row["loss"], row["lr"], row["length"]) for row in csv.DictReader(file)]

    assert losses("killed") == losses("straight") and len(losses("straight")) == 3
    with pytest.raises(ConfigError, match="lr: checkpoint 0.001, now 0.002"):
        run("killed", True, "lr=0.002")


#: SHA-256 (first 16 hex digits) of the batches of steps 0, 3500, 9000 and 14491 of the shipped tiny recipe (seed 0),
#: as scripts/pretrain_backbone.py built them: both at commit b0d6f31, which trained the shipped l3_20 (14491 is its
#: last step), and at its last version (d96b3c3). Checked once in full (2026-12-02, 9 minutes on 2 cores): the recipe's
#: first 14492 steps supervise 24,173,246 tokens, l3_20's train_summary.json count.
SHIPPED_STREAM = {0: ((128, 256), 0, "1a56b8a770d13a14"), 3500: ((64, 512), 28, "71d0630084526a24"),
                  9000: ((32, 1024), 12, "3ac210d6ac72ee3c"), 14491: ((32, 1024), 19, "ca88cb634a90c700")}


def test_the_data_stream_is_the_one_the_shipped_backbones_were_trained_on() -> None:
    config = PretrainConfig.from_yaml(TINY)
    batches = StepBatches(config.data, config.seed, build_tokenizer())
    for step, (shape, suite_rows, digest) in SHIPPED_STREAM.items():
        input_ids, labels, is_suite = batches.batch(step)
        hashed = hashlib.sha256(b"".join(t.numpy().tobytes() for t in (input_ids, labels, is_suite)))
        assert (tuple(input_ids.shape), int(is_suite.sum()), hashed.hexdigest()[:16]) == (shape, suite_rows, digest)


#: SHA-256 (first 16 hex digits) of the recipe's evaluation rows per task (24 rows at 2048 tokens from EVAL_SEED: the
#: prompt ids as int64, the answer, a newline), as scripts/pretrain_backbone.py at commit b0d6f31 built them
#: (`tokenizer.encode(render_prompt(tokenizer, row))`) when it evaluated the shipped l3_20.
SHIPPED_EVAL_ROWS = {"needle_single": "f58ce1c0715ebdd0", "needle_multikey": "24fdd2f2575f7d33",
                     "needle_multivalue": "98260f6162d48ef2", "variable_tracking": "1d0faa3a877ef824",
                     "local_recall": "bc098d34e728c9fa", "local_pattern": "384bec16dcb62155",
                     "local_count": "cd79d468cfe227d1"}


def test_the_evaluation_rows_are_the_ones_the_shipped_backbone_was_scored_on() -> None:
    tokenizer = build_tokenizer()
    digests = {}
    for task in TASKS:
        hashed = hashlib.sha256()
        for row in generate(task, 2048, EVAL_SEED, 24):
            prompt = encode_prompt(tokenizer, row.prompt)
            assert len(prompt) == 2048
            hashed.update(np.asarray(prompt, dtype=np.int64).tobytes() + row.answer.encode() + b"\n")
        digests[task] = hashed.hexdigest()[:16]
    assert digests == SHIPPED_EVAL_ROWS


def test_a_resumed_loader_starts_at_its_step() -> None:
    data = PretrainData(max_len=384, tokens_per_step=768, length_warmup_steps=1, suite_start_step=1)
    tokenizer = build_tokenizer()
    resumed = iter(StepBatches(data, 5, tokenizer, start_step=3))
    for step in (3, 4):
        expected = StepBatches(data, 5, tokenizer).batch(step)
        for got, want in zip(next(resumed), expected):
            assert torch.equal(got, want)


def test_small_config_shapes() -> None:
    config = PretrainConfig.from_yaml(SMALL)
    backbone = build_backbone_config(config.model, build_tokenizer(), config.data.max_len)
    assert backbone.num_attention_heads * backbone.head_dim != backbone.hidden_size
    assert backbone.num_attention_heads // backbone.num_key_value_heads >= 2
    assert rope_theta_of(backbone) == 1e6 and backbone.max_position_embeddings == 131072


def test_length_curriculum() -> None:
    data = PretrainConfig.from_yaml(TINY, ["data.max_len=4096"]).data
    warm = [sequence_length(step, data, 0) for step in range(data.length_warmup_steps)]
    assert set(warm) == {data.warmup_len}
    later = {sequence_length(step, data, 0) for step in range(data.length_warmup_steps, data.length_warmup_steps + 400)}
    assert min(later) >= data.min_len and max(later) <= data.max_len and len(later) > 10
    assert all(length % 128 == 0 for length in later)


def test_learning_rate_warms_up_and_decays_over_the_time_or_step_budget() -> None:
    config = PretrainConfig(max_steps=1000, max_seconds=100.0, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert learning_rate(0, 0.0, config) == pytest.approx(1e-4)
    assert learning_rate(9, 0.0, config) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.009))))
    assert learning_rate(100, 50.0, config) == pytest.approx(1e-3 * 0.55)  # time is further than steps: half-way
    assert learning_rate(500, 10.0, config) == pytest.approx(1e-3 * 0.55)  # steps are further than time
    assert learning_rate(999, 200.0, config) == pytest.approx(1e-4)  # past the budget: the floor
    steps_only = PretrainConfig(max_steps=4, max_seconds=None, warmup_steps=0)
    assert [learning_rate(step, 1e9, steps_only) / 1e-3 for step in (0, 4)] == pytest.approx([1.0, 0.1])


def test_dense_sequence_supervises_queried_values() -> None:
    text, supervised = dense_words(0, 2048, echo_rate=0.0)
    assert len(supervised) > 20
    for t in supervised:
        assert text[t - 2] == "ask" and text[t].startswith("v")
        key, value = text[t - 1], text[t]
        earlier = [s for s in range(t - 2) if text[s] == "remember" and text[s + 1] == key]
        assert earlier and text[earlier[0] + 2] == value


def test_dense_sequence_repeats_supervise_copied_spans() -> None:
    text, supervised = dense_words(1, 1024, repeat_rate=0.25)
    copied = [t for t in supervised if text[t - 2] != "ask"]
    assert len(copied) > 20
    joined = " ".join(text)
    for t in copied:
        # The copied token and the one before it occur together earlier in the sequence.
        assert f"{text[t - 1]} {text[t]}" in " ".join(text[: t - 1]), (t, joined[:200])


def test_echoed_needles_and_variable_chains_are_recoverable() -> None:
    """Every supervised token of the echo-and-chain recipe follows from earlier tokens by a slow parse."""
    kinds = {"echo": 0, "ask": 0, "hold": 0, "echoed_target": 0}
    for seed in range(4):
        text, supervised = dense_words(seed, 1531, echo_rate=1.0, chain_rate=0.1)
        for t in supervised:
            if text[t - 3] == "remember":  # remember k v [k]
                assert text[t] == text[t - 2] and text[t].startswith("k")
                kinds["echo"] += 1
            elif text[t - 2] == "ask":  # ask k [v]: the value of the one earlier needle of k
                needles = [s for s in range(t - 2) if text[s] == "remember" and text[s + 1] == text[t - 1]]
                assert len(needles) == 1 and text[needles[0] + 2] == text[t]
                kinds["ask"] += 1
            elif text[t - 2] == "hold":  # hold s [t]: the one variable assigned s
                targets = [text[s + 1] for s in range(t - 2) if text[s] == "VAR" and text[s + 3] == text[t - 1]]
                assert targets == [text[t]]
                kinds["hold"] += 1
            else:  # VAR t = s [t]
                assert text[t - 4] == "VAR" and text[t - 2] == "=" and text[t] == text[t - 3]
                kinds["echoed_target"] += 1
        # Chains: every source that is a variable was assigned earlier, and no source is assigned twice.
        assignments = [(text[s + 1], text[s + 3], s) for s in range(len(text) - 3) if text[s] == "VAR"]
        sources = [source for _, source, _ in assignments]
        assert len(sources) == len(set(sources))
        first_assigned = {target: s for target, _, s in reversed(assignments)}
        for _, source, s in assignments:
            if source.startswith("x"):
                assert first_assigned[source] < s
    assert min(kinds.values()) >= 5, kinds


@pytest.mark.parametrize("ask_every_color", [False, True])
def test_local_blocks_are_recoverable(ask_every_color: bool) -> None:
    """Every supervised token of a local block follows from its own paragraph: colour counts and periodic items."""
    kinds = {"count": 0, "next": 0, "continued": 0}
    for seed in range(4):
        text, supervised = dense_words(seed, 2039, local_rate=0.05, ask_every_color=ask_every_color)
        asked_by_paragraph: dict[int, list[str]] = {}
        for t in supervised:
            if text[t - 2] == "ask":  # needle queries: test_dense_sequence_supervises_queried_values
                continue
            paragraph = max(s for s in range(t) if text[s] == "##")
            if text[t - 1] == "?" and text[t - 2] == "paragraph":  # ... the color c appear in the last paragraph ? [n]
                color = text[t - 7]
                assert text[t - 8] == "color"
                assert int(text[t]) == sum(text[s] == color for s in range(paragraph, t - 8)) >= 1
                asked_by_paragraph.setdefault(paragraph, []).append(color)
                kinds["count"] += 1
            elif text[t - 1] == "?":  # ... the next 1 items of the sequence ? [item]
                start = max(s for s in range(paragraph, t) if text[s : s + 2] == ["sequence", ":"]) + 2
                end = text.index(".", start)
                items = text[start:end]
                period = next(p for p in range(2, 5) if all(items[i] == items[i - p] for i in range(p, len(items))))
                assert text[t] == items[len(items) - period]
                kinds["next"] += 1
            else:  # an item of the sequence from its second period on
                start = max(s for s in range(paragraph, t) if text[s : s + 2] == ["sequence", ":"]) + 2
                items = text[start:t]
                assert any(len(items) >= p and text[t] == items[-p] for p in range(2, 5))
                kinds["continued"] += 1
        colors_in_questions = [text[t - 7] for t in supervised if text[t - 2] == "paragraph"]
        assert len(colors_in_questions) == len(set(colors_in_questions))
        for paragraph, asked in asked_by_paragraph.items():  # one question, or one per colour of the block
            end = text.index("question", paragraph)
            shown = {text[s + 3] for s in range(paragraph, end) if text[s : s + 3] == ["there", "is", "a"]}
            assert set(asked) == shown if ask_every_color else len(asked) == 1 and asked[0] in shown
    assert min(kinds.values()) >= 5, kinds


def test_zero_local_rate_keeps_the_default_stream() -> None:
    """``local_rate=0`` draws nothing extra: the runs before local blocks keep the data stream they were trained on."""
    ids = build_tokenizer().get_vocab()
    plain = dense_needle_sequence(SampleRandom(3), 700, ids, echo_rate=1.0, chain_rate=0.05)
    zero = dense_needle_sequence(SampleRandom(3), 700, ids, echo_rate=1.0, chain_rate=0.05, local_rate=0.0)
    assert plain == zero
