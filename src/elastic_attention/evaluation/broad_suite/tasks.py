"""The broad suite's families, and its three entry points: :func:`generate`, :func:`decode` and :func:`score`."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastic_attention.errors import InputError
from elastic_attention.evaluation import code_suite
from elastic_attention.evaluation.broad_suite import (
    families_code,
    families_facts,
    families_local,
    families_records,
    families_whole,
)
from elastic_attention.evaluation.broad_suite.assembly import LAYOUTS, Draft, Fitted, Framing, Redraw, fit
from elastic_attention.evaluation.broad_suite.haystacks import Haystack
from elastic_attention.evaluation.broad_suite.wordings import (
    HINT_SHARE,
    HINTS,
    INSTRUCTIONS,
    QUESTIONS,
    SYSTEM_PROMPTS,
    SYSTEM_SHARE,
)
from elastic_attention.evaluation.scoring import Score, edit_similarity, first_answer_line
from elastic_attention.evaluation.seeded_random import SampleRandom, sample_seed
from elastic_attention.rows import Row

#: Shortest prompt the suite builds: sensitive evidence must fit 2500 tokens before the question.
MIN_LENGTH = 4096
#: Expected sparsity targets by expected kind (the paper's); training should use measured ones.
EXPECTED_TARGETS = {"sensitive": 0.7, "robust": 1.0}
#: Draws of a row before giving up when a haystack keeps mentioning one of its keys.
_REDRAWS = 8


@dataclass(frozen=True)
class Family:
    """A task family.

    Attributes:
        name: the task name.
        kind: the expected kind, ``sensitive`` (the answer needs far context) or ``robust`` (the evidence is in
            the last ~700 tokens or the task is local). An expectation only: measure it.
        make: ``rng -> (haystack, draft)``.
        asks: what the family asks, in one line.
    """

    name: str
    kind: str
    make: Callable[[SampleRandom], tuple[Haystack, Draft]]
    asks: str


_FAMILIES = (
    Family("fact_single", "sensitive", families_facts.fact_single,
           "the value of one attribute of one entity, stated once, far from the question"),
    Family("fact_multikey", "sensitive", families_facts.fact_multikey,
           "the value of one entity among 3-8 entities with values of the same attribute"),
    Family("fact_multivalue", "sensitive", families_facts.fact_multivalue,
           "all 2-4 values of one attribute of one entity, stated apart, with other entities' values around"),
    Family("two_hop", "sensitive", families_facts.two_hop,
           "an attribute of the item that a relation of the named entity points to (two linked facts)"),
    Family("chain_tracking", "sensitive", families_facts.chain_tracking,
           "the number a name ends up holding after 2-4 copies from name to name, beside a distractor chain"),
    Family("json_lookup", "sensitive", families_records.json_lookup,
           "a field of the JSON record with a given key"),
    Family("table_lookup", "sensitive", families_records.table_lookup,
           "a cell of the CSV or markdown row with a given key"),
    Family("log_lookup", "sensitive", families_records.log_lookup,
           "a detail of the log line about a given request, job, payment, sign-in, object or backup"),
    Family("code_definition", "sensitive", families_code.code_definition,
           "the file that defines a new function (calls to it appear elsewhere)"),
    Family("code_caller", "sensitive", families_code.code_caller,
           "the function that calls a given helper, beside another caller of another helper"),
    Family("mention_count", "sensitive", families_whole.mention_count,
           "how many times (2-9) something is mentioned across the whole context"),
    Family("value_aggregate", "sensitive", families_whole.value_aggregate,
           "the sum, maximum or minimum of 3-6 amounts of one entity spread across the context"),
    Family("fact_recent", "robust", families_facts.fact_recent,
           "a fact stated 40-450 tokens before the end, with same-attribute facts of other entities far before"),
    Family("last_record", "robust", families_records.last_record,
           "a field of the last record of a table or log"),
    Family("sequence_next", "robust", families_local.sequence_next,
           "the next item of a regular sequence (numbers, dates, codes, letters) that ends the context"),
    Family("line_completion", "robust", families_code.line_completion,
           "the whole of a real if/for/while/with line that the context breaks off in"),
    Family("rule_induction", "robust", families_local.rule_induction,
           "a string rule shown by 3-6 examples near the end, applied to a new word"),
)
FAMILIES: dict[str, Family] = {family.name: family for family in _FAMILIES}
SENSITIVE_TASKS: tuple[str, ...] = tuple(family.name for family in _FAMILIES if family.kind == "sensitive")
ROBUST_TASKS: tuple[str, ...] = tuple(family.name for family in _FAMILIES if family.kind == "robust")


@dataclass(frozen=True)
class Plan:
    """Everything a row is before its context is cut: its haystack, its draft and its framing.

    Attributes:
        seed: the seed it was drawn from.
        haystack: the filler's recipe.
        draft: needles, answer and fields.
        framing: instruction, question, layout and system turn.
        wording: what metadata records about the framing (wording indices, layout).
    """

    seed: int
    haystack: Haystack
    draft: Draft
    framing: Framing
    wording: dict[str, Any]


def expected_targets() -> dict[str, float]:
    """Each family's sparsity target from its expected kind (`EXPECTED_TARGETS`): a starting point for a config's
    ``targets`` until the measured kinds and targets replace it."""
    return {family.name: EXPECTED_TARGETS[family.kind] for family in _FAMILIES}


def _choose(rng: SampleRandom, forced: Any, options: tuple) -> Any:
    """One of ``options``, drawn even when ``forced`` decides, so forcing one choice leaves the others as drawn."""
    drawn = rng.choice(options)
    return drawn if forced is None else forced


def _frame(rng: SampleRandom, task: str, haystack: Haystack, draft: Draft, layout: str | None,
           system: bool | None) -> tuple[Framing, dict[str, Any]]:
    """The row's wording, layout and system turn; also what metadata records about them."""
    fields = {"doc": haystack.noun, **draft.fields}
    instruction_index = rng.below(len(INSTRUCTIONS[task]))
    question_index = rng.below(len(QUESTIONS[task]))
    question = QUESTIONS[task][question_index].format(**fields)
    question = question[0].upper() + question[1:]
    if rng.fraction() < HINT_SHARE:
        question += " " + rng.choice(HINTS[draft.hint])
    layout = _choose(rng, layout, LAYOUTS)
    drawn_system = rng.fraction() < SYSTEM_SHARE
    with_system = drawn_system if system is None else system
    system_text = rng.choice(SYSTEM_PROMPTS)
    framing = Framing(INSTRUCTIONS[task][instruction_index].format(**fields), question, layout,
                      system_text if with_system else "")
    return framing, {"instruction_wording": instruction_index, "question_wording": question_index,
                     "layout": layout}


def _row(task: str, length: int, plan: Plan, fitted: Fitted) -> Row:
    haystack, draft, framing = plan.haystack, plan.draft, plan.framing
    answer, resolved_spans, resolved = draft.answer, [], {}
    if draft.resolve is not None:
        answer, resolved_spans, resolved = draft.resolve(fitted.context, fitted.spans)
    base = framing.context_offset()
    evidence = [k for k, needle in enumerate(draft.needles) if needle.evidence]
    spans = sorted([fitted.spans[k] for k in evidence] + list(resolved_spans))
    metadata = {
        "length": length,
        "prompt_tokens": fitted.prompt_tokens,
        "context_tokens": fitted.context_tokens,
        "seed": plan.seed,
        "kind": FAMILIES[task].kind,
        "haystack": haystack.category,
        "haystack_format": haystack.fmt,
        **plan.wording,
        "answer_kind": draft.hint,
        "evidence_spans": [(base + start, base + end) for start, end in spans],
        "depths": [fitted.offsets[k] / max(1, fitted.context_tokens) for k in evidence],
        "distractors": list(draft.distractors),
        "max_new_tokens": draft.max_new_tokens,
        **draft.extra,
        **resolved,
    }
    instruction, question = framing.parts()
    return Row(context=fitted.context, question=question, answer=answer, task=task, instruction=instruction,
               metadata=metadata, system=framing.system)


def _expectations_hold(context: str, expect: list[tuple[str, int]]) -> bool:
    lowered = context.lower()
    return all(lowered.count(text.lower()) == count for text, count in expect)


def plan_row(task: str, seed: int, *, layout: str | None = None, system: bool | None = None) -> Plan:
    """What the row of ``task`` drawn from ``seed`` will hold, without a tokenizer (cheap: nothing is cut).

    Raises:
        InputError: an unknown task.
    """
    if task not in FAMILIES:
        raise InputError(f"`task` must be one of {sorted(FAMILIES)}, got {task!r}")
    rng = SampleRandom(seed)
    haystack, draft = FAMILIES[task].make(rng)
    framing, wording = _frame(rng, task, haystack, draft, layout, system)
    return Plan(seed, haystack, draft, framing, wording)


def make_row(task: str, length: int, seed: int, tokenizer, *, layout: str | None = None,
             system: bool | None = None) -> Row:
    """The row drawn from ``seed`` (or, when its haystack happens to mention one of its keys, from the next of up
    to `_REDRAWS` seeds derived from it).

    Raises:
        InputError: no draw fits ``length``, or every draw collided with its haystack.
    """
    for attempt in range(_REDRAWS):
        row_seed = seed if attempt == 0 else sample_seed(f"{task}/redraw", length, seed, attempt)
        plan = plan_row(task, row_seed, layout=layout, system=system)
        fitted = fit(plan.haystack, plan.draft, plan.framing, tokenizer, length, task)
        if not _expectations_hold(fitted.context, plan.draft.expect):
            continue
        try:
            return _row(task, length, plan, fitted)
        except Redraw:
            continue
    raise InputError(f"every one of {_REDRAWS} draws of a {task} row (seed {seed}) mentioned a key twice")


def generate(task: str, length: int, seed: int, n: int, tokenizer=None, *, layout: str | None = None,
             system: bool | None = None) -> list[Row]:
    """``n`` rows of one broad-suite family whose rendered prompts meet the length contract under ``tokenizer``.

    Row ``i`` is a pure function of ``(task, length, seed, i)`` (and the tokenizer, which decides where contexts
    are cut): the same arguments give the same rows, another ``seed`` gives other text.

    Args:
        task: a family name (`FAMILIES`).
        length: rendered prompt tokens, at least `MIN_LENGTH`.
        seed: any integer; a trainer asks for epoch ``e``'s rows with a seed of its own per epoch.
        n: number of rows.
        tokenizer: the model's tokenizer, with a chat template.
        layout: ``instruction_first`` or ``instruction_last`` for every row; None draws it per row.
        system: True / False for a system turn in every row / in none; None draws it per row.

    Raises:
        InputError: unknown task or layout, no tokenizer, bad ``n`` or ``length``.
    """
    if task not in FAMILIES:
        raise InputError(f"`task` must be one of {sorted(FAMILIES)}, got {task!r}")
    if tokenizer is None:
        raise InputError("broad suite rows are cut to a length in the model's tokens: pass its tokenizer")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"`n` must be a non-negative integer, got {n!r}")
    if isinstance(length, bool) or not isinstance(length, int) or length < MIN_LENGTH:
        raise InputError(f"broad suite rows need `length` >= {MIN_LENGTH} tokens, got {length!r}")
    if layout is not None and layout not in LAYOUTS:
        raise InputError(f"`layout` must be one of {LAYOUTS} or None, got {layout!r}")
    if system not in (None, True, False):
        raise InputError(f"`system` must be True, False or None, got {system!r}")
    return [make_row(task, length, sample_seed(task, length, seed, i), tokenizer, layout=layout, system=system)
            for i in range(n)]


decode = code_suite.decode


def _mentions(text: str, value: str, case_sensitive: bool) -> bool:
    """Whether ``value`` occurs in ``text`` as a whole (no letter, digit or underscore glued to either side)."""
    flags = 0 if case_sensitive else re.IGNORECASE
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text, flags) is not None


def _first_number(text: str) -> str | None:
    match = re.search(r"-?\d[\d,]*(?:\.\d+)?", text)
    return match.group(0).replace(",", "").rstrip(".") if match else None


def score(prediction: str, row: Row) -> Score:
    """Score a decoded prediction by the row's ``answer_kind``.

    - ``value`` / ``identifier``: exact when the first answer line names the answer (as a whole word; case ignored
      unless ``metadata["case_sensitive"]``) and names none of the row's distractors.
    - ``values``: exact when the prediction names every expected value (``metadata["values"]``) and no distractor.
    - ``number``: exact when the first number in the prediction (thousands separators allowed) is the answer.
    - ``line``: accuracy is the edit similarity of the first answer line to the answer; exact when equal.
    - ``path``: exact when the first answer line names the file (``json/decoder.py``, with or without ``Lib/``)
      or its dotted module (``json.decoder``).

    Raises:
        InputError: a row without ``answer_kind`` (not made by this suite).
    """
    kind = row.metadata.get("answer_kind")
    if kind is None:
        raise InputError(f"row of task {row.task!r} has no `answer_kind`; score rows made by the broad suite")
    line = first_answer_line(prediction)
    if kind == "line":
        return Score(edit_similarity(line, row.answer), line == row.answer)
    if kind == "number":
        exact = _first_number(prediction) == row.answer
    elif kind == "path":
        module = re.escape(row.answer.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
        exact = _mentions(line.replace("\\", "/"), row.answer, False) or re.search(
            rf"(?<![\w./]){module}(?![\w/]|\.\w)", line, re.IGNORECASE) is not None
    else:
        case_sensitive = bool(row.metadata.get("case_sensitive"))
        expected = row.metadata.get("values", [row.answer]) if kind == "values" else [row.answer]
        text = prediction if kind == "values" else line
        exact = all(_mentions(text, value, case_sensitive) for value in expected) and not any(
            _mentions(text, other, case_sensitive) for other in row.metadata.get("distractors", []))
    return Score(float(exact), exact)
