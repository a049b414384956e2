"""Scores of generated answers: the score type and the text helpers the suites score with."""

from __future__ import annotations

import re
from dataclasses import dataclass

_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Score:
    """The score of one prediction.

    Attributes:
        accuracy: in [0, 1]; the cell's accuracy is its mean (edit similarity for code completion, else 0 or 1).
        exact: whether the prediction matched the answer exactly (after the task's normalization).
    """

    accuracy: float
    exact: bool


def first_integer(text: str) -> str | None:
    """The first integer written in ``text`` (``"The key is 0421."`` -> ``"0421"``), or None."""
    match = _INTEGER.search(text)
    return match.group(0) if match else None


def first_answer_line(text: str) -> str:
    """The first non-empty line of ``text`` that is not a code-fence line (```), stripped; ``""`` if none."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("```"):
            return stripped
    return ""


def edit_similarity(prediction: str, reference: str) -> float:
    """1 - Levenshtein distance / length of the longer string, in [0, 1] (1.0 for two empty strings)."""
    if not prediction and not reference:
        return 1.0
    previous = list(range(len(reference) + 1))
    for i, a in enumerate(prediction, 1):
        current = [i]
        for j, b in enumerate(reference, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != b)))
        previous = current
    return 1.0 - previous[-1] / max(len(prediction), len(reference))
