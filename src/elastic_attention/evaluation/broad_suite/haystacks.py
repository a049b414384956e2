"""The four kinds of haystack (the filler a context is cut from) and a counted, replayable stream of their units.

- ``python``: the shipped standard-library snapshot, files one after another, each introduced by a header line
  whose style is drawn per row (never the code suite's header).
- ``prose``: the snapshot's docstrings (:func:`~elastic_attention.evaluation.broad_suite.vocabulary.prose_paragraphs`),
  paragraphs in file order from a random start.
- ``records``: generated structured text: a table of one schema as CSV, markdown, JSON Lines or a JSON array, or a
  server log in one of four line styles.
- ``words``: random words of the docstring vocabulary, as plain lines, capitalized sentences or comma lists.

A haystack is a recipe (a seed and a style); :meth:`Haystack.units` replays the same units every time, so fitting a
context to a length can take more or fewer of them on each attempt.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from itertools import islice

from elastic_attention.evaluation.broad_suite.records import (
    LOG_EVENTS,
    LOG_STYLES,
    SCHEMAS,
    TABLE_FORMATS,
    Log,
    Schema,
    Table,
)
from elastic_attention.evaluation.broad_suite.vocabulary import prose_paragraphs, vocabulary
from elastic_attention.evaluation.corpus import stdlib_files
from elastic_attention.evaluation.seeded_random import SampleRandom

CATEGORIES = ("python", "prose", "records", "words")
#: Haystack formats per category; a family names the formats it can use.
FORMATS = {"python": ("python",), "prose": ("prose",), "records": (*TABLE_FORMATS, "log"), "words": ("words",)}
ALL_FORMATS = tuple(fmt for formats in FORMATS.values() for fmt in formats)
#: Lines longer than this (data tables, long literals) are left out of Python contexts.
_MAX_LINE_CHARS = 240
_PYTHON_HEADERS = ("# ==== {path} ====", "# --- {path} ---", "### file: {path}", "# source: {path}",
                   "# >>> {path}", "# [{path}]")
_WORD_STYLES = ("plain", "sentences", "commas")
_NOUNS = {  # singular nouns: wordings say "the {doc} contains"
    "python": ("Python source", "code listing", "source dump", "program text", "Python code"),
    "prose": ("document", "text", "set of notes", "reference text", "documentation"),
    "csv": ("CSV export", "table", "CSV file", "spreadsheet export"),
    "markdown": ("table", "markdown table", "report"),
    "jsonl": ("JSON Lines file", "JSON data", "JSON export"),
    "json_array": ("JSON array", "JSON data", "JSON export"),
    "log": ("log", "log file", "server log", "log excerpt"),
    "words": ("word list", "text", "stream of words", "jumble of words"),
}
#: Needle formats that look at home in each haystack format.
NEEDLE_FORMATS = {
    "python": ("comment", "assignment", "json"),
    "prose": ("sentence", "kv", "bullet"),
    "csv": ("table", "kv"),
    "markdown": ("table", "bullet"),
    "jsonl": ("json",),
    "json_array": ("json",),
    "log": ("log",),
    "words": ("sentence", "kv", "bullet", "json"),
}


def count_tokens(tokenizer, texts: Sequence[str]) -> list[int]:
    """Tokens of each text encoded alone, without special tokens (through the fast backend when there is one: the
    Python-side wrapping of a batch costs more than the encoding)."""
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
        return [len(encoding) for encoding in encode(list(texts), add_special_tokens=False)]
    return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


class _LineCounts:
    """Token counts of the snapshot's lines under one tokenizer, counted a chunk of lines at a time on first use and
    kept (a fit reads a few hundred lines of a file, not all of it)."""

    _CHUNK = 256

    def __init__(self, tokenizer) -> None:
        self._tokenizer = weakref.ref(tokenizer)
        self._chunks: dict[tuple[int, int], list[int]] = {}

    def __call__(self, file_index: int, line_index: int) -> int:
        key = (file_index, line_index // self._CHUNK)
        if key not in self._chunks:
            start = key[1] * self._CHUNK
            lines = stdlib_files()[file_index].lines[start : start + self._CHUNK]
            self._chunks[key] = count_tokens(self._tokenizer(), lines)
        return self._chunks[key][line_index % self._CHUNK]


_LINE_COUNTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def line_counts(tokenizer) -> _LineCounts:
    """The line counts of ``tokenizer``, shared by every row cut with the same tokenizer object."""
    if tokenizer not in _LINE_COUNTS:
        _LINE_COUNTS[tokenizer] = _LineCounts(tokenizer)
    return _LINE_COUNTS[tokenizer]


class Haystack:
    """One row's filler: its format, its style and the seed its units are drawn from.

    Attributes:
        fmt: one of `ALL_FORMATS`.
        category: the format's category (one of `CATEGORIES`).
        seed: the units' seed.
        table: the records' table (``csv``, ``markdown``, ``jsonl``, ``json_array``), else None.
        log: the log writer (``log``), else None.
        header: the Python file header style (``python``), else "".
        start: (file index, line index) where a backward Python haystack ends (just before that line); None:
            forward from a random file.
    """

    def __init__(self, fmt: str, rng: SampleRandom, *, schema: Schema | None = None,
                 start: tuple[int, int] | None = None) -> None:
        self.fmt = fmt
        self.category = next(name for name, formats in FORMATS.items() if fmt in formats)
        self.seed = rng.below(1 << 62)
        self.table = Table(schema or rng.choice(SCHEMAS), fmt) if fmt in TABLE_FORMATS else None
        self.log = Log(rng.choice(LOG_STYLES), (rng.integer(1, 12), rng.integer(1, 28))) if fmt == "log" else None
        self.header = rng.choice(_PYTHON_HEADERS) if fmt == "python" else ""
        self.word_style = rng.choice(_WORD_STYLES)
        self.start = start
        self.noun = rng.choice(_NOUNS[fmt])

    @property
    def needle_formats(self) -> tuple[str, ...]:
        return NEEDLE_FORMATS[self.fmt]

    def units(self, tokenizer) -> Iterator[tuple[str, int | None]]:
        """(text, tokens or None when not known yet) of every unit, the same ones at every call; each text ends
        with a newline. A backward Python haystack yields its lines nearest first (reverse them after taking)."""
        rng = SampleRandom(self.seed)
        if self.fmt == "python":
            counter = line_counts(tokenizer)
            return self._backward(counter) if self.start else self._forward(rng, counter)
        if self.fmt == "prose":
            return self._prose(rng)
        if self.fmt == "words":
            return self._words(rng)
        if self.fmt == "log":
            return self._log(rng)
        return self._table(rng)

    def header_line(self, path: str) -> str:
        return self.header.format(path=path) + "\n"

    def _forward(self, rng: SampleRandom, counter: _LineCounts) -> Iterator[tuple[str, int | None]]:
        files = stdlib_files()
        first = rng.below(len(files))
        for step in range(len(files)):
            index = (first + step) % len(files)
            if not files[index].lines:
                continue
            yield self.header_line(files[index].path), None
            for position, line in enumerate(files[index].lines):
                if len(line) <= _MAX_LINE_CHARS:
                    yield line, counter(index, position)

    def _backward(self, counter: _LineCounts) -> Iterator[tuple[str, int | None]]:
        files = stdlib_files()
        index, end = self.start
        for _ in range(len(files)):
            for position in range(end - 1, -1, -1):
                if len(files[index].lines[position]) <= _MAX_LINE_CHARS:
                    yield files[index].lines[position], counter(index, position)
            yield self.header_line(files[index].path), None
            index = (index - 1) % len(files)
            end = len(files[index].lines)

    def _prose(self, rng: SampleRandom) -> Iterator[tuple[str, int | None]]:
        paragraphs = prose_paragraphs()
        position = rng.below(len(paragraphs))
        while True:
            pieces = paragraphs[position % len(paragraphs)]
            for k, piece in enumerate(pieces):
                yield piece + ("\n\n" if k == len(pieces) - 1 else "\n"), None
            position += 1

    def word_line(self, words: list[str]) -> str:
        """``words`` as one line of a word haystack, in its style (ends with a newline)."""
        if self.word_style == "sentences":
            return " ".join(words).capitalize() + ".\n"
        if self.word_style == "commas":
            return ", ".join(words) + "\n"
        return " ".join(words) + "\n"

    def _words(self, rng: SampleRandom) -> Iterator[tuple[str, int | None]]:
        words = vocabulary()
        while True:
            yield self.word_line([rng.choice(words) for _ in range(rng.integer(6, 14))]), None

    def _table(self, rng: SampleRandom) -> Iterator[tuple[str, int | None]]:
        for line in self.table.head():
            yield line, None
        while True:
            yield self.table.render(self.table.schema.draw(rng)), None

    def _log(self, rng: SampleRandom) -> Iterator[tuple[str, int | None]]:
        second = rng.integer(0, 20000)
        while True:
            event = rng.choice(LOG_EVENTS)
            second += rng.integer(0, 4)
            yield self.log.render(rng, event, event.draw(rng), second), None


def draw_haystack(rng: SampleRandom, formats: tuple[str, ...], **options) -> Haystack:
    """A haystack of one of ``formats``: a category first (uniformly among those ``formats`` reach), then a format
    of it, so records (five formats) are not drawn five times as often as prose."""
    categories = [name for name in CATEGORIES if any(fmt in formats for fmt in FORMATS[name])]
    category = rng.choice(categories)
    fmt = rng.choice([fmt for fmt in FORMATS[category] if fmt in formats])
    return Haystack(fmt, rng, **options)


#: Units a fit looks past: overshooting units passed over, candidates for a closing swap.
LOOKAHEAD = 256


class UnitSource:
    """A haystack's units with their token counts under one tokenizer, drawn and counted lazily, kept for replays.

    Counts are of each unit encoded alone (no special tokens); the fitter checks the real count of the rendered
    prompt and corrects the budget.
    """

    _BATCH = 256

    def __init__(self, haystack: Haystack, tokenizer) -> None:
        self._iterator = haystack.units(tokenizer)
        self._tokenizer = tokenizer
        self._texts: list[str] = []
        self._tokens: list[int] = []

    def _extend(self) -> bool:
        batch = list(islice(self._iterator, self._BATCH))
        if not batch:
            return False
        counted = iter(count_tokens(self._tokenizer, [text for text, tokens in batch if tokens is None]))
        for text, tokens in batch:
            self._texts.append(text)
            self._tokens.append(next(counted) if tokens is None else tokens)
        return True

    def _count(self, index: int) -> int | None:
        """Tokens of unit ``index`` (drawing more units as needed), None past a finite haystack's end."""
        while index >= len(self._texts):
            if not self._extend():
                return None
        return self._tokens[index]

    def take(self, budget: int, slack: int) -> list[tuple[str, int]]:
        """(text, tokens) of units in haystack order whose token sum is at most ``budget`` and, where the units
        allow, at least ``budget - slack``.

        Units are taken in order; one that would overshoot is passed over (up to `LOOKAHEAD` of them) and later,
        smaller ones are taken instead. If the sum still falls short by more than ``slack``, taken units are
        swapped for later, larger ones until the gap closes (records of ~50-100 tokens cannot meet a tight budget
        otherwise).
        """
        taken, total, index, passed = [], 0, 0, 0
        while budget - total > slack and passed <= LOOKAHEAD:
            tokens = self._count(index)
            if tokens is None:
                break
            if total + tokens <= budget:
                taken.append(index)
                total += tokens
            else:
                passed += 1
            index += 1
        self._close_gap(taken, index, budget - total, slack)
        return [(self._texts[i], self._tokens[i]) for i in taken]

    def _close_gap(self, taken: list[int], first_unused: int, short: int, slack: int) -> None:
        """Swap taken units (among the last `LOOKAHEAD`) for unused, larger ones until the sum falls short of the
        budget by at most ``slack`` or no swap in reach helps; ``taken`` is changed in place."""
        if short <= slack or not taken:
            return
        unused: dict[int, list[int]] = {}
        for index in range(first_unused, first_unused + LOOKAHEAD):
            tokens = self._count(index)
            if tokens is None:
                break
            unused.setdefault(tokens, []).append(index)
        positions = list(range(len(taken) - 1, max(-1, len(taken) - 1 - LOOKAHEAD), -1))
        while short > slack and positions:
            best = None  # (gain, position, size): the largest gain that does not overshoot
            for position in positions:
                size = self._tokens[taken[position]]
                for larger in range(size + min(short, max(unused, default=0) - size), size, -1):
                    if unused.get(larger):
                        if best is None or larger - size > best[0]:
                            best = (larger - size, position, larger)
                        break
                if best is not None and best[0] >= short - slack:
                    break
            if best is None:
                return
            gain, position, larger = best
            taken[position] = unused[larger].pop()
            positions.remove(position)
            short -= gain
