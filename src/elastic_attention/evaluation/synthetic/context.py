"""Context assembly of the synthetic suite: filler around evidence at chosen depths (sensitive tasks), or far
filler with distractors and a last paragraph holding the evidence (robust tasks), rendered to exactly the
requested prompt length; and the row every generator returns."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from elastic_attention.errors import InputError
from elastic_attention.evaluation.seeded_random import SampleRandom
from elastic_attention.rows import Row
from elastic_attention.evaluation.synthetic.filler import (
    SENTENCE_MIN_TOKENS,
    TOPICS,
    filler_paragraphs,
    filler_sentences,
)
from elastic_attention.evaluation.synthetic.tokenizer import CHAT_PROMPT_OVERHEAD_TOKENS
from elastic_attention.evaluation.synthetic.words import NEEDLE_MARKER, PARAGRAPH_MARKER

#: A rendered prompt has exactly the requested number of tokens.
LENGTH_TOLERANCE_TOKENS = 0
#: Upper bound on the last paragraph of a robust task, in tokens (its evidence is always in the last 300 tokens).
FINAL_PARAGRAPH_MAX_TOKENS = 240
_FINAL_PARAGRAPH_MIN_TOKENS = 64

#: Fixed task-specific instruction sentences (the first prompt tokens).
INSTRUCTIONS: dict[str, str] = {
    "needle_single": "instruction : a single secret key is hidden somewhere in the long text . "
    "find it and report its value .",
    "needle_multikey": "instruction : many secret keys are hidden in the long text . "
    "report the value of the one key that is asked .",
    "needle_multivalue": "instruction : one secret key is hidden several times with different values . "
    "report every value of it in order .",
    "variable_tracking": "instruction : variables are assigned along the long text . "
    "follow each chain and list the variables that hold the asked value .",
    "local_recall": "instruction : only the last paragraph matters . read its note and report the value it gives .",
    "local_pattern": "instruction : the last paragraph shows a repeating sequence . "
    "continue the sequence with its next items .",
    "local_count": "instruction : the last paragraph mentions some colors . "
    "count how often the asked color appears .",
}


def prompt_tokens(instruction: str, question: str) -> int:
    """Tokens a rendered prompt spends outside the context (chat markers, instruction, question)."""
    return CHAT_PROMPT_OVERHEAD_TOKENS + len(instruction.split()) + len(question.split())


# A segment is (words, tag): tag is the index of an evidence insert, or None for filler.
_Segment = tuple[list[str], "int | None"]


def _tagged(paragraphs: list[list[list[str]]]) -> list[list[_Segment]]:
    return [[(words, None) for words in paragraph] for paragraph in paragraphs]


def _insert_at_depths(
    paragraphs: list[list[_Segment]], inserts: Sequence[tuple[float, list[str]]], first_tag: int = 0
) -> None:
    """Insert evidence segments at the sentence boundaries nearest to their depths (in place).

    Boundaries are the gaps after a paragraph's ``##`` or after any of its sentences. Inserts that land on the same
    boundary keep their order in ``inserts``; depths given in increasing order keep their order in the text.
    """
    positions: list[int] = []
    places: list[tuple[int, int]] = []
    offset = 0
    for p, paragraph in enumerate(paragraphs):
        for g, (words, _) in enumerate(paragraph):
            offset += len(words)
            positions.append(offset)
            places.append((p, g + 1))
    total = offset
    chosen: dict[tuple[int, int], list[_Segment]] = {}
    for k, (depth, words) in enumerate(inserts):
        target = depth * total
        i = bisect.bisect_left(positions, target)
        if i == len(positions) or (i > 0 and target - positions[i - 1] <= positions[i] - target):
            i -= 1
        chosen.setdefault(places[i], []).append((words, first_tag + k))
    for (p, g), segments in sorted(chosen.items(), reverse=True):
        paragraphs[p][g:g] = segments


def _render(paragraphs: list[list[_Segment]], num_tags: int) -> tuple[str, int, list[int]]:
    """Context text, its token count and the token offset of each tagged segment."""
    offsets = [-1] * num_tags
    lines = []
    offset = 0
    for paragraph in paragraphs:
        words_of_line = []
        for words, tag in paragraph:
            if tag is not None:
                offsets[tag] = offset
            offset += len(words)
            words_of_line.extend(words)
        lines.append(" ".join(words_of_line))
    return "\n".join(lines), offset, offsets


def needle_depth(rng: SampleRandom, depth: float | None) -> float:
    if depth is None:
        return rng.fraction()
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0.0 <= float(depth) <= 1.0:
        raise InputError(f"`depth` must be a number in [0, 1] or None, got {depth!r}")
    return float(depth)


def _context_budget(task: str, length: int, instruction: str, question: str, minimum: int) -> int:
    if isinstance(length, bool) or not isinstance(length, int):
        raise InputError(f"`length` must be an integer number of tokens, got {length!r}")
    budget = length - prompt_tokens(instruction, question)
    if budget < minimum:
        raise InputError(
            f"`length` must be at least {length - budget + minimum} tokens for task {task!r}, got {length}"
        )
    return budget


def sensitive_context(
    rng: SampleRandom, task: str, length: int, instruction: str, question: str, inserts: list[tuple[float, list[str]]]
) -> tuple[str, dict[str, Any]]:
    """Filler with evidence inserts at their depths; returns the context and its length metadata."""
    evidence_tokens = sum(len(words) for _, words in inserts)
    budget = _context_budget(task, length, instruction, question, evidence_tokens + 1 + SENTENCE_MIN_TOKENS)
    paragraphs = _tagged(filler_paragraphs(rng, budget - evidence_tokens))
    _insert_at_depths(paragraphs, inserts)
    context, total, offsets = _render(paragraphs, len(inserts))
    return context, {"context_tokens": total, "offsets": offsets}


def robust_context(
    rng: SampleRandom,
    task: str,
    length: int,
    instruction: str,
    question: str,
    local_segments: list[list[str]],
    distractors: list[list[str]],
) -> tuple[str, dict[str, Any]]:
    """Far filler with distractor needles, then a last paragraph holding ``local_segments`` in order.

    The last paragraph has at most ``FINAL_PARAGRAPH_MAX_TOKENS`` tokens; its filler sentences and the local segments
    are interleaved at random, keeping the local segments' order.
    """
    local_tokens = sum(len(words) for words in local_segments)
    distractor_tokens = sum(len(words) for words in distractors)
    far_minimum = distractor_tokens + 1 + SENTENCE_MIN_TOKENS
    budget = _context_budget(task, length, instruction, question, far_minimum + 1 + local_tokens)
    final_high = min(FINAL_PARAGRAPH_MAX_TOKENS, budget - far_minimum)
    if final_high < 1 + local_tokens:
        raise InputError(f"the local evidence of task {task!r} ({local_tokens} tokens) does not fit its last paragraph")
    filler_high = final_high - 1 - local_tokens
    filler_low = max(SENTENCE_MIN_TOKENS, _FINAL_PARAGRAPH_MIN_TOKENS - 1 - local_tokens)
    if filler_high < SENTENCE_MIN_TOKENS:
        final_filler = 0
    else:
        final_filler = rng.integer(min(filler_low, filler_high), filler_high)
    final_tokens = 1 + local_tokens + final_filler

    paragraphs = _tagged(filler_paragraphs(rng, budget - final_tokens - distractor_tokens))
    _insert_at_depths(paragraphs, [(rng.fraction(), words) for words in distractors], first_tag=len(local_segments))

    sentences = filler_sentences(rng, final_filler, rng.choice(TOPICS))
    gaps = sorted(rng.below(len(sentences) + 1) for _ in local_segments)
    last: list[_Segment] = [([PARAGRAPH_MARKER], None)]
    cursor = 0
    for k, gap in enumerate(gaps):
        last += [(words, None) for words in sentences[cursor:gap]]
        last.append((local_segments[k], k))
        cursor = gap
    last += [(words, None) for words in sentences[cursor:]]
    paragraphs.append(last)

    context, total, offsets = _render(paragraphs, len(local_segments) + len(distractors))
    return context, {
        "context_tokens": total,
        "offsets": offsets[: len(local_segments)],
        "final_paragraph_tokens": final_tokens,
        "distractor_offsets": offsets[len(local_segments) :],
    }


def task_row(
    task: str,
    length: int,
    seed: int,
    instruction: str,
    question: str,
    answer: str,
    context: str,
    layout: dict[str, Any],
    extra: dict[str, Any],
) -> Row:
    offsets = layout.pop("offsets")
    total = layout["context_tokens"]
    metadata = {
        "length": length,
        "seed": seed,
        **layout,
        "evidence_offsets": offsets,
        "depths": [offset / total for offset in offsets],
        **extra,
    }
    return Row(context, question, answer, task, instruction, metadata)


def needles(keys: Sequence[str], values: Sequence[str]) -> list[list[str]]:
    return [[NEEDLE_MARKER, key, value, "."] for key, value in zip(keys, values, strict=True)]


def require_count(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"`{name}` must be an integer in [{low}, {high}], got {value!r}")
