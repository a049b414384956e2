"""Tests of the synthetic task suite: determinism, exact lengths, recoverable answers, depth and locality."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic_attention.errors import InputError
from elastic_attention.evaluation import synthetic
from elastic_attention.evaluation.seeded_random import sample_seed
from elastic_attention.rows import Row
from elastic_attention.evaluation.synthetic import (
    INSTRUCTIONS,
    LENGTH_TOLERANCE_TOKENS,
    ROBUST_TASKS,
    SENSITIVE_TASKS,
    TASKS,
    generate,
    score,
)
from elastic_attention.evaluation.synthetic.tokenizer import CHAT_PROMPT_OVERHEAD_TOKENS
from elastic_attention.evaluation.synthetic.words import (
    COLOR_WORDS,
    KEY_TOKENS,
    MARKER_WORDS,
    NUMBER_TOKENS,
    VALUE_TOKENS,
    VARIABLE_TOKENS,
    filler_words,
    vocabulary,
)

LENGTHS = (512, 2000, 8192)
SEEDS = (0, 1, 2)
TAIL_TOKENS = 300
BOUNDARY_TOKENS = 100


def rendered_tokens(row: Row) -> list[str]:
    """The rendered chat prompt as words, without the tokenizer: ``<bos> <user> prompt <assistant>``."""
    return ["<bos>", "<user>", *row.prompt.split(), "<assistant>"]


# ------------------------------------------------------------------------------------------------------------------
# An independent parser: recovers the answer from the text alone (not from metadata).
# ------------------------------------------------------------------------------------------------------------------


def parse_answer(task: str, context: str, question: str) -> str:
    """Answer a row from its context and question with regular expressions and plain Python."""
    text = " ".join(context.split())
    if task in ("needle_single", "needle_multikey"):
        key = re.search(r"value of (k\d+) \?$", question).group(1)
        values = re.findall(rf"remember {key} (v\d+) \.", text)
        assert len(values) == 1, values
        return values[0]
    if task == "needle_multivalue":
        key = re.search(r"values of (k\d+) in order", question).group(1)
        return " ".join(re.findall(rf"remember {key} (v\d+) \.", text))
    if task == "variable_tracking":
        value = re.search(r"hold the value (v\d+) \?$", question).group(1)
        holders: list[str] = []
        known = {value}
        for target, source in re.findall(r"VAR (x\d+) = (\S+) \.", text):
            if source in known:
                holders.append(target)
                known.add(target)
        return " ".join(holders)
    if task == "local_recall":
        key = re.search(r"give for (k\d+) \?$", question).group(1)
        values = re.findall(rf"note {key} (v\d+) \.", text)
        assert len(values) == 1, values
        return values[0]
    if task == "local_pattern":
        count = int(re.search(r"next (\d+) items", question).group(1))
        items = re.search(r"sequence : ((?:v\d+ )+)\.", text).group(1).split()
        period = next(p for p in range(1, len(items)) if all(items[i] == items[i - p] for i in range(p, len(items))))
        return " ".join(items[(len(items) + j) % period] for j in range(count))
    if task == "local_count":
        color = re.search(r"the color (\w+) appear", question).group(1)
        last_paragraph = text.split("##")[-1].split()
        return str(last_paragraph.count(color))
    raise AssertionError(task)


def tail(context: str, tokens: int = TAIL_TOKENS) -> str:
    return " ".join(context.split()[-tokens:])


def head(context: str, tokens: int = TAIL_TOKENS) -> str:
    return " ".join(context.split()[:-tokens])


@pytest.fixture(scope="module")
def rows() -> dict[tuple[str, int, int], Row]:
    return {(task, length, seed): generate(task, length, seed, 1)[0] for task in TASKS for length in LENGTHS for seed in SEEDS}


# ------------------------------------------------------------------------------------------------------------------
# Registry and determinism
# ------------------------------------------------------------------------------------------------------------------


def test_registry_partitions_tasks() -> None:
    assert set(SENSITIVE_TASKS) | set(ROBUST_TASKS) == set(TASKS)
    assert not set(SENSITIVE_TASKS) & set(ROBUST_TASKS)
    assert set(INSTRUCTIONS) == set(TASKS)
    assert len(set(INSTRUCTIONS.values())) == len(TASKS)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_same_seed_same_rows_and_different_seeds_differ(task: str) -> None:
    first = generate(task, 1024, 7, 3)
    assert first == generate(task, 1024, 7, 3)
    assert len({row.context for row in first}) == 3  # samples of one call differ
    other = generate(task, 1024, 8, 3)
    assert all(a.context != b.context for a, b in zip(first, other, strict=True))
    assert all(row.task == task for row in first)


def test_rows_are_identical_in_another_process() -> None:
    script = (
        "import json; from elastic_attention.evaluation.synthetic import generate, TASKS; "
        "print(json.dumps([[r.prompt, r.answer] for t in sorted(TASKS) for r in generate(t, 700, 3, 2)]))"
    )
    src = str(Path(synthetic.__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": src, "PYTHONHASHSEED": "12345"}
    output = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    here = [[row.prompt, row.answer] for task in sorted(TASKS) for row in generate(task, 700, 3, 2)]
    assert json.loads(output.stdout) == here


def test_sample_seed_is_stable() -> None:
    # SHA-256 based: a fixed value, independent of PYTHONHASHSEED and the Python version.
    assert sample_seed("needle_single", 512, 0, 0) == int.from_bytes(
        __import__("hashlib").sha256(b"needle_single|512|0|0").digest()[:8], "big"
    )


# ------------------------------------------------------------------------------------------------------------------
# Lengths and prompt layout
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("length", [256, 512, 777, 2000, 4099, 8192])
def test_rendered_prompt_hits_length_exactly(task: str, length: int) -> None:
    for row in generate(task, length, 11, 2):
        assert abs(len(rendered_tokens(row)) - length) <= LENGTH_TOLERANCE_TOKENS
        assert row.metadata["length"] == length
        assert row.metadata["context_tokens"] == len(row.context.split())
        assert CHAT_PROMPT_OVERHEAD_TOKENS + len(row.instruction.split()) + len(row.context.split()) + len(
            row.question.split()
        ) == length


def test_long_prompt_hits_length() -> None:
    row = generate("needle_single", 65536, 0, 1)[0]
    assert len(rendered_tokens(row)) == 65536


def test_instruction_leads_and_question_ends(rows: dict) -> None:
    for row in rows.values():
        words = rendered_tokens(row)
        instruction, question = row.instruction.split(), row.question.split()
        assert words[2 : 2 + len(instruction)] == instruction
        assert 2 + len(instruction) <= BOUNDARY_TOKENS
        assert words[-1 - len(question) : -1] == question
        assert len(question) + 1 <= BOUNDARY_TOKENS
        assert row.instruction == INSTRUCTIONS[row.task]


def test_question_formats_differ_per_task() -> None:
    stems = {task: " ".join(generate(task, 512, 0, 1)[0].question.split()[:4]) for task in TASKS}
    assert len(set(stems.values())) == len(TASKS)


def test_too_short_length_raises() -> None:
    with pytest.raises(InputError, match="length"):
        generate("local_count", 40, 0, 1)
    with pytest.raises(InputError, match="task"):
        generate("no_such_task", 512, 0, 1)
    with pytest.raises(InputError, match="depth"):
        generate("needle_single", 512, 0, 1, depth=1.5)


# ------------------------------------------------------------------------------------------------------------------
# Answers
# ------------------------------------------------------------------------------------------------------------------


def test_parser_recovers_every_answer(rows: dict) -> None:
    for (task, _, _), row in rows.items():
        assert parse_answer(task, row.context, row.question) == row.answer, (task, row.metadata)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=st.sampled_from(sorted(TASKS)), length=st.integers(200, 3000), seed=st.integers(-(10**9), 10**9))
def test_any_length_is_exact_and_answerable(task: str, length: int, seed: int) -> None:
    row = generate(task, length, seed, 1)[0]
    assert len(rendered_tokens(row)) == length
    assert parse_answer(task, row.context, row.question) == row.answer


def test_answers_are_single_tokens_of_the_expected_kind(rows: dict) -> None:
    kinds = {
        "needle_single": VALUE_TOKENS,
        "needle_multikey": VALUE_TOKENS,
        "needle_multivalue": VALUE_TOKENS,
        "variable_tracking": VARIABLE_TOKENS,
        "local_recall": VALUE_TOKENS,
        "local_pattern": VALUE_TOKENS,
        "local_count": NUMBER_TOKENS,
    }
    for (task, _, _), row in rows.items():
        assert all(word in kinds[task] for word in row.answer.split())


# ------------------------------------------------------------------------------------------------------------------
# Locality: robust answers live in the tail; sensitive evidence anywhere
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ROBUST_TASKS)
def test_robust_answers_come_from_the_last_300_tokens(task: str, rows: dict) -> None:
    for length in LENGTHS:
        for seed in SEEDS:
            row = rows[(task, length, seed)]
            assert parse_answer(task, tail(row.context), row.question) == row.answer
            far = set(head(row.context).split())
            if task == "local_recall":
                assert row.metadata["key"] not in far
            if task == "local_pattern":
                assert "sequence" not in far
            if task == "local_count":
                assert not far & set(COLOR_WORDS)
            assert row.metadata["final_paragraph_tokens"] <= synthetic.FINAL_PARAGRAPH_MAX_TOKENS


@pytest.mark.parametrize("task", SENSITIVE_TASKS)
def test_sensitive_evidence_sits_at_varied_depths(task: str) -> None:
    rows = generate(task, 2000, 5, 24)
    first_depths = [row.metadata["depths"][0] for row in rows]
    assert min(first_depths) < 0.25 and max(first_depths) > 0.5
    outside_tail = 0
    for row in rows:
        total = row.metadata["context_tokens"]
        outside_tail += any(offset < total - TAIL_TOKENS for offset in row.metadata["evidence_offsets"])
        # The metadata offsets point at the evidence in the text.
        words = row.context.split()
        for offset in row.metadata["evidence_offsets"]:
            assert words[offset] in MARKER_WORDS
    assert outside_tail >= 18  # most samples need evidence the last 300 tokens do not hold


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_depth_option_places_the_needle(depth: float) -> None:
    for row in generate("needle_single", 4096, 3, 4, depth=depth):
        assert abs(row.metadata["depths"][0] - depth) < 0.05
        assert parse_answer("needle_single", row.context, row.question) == row.answer


def test_multivalue_depths_option_orders_values() -> None:
    row = generate("needle_multivalue", 2048, 0, 1, depths=[0.9, 0.1, 0.5, 0.3], num_values=4)[0]
    assert [round(d, 1) for d in row.metadata["depths"]] == [0.1, 0.3, 0.5, 0.9]


def test_variable_chains_span_the_context() -> None:
    row = generate("variable_tracking", 8192, 1, 1, num_chains=3, num_hops=5)[0]
    assert len(row.answer.split()) == 5
    assert parse_answer("variable_tracking", row.context, row.question) == row.answer
    assert len(re.findall(r"VAR x\d+ =", row.context)) == 15


def test_filler_has_paragraphs_and_no_task_words() -> None:
    row = generate("needle_single", 4096, 0, 1)[0]
    assert row.context.count("##") >= 4048 // 160
    reserved = set(MARKER_WORDS) | set(COLOR_WORDS) | set(KEY_TOKENS) | set(VALUE_TOKENS) | set(VARIABLE_TOKENS)
    assert not set(filler_words()) & reserved
    assert not set(filler_words()) & set(NUMBER_TOKENS)


def test_vocabulary_stays_small() -> None:
    words = vocabulary()
    assert len(words) == len(set(words)) <= 1024


# ------------------------------------------------------------------------------------------------------------------
# Scoring
# ------------------------------------------------------------------------------------------------------------------


def test_score_is_exact_match_after_whitespace_normalization() -> None:
    row = generate("needle_multivalue", 512, 0, 1)[0]
    assert score(row.answer, row)
    assert score("  " + row.answer.replace(" ", "\n  ") + " \t", row)
    assert not score(row.answer.upper(), row)
    assert not score(" ".join(reversed(row.answer.split())), row)
    assert not score(row.answer.split()[0], row)
    single = generate("needle_single", 512, 0, 1)[0]
    assert not score(single.answer + "0", single)
    assert not score("", single)
