"""Sparsity-robust tasks of the synthetic suite: the evidence sits in the last paragraph (at most 240 tokens), the
far context holds distractor needles of other keys and values."""

from __future__ import annotations

from collections.abc import Sequence

from elastic_attention.evaluation.seeded_random import SampleRandom
from elastic_attention.rows import Row
from elastic_attention.evaluation.synthetic.context import INSTRUCTIONS, needles, require_count, robust_context, task_row
from elastic_attention.evaluation.synthetic.words import (
    COLOR_WORDS,
    KEY_TOKENS,
    NOTE_MARKER,
    NUM_NUMBERS,
    SEQUENCE_MARKER,
    SHARED_NOUNS,
    VALUE_TOKENS,
)


def _distractor_needles(
    rng: SampleRandom, count: int, used_keys: Sequence[str], used_values: Sequence[str]
) -> list[list[str]]:
    require_count("num_distractors", count, 0, 32)
    keys = rng.sample(KEY_TOKENS, count, exclude=used_keys)
    values = rng.sample(VALUE_TOKENS, count, exclude=used_values)
    return needles(keys, values)


def local_recall(length: int, seed: int, *, num_distractors: int = 2) -> Row:
    """A key/value note in the last paragraph, asked at the end; far needles have other keys and values.

    Args:
        length: rendered prompt length in tokens.
        seed: sample seed.
        num_distractors: needles of other keys in the long-range context, 0 to 32.

    Returns:
        A row with the note's value as answer; ``metadata["key"]``.
    """
    rng = SampleRandom(seed)
    key, value = rng.choice(KEY_TOKENS), rng.choice(VALUE_TOKENS)
    distractors = _distractor_needles(rng, num_distractors, [key], [value])
    instruction = INSTRUCTIONS["local_recall"]
    question = f"question : what value does the last note give for {key} ?"
    local = [[NOTE_MARKER, key, value, "."]]
    context, layout = robust_context(rng, "local_recall", length, instruction, question, local, distractors)
    return task_row("local_recall", length, seed, instruction, question, value, context, layout, {"key": key})


def pattern_question(num_items: int) -> str:
    """The question of local_pattern."""
    return f"question : what are the next {num_items} items of the sequence ?"


def count_question(color: str) -> str:
    """The question of local_count."""
    return f"question : how many times does the color {color} appear in the last paragraph ?"


def local_pattern(
    length: int, seed: int, *, num_items: int = 1, period: int | None = None, num_distractors: int = 2
) -> Row:
    """A periodic sequence of value tokens in the last paragraph; the answer continues it.

    The sequence shows two to four full periods or more (at least ``2 * period`` items, so the period is determined)
    and may stop mid-period.

    Args:
        length: rendered prompt length in tokens.
        seed: sample seed.
        num_items: items to continue, 1 to 8.
        period: cycle length, 2 to 4; ``None`` draws it uniformly.
        num_distractors: needles in the long-range context, 0 to 32 (their values are not in the cycle).

    Returns:
        A row whose answer is the next ``num_items`` items (``"v11 v3"``); ``metadata["cycle"]``.
    """
    require_count("num_items", num_items, 1, 8)
    rng = SampleRandom(seed)
    if period is None:
        period = rng.integer(2, 4)
    require_count("period", period, 2, 4)
    cycle = rng.sample(VALUE_TOKENS, period)
    shown = rng.integer(2 * period, 4 * period)
    items = [cycle[i % period] for i in range(shown)]
    answer = " ".join(cycle[(shown + j) % period] for j in range(num_items))
    distractors = _distractor_needles(rng, num_distractors, [], cycle)
    instruction = INSTRUCTIONS["local_pattern"]
    question = pattern_question(num_items)
    local = [[SEQUENCE_MARKER, ":", *items, "."]]
    context, layout = robust_context(rng, "local_pattern", length, instruction, question, local, distractors)
    return task_row("local_pattern", length, seed, instruction, question, answer, context, layout, {"cycle": cycle})


def local_count(
    length: int, seed: int, *, max_count: int = 4, num_other_colors: int = 2, num_distractors: int = 2
) -> Row:
    """Colour sentences ``there is a red cup .`` in the last paragraph; count the asked colour.

    Colour words occur nowhere else in the prompt but in the question.

    Args:
        length: rendered prompt length in tokens.
        seed: sample seed.
        max_count: largest count of a colour, 1 to 12 (counts are uniform in ``[1, max_count]``).
        num_other_colors: other colours in the paragraph, 0 to 3.
        num_distractors: needles in the long-range context, 0 to 32.

    Returns:
        A row whose answer is the count as a number token (``"3"``); ``metadata["color"]``, ``metadata["counts"]``.
    """
    require_count("max_count", max_count, 1, min(12, NUM_NUMBERS - 1))
    require_count("num_other_colors", num_other_colors, 0, 3)
    rng = SampleRandom(seed)
    colors = rng.sample(COLOR_WORDS, 1 + num_other_colors)
    counts = {color: rng.integer(1, max_count) for color in colors}
    local = [["there", "is", "a", color, rng.choice(SHARED_NOUNS), "."] for color in colors for _ in range(counts[color])]
    rng.shuffle(local)
    distractors = _distractor_needles(rng, num_distractors, [], [])
    instruction = INSTRUCTIONS["local_count"]
    question = count_question(colors[0])
    context, layout = robust_context(rng, "local_count", length, instruction, question, local, distractors)
    layout["offsets"] = [offset for offset, words in zip(layout["offsets"], local, strict=True) if words[3] == colors[0]]
    answer = str(counts[colors[0]])
    extra = {"color": colors[0], "counts": counts}
    return task_row("local_count", length, seed, instruction, question, answer, context, layout, extra)
