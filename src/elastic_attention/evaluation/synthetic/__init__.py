"""Synthetic long-context tasks: sparsity-sensitive retrieval and sparsity-robust local tasks.

Every sample is a :class:`Row`. Its prompt is ``instruction`` (a fixed task-specific sentence), the long
``context``, then ``question`` (a task-specific format), so a router that pools only the first and last 100 prompt
tokens can tell the task apart. Every word is one token of the suite tokenizer
(:mod:`elastic_attention.evaluation.synthetic.words`).

Length contract: ``generate(task, length, ...)`` returns rows whose prompt, rendered with the suite tokenizer's chat
template and generation prompt (``<bos> <user> {prompt} <assistant>``), is **exactly** ``length`` tokens (tolerance
0). The context has ``length - 3 - len(instruction) - len(question)`` tokens, stored as
``metadata["context_tokens"]``.

Tasks:

- Sensitive (the evidence can sit anywhere in the context):

  - ``needle_single``: one needle ``remember k17 v42 .`` in filler; the answer is the key's value (``v42``).
  - ``needle_multikey``: ``num_keys`` (4) needles with distinct keys and values; one key is asked.
  - ``needle_multivalue``: one key appears ``num_values`` (2) times with distinct values, plus ``num_distractors``
    (2) needles of other keys; the answer is every value of the key in order of appearance (``v3 v91``).
  - ``variable_tracking``: ``num_chains`` (2) chains of ``num_hops`` (2) assignments ``VAR x3 = v17 .``,
    ``VAR x8 = x3 .``, ... spread over the context in chain order; the question names the value of one chain and
    the answer is every variable of that chain in order of assignment (``x3 x8``). Listing in order turns
    the multi-hop question into one single-hop lookup per generated token.

- Robust (the evidence sits in the last paragraph, at most :data:`FINAL_PARAGRAPH_MAX_TOKENS` (240) tokens, so it is
  always inside the last 300 context tokens):

  - ``local_recall``: the last paragraph holds ``note k17 v42 .``; the answer is ``v42``.
  - ``local_pattern``: the last paragraph holds ``sequence : v3 v7 v11 v3 v7 .`` (period 2-4, shown for two to four
    periods); the answer is the next ``num_items`` (1) items (``v11``).
  - ``local_count``: the last paragraph holds ``there is a red cup .`` sentences for one to three colours (each 1 to
    ``max_count`` (4) times); the answer is how many times the asked colour appears (``"3"``).

  The long-range part of a robust context holds ``num_distractors`` (2) needles ``remember kX vY .`` of other keys
  and values but never the asked key, a ``sequence`` or a colour word, so it neither contradicts nor duplicates the
  local answer.

Filler is not uniform noise: paragraphs (``##`` then 48-160 tokens) each draw most nouns from one topic, and their
sentences follow a small grammar (determiner, adjective, noun, verb, object, prepositional phrases, adverb).

Needle depth: a needle is placed at the sentence boundary nearest to ``depth`` times the filler length; ``depth`` is
an option (a float in [0, 1]) or drawn uniformly. The realized depths (token offset / context tokens) are in
``metadata["depths"]`` and the token offsets in ``metadata["evidence_offsets"]``.

Determinism: sample ``i`` of ``generate(task, length, seed, n)`` is drawn from a Mersenne Twister seeded with the
first 8 bytes of SHA-256 of ``"{task}|{length}|{seed}|{i}"``, and only ``getrandbits`` is used on it, so rows are
identical across processes, platforms and Python versions.

Modules: ``words`` (the inventory), ``tokenizer`` (the word-level tokenizer and rows rendered as text), ``filler`` (the
grammar), ``context`` (assembly and instructions), ``sensitive`` and ``robust`` (the generators); this package holds
the registry, generation and scoring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elastic_attention.errors import InputError
from elastic_attention.evaluation.seeded_random import sample_seed
from elastic_attention.rows import Row
from elastic_attention.evaluation.synthetic.context import (
    FINAL_PARAGRAPH_MAX_TOKENS,
    INSTRUCTIONS,
    LENGTH_TOLERANCE_TOKENS,
)
from elastic_attention.evaluation.synthetic.robust import (
    count_question,
    local_count,
    local_pattern,
    local_recall,
    pattern_question,
)
from elastic_attention.evaluation.synthetic.sensitive import (
    needle_multikey,
    needle_multivalue,
    needle_single,
    variable_tracking,
)

__all__ = [
    "FINAL_PARAGRAPH_MAX_TOKENS",
    "INSTRUCTIONS",
    "LENGTH_TOLERANCE_TOKENS",
    "ROBUST_TASKS",
    "SENSITIVE_TASKS",
    "TASKS",
    "count_question",
    "generate",
    "local_count",
    "local_pattern",
    "local_recall",
    "needle_multikey",
    "needle_multivalue",
    "needle_single",
    "normalize_answer",
    "pattern_question",
    "score",
    "variable_tracking",
]

#: Task name -> generator ``(length, seed, **options) -> Row``.
TASKS: dict[str, Callable[..., Row]] = {
    "needle_single": needle_single,
    "needle_multikey": needle_multikey,
    "needle_multivalue": needle_multivalue,
    "variable_tracking": variable_tracking,
    "local_recall": local_recall,
    "local_pattern": local_pattern,
    "local_count": local_count,
}
SENSITIVE_TASKS: tuple[str, ...] = ("needle_single", "needle_multikey", "needle_multivalue", "variable_tracking")
ROBUST_TASKS: tuple[str, ...] = ("local_recall", "local_pattern", "local_count")


def generate(task: str, length: int, seed: int, n: int, **options: Any) -> list[Row]:
    """Generate ``n`` rows of one task whose rendered prompts are exactly ``length`` tokens.

    Args:
        task: a key of :data:`TASKS`.
        length: rendered prompt length in tokens (chat template with generation prompt included); tasks accept
            lengths from about 100 tokens (robust tasks need the far context to hold their distractors) upwards.
        seed: any integer; sample ``i`` uses :func:`sample_seed` ``(task, length, seed, i)``.
        n: number of rows, at least 0.
        **options: task options (``depth``, ``num_keys``, ``num_values``, ``num_chains``, ... see each generator).

    Returns:
        ``n`` rows; the same arguments give identical rows in any process.

    Raises:
        InputError: unknown task, bad ``n``, a length too short for the task, or a bad option value.
    """
    if task not in TASKS:
        raise InputError(f"`task` must be one of {sorted(TASKS)}, got {task!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"`n` must be a non-negative integer, got {n!r}")
    generator = TASKS[task]
    return [generator(length, sample_seed(task, length, seed, i), **options) for i in range(n)]


def normalize_answer(text: str) -> str:
    """Collapse every run of whitespace to one space and strip the ends."""
    return " ".join(text.split())


def score(prediction: str, row: Row) -> bool:
    """Exact match of a prediction against the row's answer, after whitespace normalization only.

    Args:
        prediction: the decoded model answer (special tokens already removed).
        row: the row it answers.

    Returns:
        True when the normalized strings are equal.
    """
    return normalize_answer(prediction) == normalize_answer(row.answer)
