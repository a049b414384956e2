"""RULER as a held-out suite: lm-eval's generators, its scoring rule restated (checked against lm-eval's own
function), row cells carried between machines, and the lm-eval command line on the shipped tiny backbone."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="the lm-eval extra is not installed")
if find_spec("wonderwords") is None:
    pytest.skip("lm-eval's ruler extra (wonderwords) is not installed", allow_module_level=True)

import yaml  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from elastic_attention.assets import TINY_BACKBONE  # noqa: E402
from elastic_attention.errors import InputError  # noqa: E402
from elastic_attention.evaluation import ruler  # noqa: E402
from elastic_attention.evaluation.row_cells import read_cell, write_cell, write_cells  # noqa: E402
from elastic_attention.evaluation.runner import suite_rows  # noqa: E402
from elastic_attention.evaluation.suites import suite_of  # noqa: E402
from elastic_attention.rows import encode_row  # noqa: E402

RULER_DIR = Path(find_spec("lm_eval").submodule_search_locations[0]) / "tasks" / "ruler"
LENGTH = 1024  # RULER's smallest sensible length with the tiny tokenizer (every English word one <unk> token)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_BACKBONE)


@pytest.fixture(scope="module")
def rows(tokenizer):
    return {task: ruler.generate(task, LENGTH, 3, 4, tokenizer) for task in ruler.RULER_TASKS}


class _TagIgnoringLoader(yaml.SafeLoader):
    """Reads lm-eval's task YAML, whose ``!function`` tags name Python callables."""


_TagIgnoringLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _task_yaml(name: str) -> dict:
    for path in RULER_DIR.glob("*.yaml"):
        document = yaml.load(path.read_text(), Loader=_TagIgnoringLoader)
        if document.get("task") == name:
            while "include" in document and "generation_kwargs" not in document:
                included = yaml.load((RULER_DIR / document.pop("include")).read_text(), Loader=_TagIgnoringLoader)
                document = {**included, **document}
            return document
    raise AssertionError(f"no lm-eval YAML for {name}")


def test_the_task_lists_cover_lm_evals_ruler_group_and_new_tokens_match_its_yaml():
    group = yaml.load((RULER_DIR / "ruler.yaml").read_text(), Loader=_TagIgnoringLoader)["task"]
    assert sorted(group) == sorted([*ruler.RULER_TASKS, *ruler.RULER_NOT_RUN])
    for task, tokens in ruler.MAX_NEW_TOKENS.items():
        assert _task_yaml(task)["generation_kwargs"]["max_gen_toks"] == tokens, task
    assert set(ruler.MAX_NEW_TOKENS) == set(ruler.RULER_TASKS)


def test_the_scoring_rule_is_lm_evals():
    from lm_eval.tasks.ruler.common_utils import postprocess_pred, string_match_all

    draw = random.Random(11)
    pieces = ["7211", "Alpha-Beta", "alpha-beta", "\x07", "\n", " ", "uuid 3a4b", "KRBLG", "krblg", "", "x\ty"]
    for _ in range(400):
        references = draw.sample(pieces[:9], draw.randint(1, 4))
        references = [reference for reference in references if reference.strip()] or ["7211"]
        prediction = "".join(draw.choice(pieces) for _ in range(draw.randint(0, 6)))
        expected = string_match_all(postprocess_pred([prediction]), [references])
        assert ruler.string_match_all(ruler.postprocess(prediction), references) == pytest.approx(expected, abs=0)


def test_rows_carry_the_task_answers_prefix_and_new_tokens(rows, tokenizer):
    for task, cell in rows.items():
        assert len(cell) == 4 and {row.task for row in cell} == {task}
        for row in cell:
            outputs = row.metadata["outputs"]
            assert outputs and all(output in row.context for output in outputs), task
            assert row.metadata["max_new_tokens"] == ruler.MAX_NEW_TOKENS[task]
            assert row.assistant_prefix and row.metadata["generator"].startswith("lm-eval ")
            assert ruler.score(", ".join(outputs), row).exact
            assert ruler.score("nothing here", row).accuracy == 0.0
            assert ruler.score(outputs[0], row).accuracy == pytest.approx(1 / len(outputs))
        encoded = encode_row(tokenizer, cell[0])
        rendered = tokenizer.decode(encoded.prompt_ids)
        # the prompt ends inside the assistant turn, with RULER's gen_prefix (words the tiny vocabulary lacks are <unk>)
        assert rendered.rstrip().endswith(tokenizer.decode(tokenizer.encode(cell[0].assistant_prefix,
                                                                            add_special_tokens=False)).rstrip())


def test_rows_are_a_function_of_the_seed(rows, tokenizer):
    again = ruler.generate("niah_single_1", LENGTH, 3, 4, tokenizer)
    other = ruler.generate("niah_single_1", LENGTH, 4, 4, tokenizer)
    assert again == rows["niah_single_1"]
    assert [row.answer for row in other] != [row.answer for row in again]


def test_download_tasks_and_bad_requests_are_refused(tokenizer):
    with pytest.raises(InputError, match="Paul Graham essays"):
        ruler.generate("niah_single_2", LENGTH, 0, 1, tokenizer)
    with pytest.raises(InputError, match="unknown RULER task"):
        ruler.generate("niah_single_9", LENGTH, 0, 1, tokenizer)
    with pytest.raises(InputError, match="500"):
        ruler.generate("niah_single_1", LENGTH, 0, 501, tokenizer)


def test_cells_round_trip_and_are_checked(rows, tokenizer, tmp_path):
    cell = rows["ruler_vt"]
    write_cell(tmp_path, cell, task="ruler_vt", length=LENGTH, seed=3, tokenizer=tokenizer, generator="test")
    assert read_cell(tmp_path, task="ruler_vt", length=LENGTH, seed=3, samples=3, tokenizer=tokenizer) == cell[:3]
    assert read_cell(tmp_path, task="ruler_vt", length=2048, seed=3, samples=3, tokenizer=tokenizer) is None
    with pytest.raises(InputError, match="seed"):
        read_cell(tmp_path, task="ruler_vt", length=LENGTH, seed=4, samples=3, tokenizer=tokenizer)
    with pytest.raises(InputError, match="4 rows, 5 asked"):
        read_cell(tmp_path, task="ruler_vt", length=LENGTH, seed=3, samples=5, tokenizer=tokenizer)
    other = AutoTokenizer.from_pretrained(TINY_BACKBONE)
    other.chat_template = "{{ messages[0]['content'] }}"
    with pytest.raises(InputError, match="another tokenizer"):
        read_cell(tmp_path, task="ruler_vt", length=LENGTH, seed=3, samples=3, tokenizer=other)
    (tmp_path / f"ruler_cwe_{LENGTH}.jsonl").write_text('{"rows": []}\n')
    with pytest.raises(InputError, match="not a row-cell file"):
        read_cell(tmp_path, task="ruler_cwe", length=LENGTH, seed=3, samples=1, tokenizer=tokenizer)


def test_evaluation_reads_carried_cells_instead_of_generating(tokenizer, tmp_path):
    written = write_cells(tokenizer, ["niah_multikey_3", "recent_fact"], [LENGTH + 1], 2, 5, tmp_path)
    assert [path.name for path in written] == [f"niah_multikey_3_{LENGTH + 1}.jsonl", f"recent_fact_{LENGTH + 1}.jsonl"]
    header = json.loads(written[0].read_text().splitlines()[0])["cell"]
    assert header["generator"].startswith("lm-eval ") and header["seed"] == 5 and header["rows"] == 2
    cells = suite_rows(tokenizer, ["niah_multikey_3", "recent_fact"], [LENGTH + 1], 2, seed=5, rows_dir=tmp_path)
    assert cells[("niah_multikey_3", LENGTH + 1)] == ruler.generate("niah_multikey_3", LENGTH + 1, 5, 2, tokenizer)
    generated = suite_of("recent_fact").generate("recent_fact", LENGTH + 1, 5, 2, tokenizer)
    # JSON keeps the metadata's tuples (evidence spans) as lists
    assert cells[("recent_fact", LENGTH + 1)] == [replace(row, metadata=json.loads(json.dumps(row.metadata)))
                                                  for row in generated]


def test_ruler_ranks_no_heads(tokenizer):
    from elastic_attention.evaluation.pipeline import rank_heads

    with pytest.raises(InputError, match="held-out"):
        rank_heads(None, tokenizer, ["niah_single_1"], LENGTH, 1, 0)


@pytest.mark.slow  # about 55 s on a 2-core Xeon: lm-eval's command line generating RULER rows in a subprocess
def test_lm_eval_command_line_runs_ruler_offline(tmp_path):
    import elastic_attention as ea
    from elastic_attention.evaluation.pipeline import load_backbone

    model, _ = load_backbone(TINY_BACKBONE, "cpu")
    ea.attach(model, ea.ElasticConfig(block_size=32, sink_tokens=32, local_tokens=256, xa_stride=8))
    router = ea.save_router(model, tmp_path / "router")
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "elastic_attention.cli", "lm-eval", "--model", "elastic-attention",
               "--model_args", f"pretrained={TINY_BACKBONE},router={router}", "--device", "cpu",
               "--tasks", "niah_single_1", "--metadata", json.dumps({"max_seq_lengths": [LENGTH]}),
               "--apply_chat_template", "--limit", "2", "--batch_size", "2"]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "niah_single_1" in result.stdout and str(LENGTH) in result.stdout
    assert "Error loading punkt" not in result.stderr  # nltk's downloader was not called
