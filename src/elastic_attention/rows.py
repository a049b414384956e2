"""The one row type of training and evaluation, and its one encoding through a tokenizer's chat template.

A :class:`Row` is a prompt (instruction, long context, question; optionally a system text) with its answer and
task; suites attach ``metadata`` (length, evidence spans, depths). :func:`encode_row` renders it once for every
use: the routers' training, evaluation, head ranking and the lm-eval export all see the same token ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from elastic_attention.chat import encode_chat
from elastic_attention.errors import InputError


@dataclass(frozen=True)
class Row:
    """One sample.

    Attributes:
        context: the long text.
        question: the question that ends the prompt.
        answer: the expected answer.
        task: task name; it selects the sparsity target in training and the suite in evaluation.
        instruction: text that starts the prompt (may be empty).
        metadata: what a suite records about the row, e.g. ``length`` (rendered prompt tokens), ``seed``,
            ``evidence_spans`` or ``evidence_offsets``, ``depths`` and task-specific fields; empty for rows read
            from a file.
        source: where a row read from a file comes from (``"rows.jsonl, line 3"``), for error messages; not part
            of a row's equality.
        system: the system turn rendered before the user prompt (empty: none, the template's own default if it
            writes one); not part of :attr:`prompt`.
        assistant_prefix: text that starts the assistant's turn, which the answer continues (RULER's
            ``gen_prefix``, "The special magic number for ... is"); part of the rendered prompt; empty for most rows.
    """

    context: str
    question: str
    answer: str
    task: str
    instruction: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = field(default="", compare=False)
    system: str = ""
    assistant_prefix: str = ""

    @property
    def prompt(self) -> str:
        """The user prompt: instruction (when there is one), context and question, separated by newlines."""
        return "\n".join(part for part in (self.instruction, self.context, self.question) if part)


@dataclass(frozen=True)
class EncodedRow:
    """Token ids of one row: the prompt (with the generation prompt) and the answer turn that follows."""

    prompt_ids: list[int]
    answer_ids: list[int]
    task: str
    source: str = field(default="", compare=False)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.answer_ids)


def encode_row(tokenizer, row: Row) -> EncodedRow:
    """Render a row with the tokenizer's chat template: its system turn (if any), the prompt with the generation
    prompt, then the answer turn.

    Raises:
        InputError: the tokenizer has no chat template, it refuses the row's system turn, or the rendered answer turn
            does not extend the prompt.
    """
    try:
        prompt_ids, answer_ids = encode_chat(tokenizer, row.prompt, row.answer, row.system,
                                             assistant_prefix=row.assistant_prefix)
    except InputError as error:
        if not row.source:
            raise
        raise InputError(f"{row.source}: {error}") from None
    return EncodedRow(prompt_ids, answer_ids, row.task, row.source)
