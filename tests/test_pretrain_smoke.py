"""Smoke test of scripts/pretrain_backbone.py: two CPU steps of the tiny preset, then reload the saved result."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pretrain_backbone.py"


@pytest.fixture(scope="module")
def pretrain():
    spec = importlib.util.spec_from_file_location("pretrain_backbone", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up in sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def dense_words(pretrain, seed: int, length: int, **rates) -> tuple[list[str], list[int]]:
    """A dense pretraining sequence as words, and its supervised positions (each labelled with its own token)."""
    ids = pretrain.build_tokenizer().get_vocab()
    words = {index: word for word, index in ids.items()}
    input_ids, labels = pretrain.dense_needle_sequence(pretrain.SampleRandom(seed), length, ids, **rates)
    assert len(input_ids) == len(labels) == length
    supervised = [t for t, label in enumerate(labels) if label != pretrain.IGNORE]
    assert all(labels[t] == input_ids[t] for t in supervised)
    return [words[i] for i in input_ids], supervised


@pytest.fixture()
def one_thread():
    # Two intra-op threads on a two-vCPU VM are often several times slower than one for this tiny model.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_two_cpu_steps_save_a_loadable_backbone(pretrain, tmp_path, one_thread) -> None:
    out = tmp_path / "backbone"
    summary = pretrain.main(
        ["--preset", "tiny", "--max-steps", "2", "--max-len", "256", "--device", "cpu", "--out", str(out),
         "--eval-samples", "1"]
    )
    assert summary["steps"] == 2
    assert summary["tokens"] == 2 * 2048
    assert set(summary["eval"]["accuracy"]) == set(pretrain.TASKS)
    on_disk = json.loads((out / "train_summary.json").read_text())
    assert on_disk["steps"] == 2 and on_disk["preset"] == "tiny"
    assert on_disk["train_seconds"] > 0

    model = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    config = model.config
    assert config.model_type == "qwen3"
    assert pretrain.rope_theta_of(config) == 1e6
    assert config.num_attention_heads == 2 * config.num_key_value_heads
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (256, 4, 128)
    assert model.dtype == torch.bfloat16
    weights = sum(path.stat().st_size for path in out.glob("*.safetensors"))
    assert weights <= 10 * 1024 * 1024

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "question : what is the value of k3 ?"}], tokenize=False, add_generation_prompt=True
    )
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size)
    assert torch.isfinite(logits.float()).all()


def test_small_preset_shapes(pretrain) -> None:
    tokenizer = pretrain.build_tokenizer()
    preset = pretrain.PRESETS["small"]
    config = pretrain.build_config(preset, tokenizer, preset.max_len)
    assert config.num_attention_heads * config.head_dim != config.hidden_size
    assert config.num_attention_heads // config.num_key_value_heads >= 2
    assert pretrain.rope_theta_of(config) == 1e6


def test_length_curriculum(pretrain) -> None:
    args = pretrain.resolve_defaults(pretrain.parse_args(["--out", "unused", "--device", "cpu", "--max-len", "4096"]))
    warm = [pretrain.sequence_length(step, args) for step in range(args.length_warmup_steps)]
    assert set(warm) == {args.warmup_len}
    later = {pretrain.sequence_length(step, args) for step in range(args.length_warmup_steps, args.length_warmup_steps + 400)}
    assert min(later) >= args.min_len and max(later) <= args.max_len and len(later) > 10
    assert all(length % 128 == 0 for length in later)


def test_dense_sequence_supervises_queried_values(pretrain) -> None:
    text, supervised = dense_words(pretrain, 0, 2048, echo_rate=0.0)
    assert len(supervised) > 20
    for t in supervised:
        assert text[t - 2] == "ask" and text[t].startswith("v")
        key, value = text[t - 1], text[t]
        earlier = [s for s in range(t - 2) if text[s] == "remember" and text[s + 1] == key]
        assert earlier and text[earlier[0] + 2] == value


def test_dense_sequence_repeats_supervise_copied_spans(pretrain) -> None:
    text, supervised = dense_words(pretrain, 1, 1024, repeat_rate=0.25)
    copied = [t for t in supervised if text[t - 2] != "ask"]
    assert len(copied) > 20
    joined = " ".join(text)
    for t in copied:
        # The copied token and the one before it occur together earlier in the sequence.
        assert f"{text[t - 1]} {text[t]}" in " ".join(text[: t - 1]), (t, joined[:200])


def test_echoed_needles_and_variable_chains_are_recoverable(pretrain) -> None:
    """Every supervised token of the echo-and-chain recipe follows from earlier tokens by a slow parse."""
    kinds = {"echo": 0, "ask": 0, "hold": 0, "echoed_target": 0}
    for seed in range(4):
        text, supervised = dense_words(pretrain, seed, 1531, echo_rate=1.0, chain_rate=0.1)
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
def test_local_blocks_are_recoverable(pretrain, ask_every_color: bool) -> None:
    """Every supervised token of a local block follows from its own paragraph: colour counts and periodic items."""
    kinds = {"count": 0, "next": 0, "continued": 0}
    for seed in range(4):
        text, supervised = dense_words(pretrain, seed, 2039, local_rate=0.05, ask_every_color=ask_every_color)
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


def test_zero_local_rate_keeps_the_default_stream(pretrain) -> None:
    """``local_rate=0`` draws nothing extra: the runs before local blocks keep the data stream they were trained on."""
    ids = pretrain.build_tokenizer().get_vocab()
    plain = pretrain.dense_needle_sequence(pretrain.SampleRandom(3), 700, ids, echo_rate=1.0, chain_rate=0.05)
    zero = pretrain.dense_needle_sequence(
        pretrain.SampleRandom(3), 700, ids, echo_rate=1.0, chain_rate=0.05, local_rate=0.0
    )
    assert plain == zero
