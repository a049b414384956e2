"""The code suite: long-context tasks over real Python source, for real pretrained models.

Every context is real code from the shipped standard-library snapshot (:mod:`elastic_attention.evaluation.corpus`),
files one after another, each introduced by a ``# File: Lib/...`` line. A prompt is the task's instruction, the
context, then the question (instruction first, question last, so boundary pooling sees both), rendered with the
model's chat template.

Length contract: ``generate(task, length, seed, n, tokenizer)`` returns rows whose prompt, rendered with the
tokenizer's chat template and generation prompt, has between ``length - LENGTH_TOLERANCE_TOKENS`` and ``length``
tokens (``metadata["prompt_tokens"]`` is the exact count). Contexts are cut at line boundaries.

Tasks:

- Sensitive (the evidence sits anywhere in the first three quarters of the context: by default at depths drawn from
  [0.1, 0.75], so at 8K tokens and more it is at least 1900 tokens before the question):

  - ``passkey``: one comment ``# The secret key is 482913. Remember it.``; the answer is the key.
  - ``multikey``: four such comments for four named projects; one project is asked.
  - ``find_definition``: a real function of the snapshot with an integer default parameter; the function and the
    parameter renamed (``seek`` -> ``seek_amber``, ``whence`` -> ``whence_amber``) and the default replaced by a
    random three-digit number, so the answer must be read from the context, not recalled from pretraining. The
    question names the function and the parameter and asks the default. The function's name is defined nowhere
    else in the context.
  - ``multivalue``: two module constants ``AMBER_SECRET_KEY_1 = 482913`` and ``AMBER_SECRET_KEY_2 = ...`` at
    independent depths; both values are asked (RULER's multi-value needle, in code).

- Robust (the evidence sits in the last 700 tokens of the context):

  - ``next_line``: the context is the code that precedes a real single-line statement inside a function, then
    the statement's first third of words; the question repeats those words and asks for the whole line (LongBench
    LCC style, scored by edit similarity, exact match reported beside it).
  - ``recent_fact``: a comment ``# Note: the build number of this module is 58213.`` 150-600 tokens before the
    end of the context; the answer is the number.
  - ``recent_definition``: ``find_definition`` with the function 50-250 tokens before the end of the context; its
    question quotes the default's line up to the literal (``def seek_amber(self, pos, whence_amber=...``).
  - ``pattern``: a few-shot rule: four assertions ``assert tag_marble("packet") == "amber/packet/397"`` (one
    random project and number per row around the argument) 30-200 tokens before the end of the context; what the
    function returns for a fifth argument is asked.

The tasks above replaced or rephrased earlier ones that full attention could not do (so they could not tell
sparse from full); docs/how-it-works.md ("Numbers behind the defaults") gives which and the measurements.

Determinism: sample ``i`` is drawn from ``SampleRandom(sample_seed(task, length, seed, i))`` and the snapshot; the
tokenizer only decides where contexts are cut. Each row's ``metadata["evidence_spans"]`` gives the character spans
of its evidence in ``row.prompt`` (for head ranking), ``metadata["depths"]`` their token depths in the context.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_attention.chat import encode_prompt
from elastic_attention.errors import InputError
from elastic_attention.evaluation.corpus import (
    completion_targets,
    integer_defaults,
    line_tokens,
    stdlib_files,
)
from elastic_attention.evaluation.scoring import Score, edit_similarity, first_answer_line, first_integer
from elastic_attention.evaluation.seeded_random import SampleRandom, sample_seed
from elastic_attention.rows import Row

#: A rendered prompt has at most the requested tokens and at most this many fewer.
LENGTH_TOLERANCE_TOKENS = 64
#: Shortest prompt the suite builds.
MIN_LENGTH = 1024
#: Default depth range of sensitive evidence (fraction of the context's tokens).
SENSITIVE_DEPTHS = (0.1, 0.75)
#: Lines longer than this (data tables, long literals) are left out of contexts.
_MAX_LINE_CHARS = 240
_FIT_ATTEMPTS = 12
_SKIPPED_LINES = 200

INSTRUCTIONS: dict[str, str] = {
    "passkey": "Read the Python source code below. A comment somewhere in it states a secret key; "
    "you will be asked for that key.",
    "multikey": "Read the Python source code below. Comments in it state the secret keys of several projects; "
    "you will be asked for the key of one project.",
    "find_definition": "Read the Python source code below. You will be asked about the default value of a "
    "parameter of one function defined in it.",
    "multivalue": "Read the Python source code below. It assigns the secret keys of a project to constants; "
    "you will be asked for all of them.",
    "next_line": "Complete the Python source code below.",
    "recent_fact": "Read the Python source code below. A note near its end states a build number; "
    "you will be asked for it.",
    "recent_definition": "Read the Python source code below. You will be asked about the default value of a "
    "parameter of a function defined near its end.",
    "pattern": "Read the Python source code below. Near its end, assertions show what a function returns for a few "
    "arguments; you will be asked what it returns for another argument, by the same rule.",
}

_PROJECTS = ("amber", "birch", "cobalt", "delta", "ember", "falcon", "garnet", "harbor", "indigo", "juniper",
             "kestrel", "lumen", "marble", "nectar", "onyx", "pepper", "quartz", "raven", "saffron", "tundra")
_PATTERN_WORDS = ("thread", "parser", "buffer", "signal", "record", "cursor", "header", "stream", "folder", "module",
                  "string", "format", "window", "filter", "socket", "packet", "widget", "ticket", "sample", "vector")


@dataclass
class _Insert:
    """Lines to place into the context: at ``depth`` (a fraction of the filler's tokens) or ``from_end`` tokens
    before its end; ``evidence`` marks what the answer needs."""

    lines: list[str]
    evidence: bool
    depth: float | None = None
    from_end: int | None = None
    tokens: int = 0


# ----------------------------------------------------------------------------------------------------------------
# Context assembly
# ----------------------------------------------------------------------------------------------------------------


def _forward_lines(rng: SampleRandom, excluded: frozenset[int]) -> Iterator[tuple[str, int, int]]:
    """(line, file index, line index) from a random file onwards, wrapping around; line index -1 is a header."""
    files = stdlib_files()
    first = rng.below(len(files))
    for step in range(len(files)):
        index = (first + step) % len(files)
        if index in excluded or not files[index].lines:
            continue
        yield files[index].header, index, -1
        for line_index, line in enumerate(files[index].lines):
            yield line, index, line_index


def _backward_lines(file_index: int, line_index: int) -> Iterator[tuple[str, int, int]]:
    """The lines before ``(file_index, line_index)``, nearest first, through the preceding files (wrapping)."""
    files = stdlib_files()
    index, end = file_index, line_index
    for _ in range(len(files)):
        for position in range(end - 1, -1, -1):
            yield files[index].lines[position], index, position
        yield files[index].header, index, -1
        index = (index - 1) % len(files)
        end = len(files[index].lines)


def _take(stream: Iterator[tuple[str, int, int]], counter, budget: int, skip: int = 0) -> list[tuple[str, int]]:
    """(line, tokens) pairs from ``stream`` while their token sum stays within ``budget``.

    With ``skip`` > 0, up to that many lines that would overshoot the budget are passed over (the lines after them
    are tried), so a budget can be met more closely than one long line allows.
    """
    taken, total = [], 0
    for line, file_index, line_index in stream:
        if len(line) > _MAX_LINE_CHARS:
            continue
        tokens = counter.of_header(file_index) if line_index < 0 else counter.of_file(file_index)[line_index]
        if total + tokens > budget:
            if skip <= 0:
                break
            skip -= 1
            continue
        taken.append((line, tokens))
        total += tokens
    return taken


def _place(filler: list[tuple[str, int]], inserts: Sequence[_Insert]) -> tuple[list[str], list[int], list[int]]:
    """Context lines with the inserts at their positions; also each insert's first line index and token offset."""
    total = sum(tokens for _, tokens in filler)
    cumulative = [0]
    for _, tokens in filler:
        cumulative.append(cumulative[-1] + tokens)
    targets = []
    for insert in inserts:
        offset = total - insert.from_end if insert.from_end is not None else round(insert.depth * total)
        boundary = min(range(len(cumulative)), key=lambda i: (abs(cumulative[i] - max(0, offset)), i))
        targets.append(boundary)
    order = sorted(range(len(inserts)), key=lambda k: (targets[k], k))
    lines: list[str] = []
    starts, offsets = [0] * len(inserts), [0] * len(inserts)
    position, inserted_tokens = 0, 0
    for k in order:
        lines += [line for line, _ in filler[position : targets[k]]]
        position = max(position, targets[k])
        starts[k], offsets[k] = len(lines), cumulative[position] + inserted_tokens
        lines += inserts[k].lines
        inserted_tokens += inserts[k].tokens
    lines += [line for line, _ in filler[position:]]
    return lines, starts, offsets


def _build(
    task: str,
    tokenizer,
    length: int,
    seed: int,
    rng: SampleRandom,
    question: str,
    answer: str,
    *,
    inserts: Sequence[_Insert] = (),
    stream: Callable[[], Iterator[tuple[str, int, int]]],
    reverse: bool = False,
    max_new_tokens: int,
    extra: dict[str, Any] | None = None,
) -> Row:
    """Fit filler from ``stream`` around ``inserts`` so the rendered prompt meets the length contract."""
    counter = line_tokens(tokenizer)
    instruction = INSTRUCTIONS[task]
    for insert in inserts:
        insert.tokens = sum(counter.count(line) for line in insert.lines)
    overhead = len(encode_prompt(tokenizer, f"{instruction}\n\n{question}"))
    budget = length - overhead - sum(insert.tokens for insert in inserts)
    seen, skip = set(), 0
    for _ in range(_FIT_ATTEMPTS):
        filler = _take(stream(), counter, budget, skip)
        if reverse:
            filler.reverse()
        lines, starts, offsets = _place(filler, inserts)
        context = "".join(lines).rstrip("\n")
        prompt = f"{instruction}\n{context}\n{question}"
        prompt_tokens = len(encode_prompt(tokenizer, prompt))
        if length - LENGTH_TOLERANCE_TOKENS <= prompt_tokens <= length:
            break
        if prompt_tokens in seen:  # one line steps over the whole tolerance: pass over long lines at the end
            skip = _SKIPPED_LINES
        seen.add(prompt_tokens)
        budget += length - LENGTH_TOLERANCE_TOKENS // 2 - prompt_tokens
    else:
        raise InputError(f"could not fit a {task} row into {length} tokens (got {prompt_tokens}); raise the length")
    context_tokens = sum(tokens for _, tokens in filler) + sum(insert.tokens for insert in inserts)
    base = len(instruction) + 1
    spans, depths = [], []
    for k, insert in enumerate(inserts):
        if insert.evidence:
            start = base + sum(len(line) for line in lines[: starts[k]])
            spans.append((start, start + len("".join(insert.lines).rstrip("\n"))))
            depths.append(offsets[k] / max(1, context_tokens))
    metadata = {
        "length": length,
        "prompt_tokens": prompt_tokens,
        "context_tokens": context_tokens,
        "seed": seed,
        "evidence_spans": spans,
        "depths": depths,
        "max_new_tokens": max_new_tokens,
        **(extra or {}),
    }
    return Row(context=context, question=question, answer=answer, task=task, instruction=instruction,
                   metadata=metadata)


def _depth(rng: SampleRandom, depth: float | None) -> float:
    if depth is None:
        low, high = SENSITIVE_DEPTHS
        return low + (high - low) * rng.fraction()
    if not 0.0 <= depth <= 1.0:
        raise InputError(f"`depth` must be in [0, 1], got {depth}")
    return depth


def _number(rng: SampleRandom, digits: int) -> str:
    return str(rng.integer(10 ** (digits - 1), 10**digits - 1))


def _distinct_numbers(rng: SampleRandom, count: int, digits: int) -> list[str]:
    numbers: list[str] = []
    while len(numbers) < count:
        number = _number(rng, digits)
        if number not in numbers:
            numbers.append(number)
    return numbers


def _check_length(length: int) -> None:
    if isinstance(length, bool) or not isinstance(length, int) or length < MIN_LENGTH:
        raise InputError(f"code suite rows need `length` >= {MIN_LENGTH} tokens, got {length!r}")


def _any_file(rng: SampleRandom, excluded: frozenset[int] = frozenset()):
    """A stream factory: every call replays the same lines, from a file drawn once from ``rng``."""
    start = rng.below(1 << 62)
    return lambda: _forward_lines(SampleRandom(start), excluded)


# ----------------------------------------------------------------------------------------------------------------
# Sensitive tasks
# ----------------------------------------------------------------------------------------------------------------


def passkey(length: int, seed: int, tokenizer, *, depth: float | None = None) -> Row:
    """One secret key in a comment at ``depth`` (drawn from `SENSITIVE_DEPTHS` when None); asked at the end."""
    rng = SampleRandom(seed)
    key = _number(rng, 6)
    inserts = [_Insert([f"# The secret key is {key}. Remember it.\n"], True, depth=_depth(rng, depth))]
    question = "What is the secret key stated in the code above? Answer with the key only."
    return _build("passkey", tokenizer, length, seed, rng, question, key, inserts=inserts, stream=_any_file(rng),
                  max_new_tokens=16, extra={"key": key})


def multikey(length: int, seed: int, tokenizer, *, num_keys: int = 4) -> Row:
    """``num_keys`` (2-8) project keys in comments at independent depths; the key of one project is asked."""
    if not 2 <= num_keys <= 8:
        raise InputError(f"`num_keys` must be in [2, 8], got {num_keys}")
    rng = SampleRandom(seed)
    projects = rng.sample(_PROJECTS, num_keys)
    keys = _distinct_numbers(rng, num_keys, 6)
    inserts = [
        _Insert([f"# The secret key of the {project} project is {key}.\n"], index == 0, depth=_depth(rng, None))
        for index, (project, key) in enumerate(zip(projects, keys))
    ]
    question = f"What is the secret key of the {projects[0]} project? Answer with the key only."
    return _build("multikey", tokenizer, length, seed, rng, question, keys[0], inserts=inserts,
                  stream=_any_file(rng), max_new_tokens=16, extra={"projects": projects, "keys": keys})


def find_definition(length: int, seed: int, tokenizer, *, depth: float | None = None) -> Row:
    """A real function with its integer default replaced by a random number, at ``depth`` (drawn from
    `SENSITIVE_DEPTHS` when None); the default is asked by the function's and the parameter's names.

    The function's file is left out of the filler and redrawn when the filler defines the same name elsewhere.
    """
    rng = SampleRandom(seed)
    return _definition_row("find_definition", length, seed, tokenizer, rng, depth=_depth(rng, depth),
                           quote_line=False)


def _definition_row(task: str, length: int, seed: int, tokenizer, rng: SampleRandom, *, depth: float | None = None,
                    from_end: int | None = None, quote_line: bool = True) -> Row:
    """A definition row of ``task`` with the function at ``depth`` or ``from_end`` tokens before the context's end;
    with ``quote_line`` the question quotes the default's line up to the literal, else it names the function and
    the parameter only."""
    definitions = integer_defaults()
    files = stdlib_files()
    for _ in range(32):
        definition = rng.choice(definitions)
        source = files[definition.file_index]
        value = rng.integer(100, 999)  # three digits: never a natural default, so it must be read
        lines = list(source.lines[definition.start : definition.end])
        row_of_default = definition.default_line - definition.start
        begin, end = definition.default_columns
        text = lines[row_of_default]
        lines[row_of_default] = f"{text[:begin]}{value}{text[end:]}"
        indent = len(lines[0]) - len(lines[0].lstrip())
        lines = [line[indent:] if line[:indent].strip() == "" else line.lstrip() for line in lines]
        # New names for the function and the parameter, so that the model cannot answer from its memory of the
        # standard library (the first run answered the original default about as often as it erred).
        suffix = rng.choice(_PROJECTS)
        name, parameter = f"{definition.name}_{suffix}", f"{definition.parameter}_{suffix}"
        lines[0] = lines[0].replace(f"def {definition.name}(", f"def {name}(", 1)
        lines = [re.sub(rf"\b{re.escape(definition.parameter)}\b", parameter, line) for line in lines]
        stream = _any_file(rng, frozenset({definition.file_index}))
        defined = re.compile(rf"\bdef {re.escape(name)}\(")
        probe = "".join(line for line, _ in _take(stream(), line_tokens(tokenizer), length))
        if not defined.search(probe):
            break
    else:
        raise InputError(f"no {task} row without a duplicate definition for seed {seed}")
    inserts = [_Insert(["\n", *lines, "\n"], True, depth=depth, from_end=from_end)]
    if quote_line:
        default_line = lines[row_of_default]
        literal = re.search(rf"\b{re.escape(parameter)}\b[^=]*=\s*(?={value}\b)", default_line)
        head = default_line[: literal.end()].strip()
        if not head.startswith("def "):  # "def seek_amber(self, pos, whence_amber="
            head = f"def {name}(... {head}"
        question = (f"In the code above, the function `{name}` is defined as `{head}...`. What is the default "
                    f"value of its parameter `{parameter}`? Answer with the value only.")
    else:
        question = (f"What is the default value of the parameter `{parameter}` of the function `{name}` defined in "
                    f"the code above? Answer with the value only.")
    extra = {"function": name, "parameter": parameter, "file": source.path, "original_name": definition.name,
             "original_default": definition.default}
    return _build(task, tokenizer, length, seed, rng, question, str(value), inserts=inserts,
                  stream=stream, max_new_tokens=16, extra=extra)


def multivalue(length: int, seed: int, tokenizer, *, num_values: int = 2) -> Row:
    """``num_values`` (2-4) secret keys of one project as numbered module constants (``AMBER_SECRET_KEY_1 = ...``)
    at independent depths; all of them are asked."""
    if not 2 <= num_values <= 4:
        raise InputError(f"`num_values` must be in [2, 4], got {num_values}")
    rng = SampleRandom(seed)
    project = rng.choice(_PROJECTS).upper()
    keys = _distinct_numbers(rng, num_values, 6)
    names = [f"{project}_SECRET_KEY_{index}" for index in range(1, num_values + 1)]
    inserts = [_Insert([f"{name} = {key}\n"], True, depth=_depth(rng, None)) for name, key in zip(names, keys)]
    listed = ", ".join(f"`{name}`" for name in names[:-1]) + f" and `{names[-1]}`"
    question = (f"What are the values of {listed} in the code above? "
                f"Answer with the {num_values} numbers only, separated by commas.")
    return _build("multivalue", tokenizer, length, seed, rng, question, ", ".join(keys), inserts=inserts,
                  stream=_any_file(rng), max_new_tokens=16 * num_values, extra={"project": project, "keys": keys})


# ----------------------------------------------------------------------------------------------------------------
# Robust tasks
# ----------------------------------------------------------------------------------------------------------------


def next_line(length: int, seed: int, tokenizer) -> Row:
    """The code before a real single-line statement of a function, then the statement's first words; the answer is
    the whole statement line (stripped)."""
    rng = SampleRandom(seed)
    file_index, line_index = rng.choice(completion_targets())
    target = stdlib_files()[file_index].lines[line_index].rstrip("\n")
    indent = len(target) - len(target.lstrip())
    words = target[indent:].split(" ")
    cut = indent + len(" ".join(words[: max(1, len(words) // 3)]))
    question = (f"Complete the last, unfinished line of the code above, which starts with `{target[indent:cut]}`. "
                f"Answer with the complete line only.")
    answer = target.strip()
    answer_tokens = line_tokens(tokenizer).count(answer)
    inserts = [_Insert([target[:cut] + "\n"], True, from_end=0)]
    return _build("next_line", tokenizer, length, seed, rng, question, answer, inserts=inserts,
                  stream=lambda: _backward_lines(file_index, line_index), reverse=True,
                  max_new_tokens=answer_tokens + 12,
                  extra={"file": stdlib_files()[file_index].path, "line": line_index + 1, "prefix": target[:cut]})


def recent_fact(length: int, seed: int, tokenizer) -> Row:
    """A build-number note 150-600 tokens before the end of the context; the number is asked."""
    rng = SampleRandom(seed)
    number = _number(rng, 5)
    inserts = [_Insert([f"# Note: the build number of this module is {number}.\n"], True,
                       from_end=rng.integer(150, 600))]
    question = "What is the build number given in the note near the end of the code above? Answer with the number only."
    return _build("recent_fact", tokenizer, length, seed, rng, question, number, inserts=inserts,
                  stream=_any_file(rng), max_new_tokens=16, extra={"number": number})


def recent_definition(length: int, seed: int, tokenizer) -> Row:
    """`find_definition` with the function placed 50-250 tokens before the end of the context."""
    rng = SampleRandom(seed)
    return _definition_row("recent_definition", length, seed, tokenizer, rng, from_end=rng.integer(50, 250))


def pattern(length: int, seed: int, tokenizer, *, num_examples: int = 4) -> Row:
    """A few-shot rule: ``num_examples`` (2-8) assertions ``assert tag_amber("thread") == "ember/thread/482"``
    30-200 tokens before the end of the context, one rule per row (a random project and three-digit number around
    the argument); the result for a new argument is asked."""
    if not 2 <= num_examples <= 8:
        raise InputError(f"`num_examples` must be in [2, 8], got {num_examples}")
    rng = SampleRandom(seed)
    name = f"tag_{rng.choice(_PROJECTS)}"
    prefix, number = rng.choice(_PROJECTS), _number(rng, 3)
    words = rng.sample(_PATTERN_WORDS, num_examples + 1)
    lines = [f"# Examples of {name}, the naming rule of this module:\n"]
    lines += [f'assert {name}("{word}") == "{prefix}/{word}/{number}"\n' for word in words[:-1]]
    inserts = [_Insert(["\n", *lines, "\n"], True, from_end=rng.integer(30, 200))]
    question = (f"The assertions near the end of the code above show what `{name}` returns. By the same rule, what "
                f'does `{name}("{words[-1]}")` return? Answer with the returned string only.')
    answer = f"{prefix}/{words[-1]}/{number}"
    return _build("pattern", tokenizer, length, seed, rng, question, answer, inserts=inserts, stream=_any_file(rng),
                  max_new_tokens=24, extra={"function": name, "examples": words[:-1], "argument": words[-1]})


# ----------------------------------------------------------------------------------------------------------------
# Registry, generation, scoring
# ----------------------------------------------------------------------------------------------------------------

TASKS: dict[str, Callable[..., Row]] = {
    "passkey": passkey,
    "multikey": multikey,
    "find_definition": find_definition,
    "multivalue": multivalue,
    "next_line": next_line,
    "recent_fact": recent_fact,
    "recent_definition": recent_definition,
    "pattern": pattern,
}
SENSITIVE_TASKS: tuple[str, ...] = ("passkey", "multikey", "find_definition", "multivalue")
ROBUST_TASKS: tuple[str, ...] = ("next_line", "recent_fact", "recent_definition", "pattern")


def generate(task: str, length: int, seed: int, n: int, tokenizer=None, **options: Any) -> list[Row]:
    """``n`` rows of one code-suite task whose rendered prompts meet the length contract under ``tokenizer``.

    Raises:
        InputError: unknown task, no tokenizer, bad ``n`` or ``length``, or a bad option.
    """
    if task not in TASKS:
        raise InputError(f"`task` must be one of {sorted(TASKS)}, got {task!r}")
    if tokenizer is None:
        raise InputError("code suite rows are cut to a length in the model's tokens: pass its tokenizer")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"`n` must be a non-negative integer, got {n!r}")
    _check_length(length)
    return [TASKS[task](length, sample_seed(task, length, seed, i), tokenizer, **options) for i in range(n)]


def decode(tokenizer, token_ids: list[int]) -> str:
    """Generated ids up to the first end-of-sequence token, special tokens dropped, lines kept."""
    ids = list(token_ids)
    if tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id)]
    return tokenizer.decode(ids, skip_special_tokens=True).strip()


def score(prediction: str, row: Row) -> Score:
    """Score a decoded prediction.

    - ``next_line``: accuracy is the edit similarity of the prediction's first code line to the answer line
      (both stripped); exact when equal.
    - ``multivalue``: exact when the whole numbers in the prediction are the project's keys, each once, in any
      order (digits inside a name such as ``AMBER_SECRET_KEY_1`` do not count).
    - ``pattern``: exact when the first answer line holds the answer string, not as part of a longer word
      (quotes, backticks or the whole ``assert`` line around it are fine).
    - the other (number) tasks: exact when the first integer in the prediction equals the answer.
    """
    if row.task == "next_line":
        line = first_answer_line(prediction)
        return Score(edit_similarity(line, row.answer), line == row.answer)
    if row.task == "multivalue":
        # Whole numbers only: the digits of a constant's name (`AMBER_SECRET_KEY_1 = ...`) are not answers.
        exact = sorted(re.findall(r"\b\d+\b", prediction)) == sorted(row.metadata["keys"])
    elif row.task == "pattern":
        exact = re.search(rf"(?<![\w/]){re.escape(row.answer)}(?![\w/])", first_answer_line(prediction)) is not None
    else:
        exact = first_integer(prediction) == row.answer
    return Score(float(exact), exact)
