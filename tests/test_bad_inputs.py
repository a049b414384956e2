"""Bad input, table-driven: each case names the error class and a fragment of its message.

The CLI cases check the user-facing contract: exit status 2 and one line on stderr naming the problem (no
traceback), before anything is loaded or written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

import elastic_attention as ea
from elastic_attention import ConfigError, ElasticConfig, InputError, UnsupportedModelError
from elastic_attention.cli import main as cli_main
from elastic_attention.patterns import SequenceLayout
from elastic_attention.training import TrainConfig
from elastic_attention.training.pretrain_config import PretrainConfig
from elastic_attention.training.data import load_rows

TESTS = str(Path(__file__).resolve().parent)
TINY_BACKBONE = Path(__file__).resolve().parents[1] / "src" / "elastic_attention" / "assets" / "backbone_tiny"
TINY_SUITE = str(Path(__file__).resolve().parents[1] / "configs" / "tiny_suite.yaml")
BACKBONE_TINY = str(Path(__file__).resolve().parents[1] / "configs" / "backbone_tiny.yaml")
SMALL = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)


def attached():
    return ea.attach(tiny_model("llama"), SMALL, backend="reference")


def generate(model, ids, mask):
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0)


def right_padded_generate():
    ids = torch.randint(3, 90, (2, 20))
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0
    generate(attached(), ids, mask)


def forward(position_ids):
    model = attached()
    with torch.no_grad():
        model(torch.randint(3, 90, position_ids.shape), position_ids=position_ids, use_cache=False)


def train_config(*overrides):
    return TrainConfig.from_yaml(TINY_SUITE, list(overrides))


def pretrain_config(*overrides):
    return PretrainConfig.from_yaml(BACKBONE_TINY, list(overrides))


def rows_file(tmp_path, text):
    path = tmp_path / "rows.jsonl"
    path.write_text(text)
    return load_rows(path)


GOOD_ROW = '{"context": "c", "question": "q", "answer": "a", "task": "t"}\n'

CASES = {
    "sink not a multiple of the block": (lambda tmp: ElasticConfig(sink_tokens=100), ConfigError,
                                         "multiple of `block_size` (128), got 100"),
    "unknown configuration": (lambda tmp: ElasticConfig(configuration="fa"), ConfigError, "`configuration`"),
    "unknown elastic key": (lambda tmp: train_config("elastic.sinks=3"), ConfigError, "unknown `elastic` keys"),
    "steps not a number": (lambda tmp: train_config("steps=abc"), ConfigError, "`steps` must be an integer"),
    "negative learning rate": (lambda tmp: train_config("router_lr=-1"), ConfigError, "`router_lr` must be positive"),
    "no rows": (lambda tmp: train_config("data.rows=0"), ConfigError, "`data.rows` must be at least 1"),
    "pretraining sequences too short": (lambda tmp: pretrain_config("data.max_len=100"), ConfigError,
                                        "`data.max_len` must be at least 192 tokens (suite rows need room), got 100"),
    "pretraining min_len above max_len": (lambda tmp: pretrain_config("data.max_len=200"), ConfigError,
                                          "`data.min_len` must be in [1, data.max_len = 200], got 256; lower it"),
    "pretraining without a budget": (lambda tmp: pretrain_config("max_steps=null", "max_seconds=null"), ConfigError,
                                     "set `max_steps` or `max_seconds`"),
    "pretraining heads not in groups": (lambda tmp: pretrain_config("model.num_kv_heads=3"), ConfigError,
                                        "`model.num_heads` (4) must be a multiple of `model.num_kv_heads` (3)"),
    "pretraining rate above 1": (lambda tmp: pretrain_config("data.echo_rate=1.5"), ConfigError,
                                 "`data.echo_rate` must be in [0, 1], got 1.5"),
    "pretraining count questions typo": (lambda tmp: pretrain_config("data.count_questions=all"), ConfigError,
                                         "`data.count_questions` must be 'one' or 'every'"),
    "pretraining shape not a section": (lambda tmp: pretrain_config("model=tiny"), ConfigError,
                                        "`model` must be a section of keys, got 'tiny'"),
    "a number YAML reads as text": (lambda tmp: pretrain_config("lr=1e-3"), ConfigError,
                                    "`lr` must be a number, got '1e-3' (YAML reads a number without a dot"),
    "a key inside a value": (lambda tmp: pretrain_config("seed.x=1"), ConfigError,
                             "`seed` is a value, not a section of keys"),
    "a router config given to pretrain": (lambda tmp: PretrainConfig.from_yaml(TINY_SUITE), ConfigError,
                                          "run it with `elastic-attention train`"),
    "a pretraining config given to train": (lambda tmp: TrainConfig.from_yaml(BACKBONE_TINY), ConfigError,
                                            "run it with `elastic-attention pretrain`"),
    "attached twice": (lambda tmp: ea.attach(attached(), SMALL), UnsupportedModelError, "already attached"),
    "unknown cache kind": (lambda tmp: ea.attach(tiny_model("llama"), SMALL, cache="big"), ConfigError,
                           "cache must be 'bounded' or 'full'"),
    "negative cache length": (lambda tmp: ea.ElasticCache(attached(), max_length=-3), InputError,
                              "`max_length` must be a positive"),
    "positions that skip": (lambda tmp: forward(torch.arange(12)[None] * 2), InputError,
                            "position 2 at column 1"),
    "positions all zero": (lambda tmp: forward(torch.zeros(1, 12, dtype=torch.long)), InputError,
                           "one-token sequences"),
    "positions that start late": (lambda tmp: forward(torch.arange(12)[None] + 5), InputError,
                                  "position 5 at column 0"),
    "a 4D mask": (lambda tmp: SequenceLayout.from_padding_mask(torch.ones(1, 1, 4, 4)), InputError,
                  "2D padding mask"),
    "an empty row": (lambda tmp: SequenceLayout.from_padding_mask(torch.tensor([[1, 1], [0, 0]])), InputError,
                     "rows [1] have no tokens"),
    "right padding at generate": (lambda tmp: right_padded_generate(), InputError, "Pad on the left"),
    "a row file line that is not JSON": (lambda tmp: rows_file(tmp, GOOD_ROW + "{oops\n"), InputError,
                                         "rows.jsonl, line 2: not JSON"),
    "a null context": (lambda tmp: rows_file(tmp, '{"context": null, "question": "q", "answer": "a", "task": "t"}'),
                       InputError, "line 1: `context` must be a string, got None"),
    "a missing row file": (lambda tmp: load_rows(tmp / "none.jsonl"), InputError, "does not exist"),
    "a truncated checkpoint": (lambda tmp: truncated_checkpoint(tmp), ConfigError,
                               "step-000003 cannot be read"),
}


def truncated_checkpoint(tmp_path):
    from elastic_attention.training.checkpoint import load_latest, save_checkpoint

    folder = save_checkpoint(tmp_path / "checkpoints", 3, {"x": torch.ones(4)}, {"history": []})
    state = folder / "state.safetensors"
    state.write_bytes(state.read_bytes()[:-8])
    load_latest(tmp_path / "checkpoints")


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_refused_with_a_named_error(name, tmp_path):
    call, error, fragment = CASES[name]
    with pytest.raises(error) as raised:
        call(tmp_path)
    assert fragment in str(raised.value)


CLI_CASES = {
    "zero samples": (["eval", "--model", "x", "--samples", "0"], "--samples: expected a positive integer, got '0'"),
    "zero batch size": (["eval", "--model", "x", "--batch-size", "0"], "--batch-size: expected a positive integer"),
    "a mode typo": (["eval", "--model", "x", "--modes", "Full"], "unknown evaluation modes ['Full']"),
    "no tasks": (["eval", "--model", "x", "--tasks", ","], "no tasks given"),
    "a bad length": (["eval", "--model", "x", "--lengths", "4kk"], "cannot read length '4kk'"),
    "elastic without routers": (["eval", "--model", "x", "--modes", "elastic"], "pass --router"),
    "a missing model": (["eval", "--model", "no/such/model"], "no such folder; give a local Hugging Face model"),
    "a hub name to try": (["try", "--model", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "--router", "r"],
                          "`elastic-attention models fetch NAME` writes one to artifacts/NAME (NAME: "
                          "qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct)"),
    "a hub name to generate": (["generate", "--model", "gpt2", "--prompt", "hi"], "--model gpt2: no such folder"),
    "a folder without a model": (["eval", "--model", TESTS], f"--model {TESTS}: a folder without config.json"),
    "a missing router": (["try", "--model", str(TINY_BACKBONE), "--router", "no/router"],
                         "--router no/router: no such adapter folder"),
    "a bad override": (["train", TINY_SUITE, "steps=abc"], "`steps` must be an integer"),
    "an unknown elastic key": (["train", TINY_SUITE, "--resume", "elastic.sinks=3"],
                               "unknown `elastic` keys ['sinks']"),
    "fetch without a name": (["models", "fetch"], "needs a model name"),
    "a bad pretraining override": (["pretrain", BACKBONE_TINY, "--no-progress", "max_steps=two"],
                                   "`max_steps` must be an integer"),
}


@pytest.mark.parametrize("name", CLI_CASES)
def test_cli_user_errors_are_one_line_and_exit_2(name, capsys):
    arguments, fragment = CLI_CASES[name]
    try:
        status = cli_main(arguments)
    except SystemExit as exit_:  # argparse's own usage errors
        status = exit_.code
    assert status == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert fragment in error[-1] and "Traceback" not in "\n".join(error)


def test_cli_debug_shows_the_traceback():
    with pytest.raises(ConfigError, match="`steps` must be an integer"):
        cli_main(["--debug", "train", TINY_SUITE, "steps=abc"])


def test_eval_refuses_before_writing(tmp_path):
    out = tmp_path / "eval_out"
    out.mkdir()
    (out / "eval.json").write_text(json.dumps({"results": ["kept"]}))
    with pytest.raises(SystemExit):
        cli_main(["eval", "--model", "x", "--modes", "Full", "--out", str(out)])
    assert json.loads((out / "eval.json").read_text()) == {"results": ["kept"]}


def test_a_second_thread_in_the_middle_of_a_forward_gets_a_clear_error():
    """Thread B starts a forward while thread A's is between two layers: A's next layer refuses, naming the cause."""
    import threading

    model = attached()
    ids = torch.randint(3, 90, (1, 24))
    runtime = ea.integration.runtime_of(model)
    layer0 = model.model.layers[0].self_attn
    started, errors = threading.Event(), []

    def pause_after_first_layer(module, args, output):
        if threading.current_thread().name == "A" and not started.is_set():
            started.set()
            other = threading.Thread(target=lambda: model(ids, use_cache=False), name="B")
            other.start()
            other.join()

    handle = layer0.register_forward_hook(pause_after_first_layer)

    def run_a():
        try:
            with torch.no_grad():
                model(ids, use_cache=False)
        except InputError as error:
            errors.append(str(error))

    first = threading.Thread(target=run_a, name="A")
    first.start()
    first.join()
    handle.remove()
    assert errors and "one attached model serves one forward at a time" in errors[0]
    assert runtime.forward_thread is not None
