"""Fitting a row to a length: haystack units around the needles, cut so that the rendered prompt meets the length
contract (between ``length - LENGTH_TOLERANCE_TOKENS`` and ``length`` tokens of the model's chat template).

A family describes a row as a :class:`Draft` (its needles, where each goes, the answer); :func:`fit` takes units
from the row's haystack until the token budget is met, places each needle at its position and measures the
rendered prompt, correcting the budget until the prompt's length is inside the contract.

Needle positions (token offsets in the context's filler):

- ``far``: between 2% of the filler and the later of that and ``min(0.85 * filler, filler - FAR_TOKENS)``; at
  every length the needle is at least `FAR_TOKENS` context tokens before the end, outside a streaming window of
  2048 recent tokens.
- ``anywhere``: between 2% of the filler and its end.
- ``end``: ``from_end`` filler tokens before the end of the context (0: the context ends with it).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from elastic_attention.chat import encode_prompt
from elastic_attention.errors import InputError
from elastic_attention.evaluation.broad_suite.haystacks import Haystack, UnitSource, count_tokens

#: A rendered prompt has at most the requested tokens and at most this many fewer.
LENGTH_TOLERANCE_TOKENS = 64
#: Sensitive evidence sits at least this many context tokens before the context's end.
FAR_TOKENS = 2500
#: Robust evidence sits within about this many tokens of the prompt's end.
RECENT_TOKENS = 700
LAYOUTS = ("instruction_first", "instruction_last")
_FIT_ATTEMPTS = 12
#: How far below its budget a filler may stop (unit counts are estimates; the loop corrects the budget).
_SLACK = LENGTH_TOLERANCE_TOKENS // 4
_FIRST = 0.02


class Redraw(Exception):
    """A drawn row cannot be used (a needle landed where its answer cannot be read); draw it again."""


@dataclass
class Needle:
    """Text a family places into the context.

    Attributes:
        text: one or more lines (a trailing newline unless it ends the context).
        evidence: whether the answer needs it (its span goes into ``evidence_spans``).
        where: ``far``, ``anywhere`` or ``end`` (see the module docstring).
        draw: a uniform draw in [0, 1) that picks the position inside a ``far`` or ``anywhere`` range.
        from_end: for ``end``: filler tokens between the needle and the end of the context.
    """

    text: str
    evidence: bool = True
    where: str = "far"
    draw: float = 0.0
    from_end: int = 0
    tokens: int = 0


@dataclass
class Draft:
    """A row before its context is cut: what a family decides from the row's random source.

    Attributes:
        needles: what goes into the context; needles with equal positions keep this order.
        fields: the question wording's slots.
        answer: the expected answer ("" when ``resolve`` finds it in the fitted context).
        hint: the kind of answer-format hint the question may end with (a key of ``wordings.HINTS``).
        max_new_tokens: generation budget for the answer.
        extra: family-specific metadata.
        expect: (text, count) pairs: the fitted context must hold ``text`` exactly ``count`` times (case
            ignored); otherwise the row is drawn again (a haystack that happened to mention a key).
        distractors: values in the context that are not the answer; scoring rejects a reply naming one.
        resolve: ``(context, needle spans) -> (answer, more evidence spans, more metadata)`` for answers that depend
            on where the needles landed (the file that holds an inserted function).
    """

    needles: list[Needle]
    fields: dict[str, str]
    answer: str
    hint: str
    max_new_tokens: int = 24
    extra: dict[str, Any] = field(default_factory=dict)
    expect: list[tuple[str, int]] = field(default_factory=list)
    distractors: list[str] = field(default_factory=list)
    resolve: Callable[[str, list[tuple[int, int]]], tuple[str, list[tuple[int, int]], dict[str, Any]]] | None = None


@dataclass(frozen=True)
class Framing:
    """How a row's prompt is worded and laid out.

    Attributes:
        instruction: the task's instruction.
        question: the question (with its answer-format hint, if any).
        layout: ``instruction_first`` (instruction, context, question) or ``instruction_last`` (context,
            instruction, question).
        system: the system turn ("" for none).
    """

    instruction: str
    question: str
    layout: str
    system: str

    def parts(self) -> tuple[str, str]:
        """(the row's ``instruction`` field, its ``question`` field)."""
        if self.layout == "instruction_first":
            return self.instruction, self.question
        return "", f"{self.instruction}\n{self.question}"

    def prompt(self, context: str) -> str:
        instruction, question = self.parts()
        return "\n".join(part for part in (instruction, context, question) if part)

    def context_offset(self) -> int:
        """Where the context starts in the prompt, in characters."""
        instruction, _ = self.parts()
        return len(instruction) + 1 if instruction else 0


@dataclass(frozen=True)
class Fitted:
    """A context cut to length.

    Attributes:
        context: the context text.
        spans: (start, end) character span of each needle in the context (leading and trailing newlines excluded).
        offsets: each needle's token offset in the context (filler counts before it plus needles placed earlier).
        context_tokens: the context's tokens (sum of the unit and needle counts).
        prompt_tokens: the rendered prompt's exact tokens.
    """

    context: str
    spans: list[tuple[int, int]]
    offsets: list[int]
    context_tokens: int
    prompt_tokens: int


def _offset(needle: Needle, total: int) -> float:
    first = _FIRST * total
    if needle.where == "end":
        return total - needle.from_end
    if needle.where == "anywhere":
        return first + needle.draw * (total - first)
    if needle.where == "far":
        last = max(first, min(0.85 * total, total - FAR_TOKENS))
        return first + needle.draw * (last - first)
    raise ValueError(f"unknown needle position {needle.where!r}")


def place(filler: list[tuple[str, int]], needles: list[Needle]) -> tuple[str, list[tuple[int, int]], list[int]]:
    """The context with every needle at the unit boundary nearest its position.

    Returns:
        (context, each needle's character span, each needle's token offset).
    """
    cumulative = list(accumulate((tokens for _, tokens in filler), initial=0))
    total = cumulative[-1]
    targets = []
    for needle in needles:
        offset = max(0.0, _offset(needle, total))
        index = bisect.bisect_left(cumulative, offset)
        if index == len(cumulative) or (index > 0 and offset - cumulative[index - 1] <= cumulative[index] - offset):
            index -= 1
        targets.append(index)
    order = sorted(range(len(needles)), key=lambda k: (targets[k], k))
    pieces: list[str] = []
    chars, position, inserted = 0, 0, 0
    spans, offsets = [(0, 0)] * len(needles), [0] * len(needles)
    for k in order:
        for text, _ in filler[position : targets[k]]:
            pieces.append(text)
            chars += len(text)
        position = max(position, targets[k])
        text = needles[k].text
        spans[k] = (chars + len(text) - len(text.lstrip("\n")), chars + len(text.rstrip("\n")))
        offsets[k] = cumulative[position] + inserted
        pieces.append(text)
        chars += len(text)
        inserted += needles[k].tokens
    pieces += [text for text, _ in filler[position:]]
    context = "".join(pieces).rstrip("\n")
    spans = [(min(start, len(context)), min(end, len(context))) for start, end in spans]
    return context, spans, offsets


def fit(haystack: Haystack, draft: Draft, framing: Framing, tokenizer, length: int, task: str) -> Fitted:
    """Cut ``haystack`` around ``draft``'s needles so that the rendered prompt meets the length contract.

    Raises:
        InputError: no cut of the haystack fits (a length too short for the needles, the instruction and the
            question).
    """
    needles = draft.needles
    for needle, tokens in zip(needles, count_tokens(tokenizer, [needle.text for needle in needles])):
        needle.tokens = tokens
    overhead = len(encode_prompt(tokenizer, framing.prompt("\n"), framing.system))
    target = length - LENGTH_TOLERANCE_TOKENS // 2
    budget = target - overhead - sum(needle.tokens for needle in needles)
    source = UnitSource(haystack, tokenizer)
    prompt_tokens = 0
    for _ in range(_FIT_ATTEMPTS):
        filler = source.take(max(0, budget), _SLACK)
        if haystack.start is not None:
            filler.reverse()
        context, spans, offsets = place(filler, needles)
        prompt_tokens = len(encode_prompt(tokenizer, framing.prompt(context), framing.system))
        if length - LENGTH_TOLERANCE_TOKENS <= prompt_tokens <= length:
            context_tokens = sum(tokens for _, tokens in filler) + sum(needle.tokens for needle in needles)
            return Fitted(context, spans, offsets, context_tokens, prompt_tokens)
        budget += target - prompt_tokens
    raise InputError(f"could not fit a {task} row into {length} tokens (got {prompt_tokens}); raise the length")
