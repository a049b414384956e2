"""Synthetic long-context tasks: sparsity-sensitive retrieval and sparsity-robust local tasks.

Every sample is a :class:`TaskRow`. Its prompt is ``instruction`` (a fixed task-specific sentence), the long
``context``, then ``question`` (a task-specific format), so a router that pools only the first and last 100 prompt
tokens can tell the task apart. Every word is one token of the suite tokenizer
(:mod:`elastic_attention.evaluation.vocabulary`).

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
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from elastic_attention.errors import InputError
from elastic_attention.evaluation.vocabulary import (
    ADJECTIVES,
    ADVERBS,
    CHAT_PROMPT_OVERHEAD_TOKENS,
    COLOR_WORDS,
    DETERMINERS,
    KEY_TOKENS,
    NEEDLE_MARKER,
    NOTE_MARKER,
    NUM_NUMBERS,
    PARAGRAPH_MARKER,
    PREPOSITIONS,
    SEQUENCE_MARKER,
    SHARED_NOUNS,
    TOPIC_NOUNS,
    VALUE_TOKENS,
    VARIABLE_MARKER,
    VARIABLE_TOKENS,
    VERBS,
)

__all__ = [
    "FINAL_PARAGRAPH_MAX_TOKENS",
    "INSTRUCTIONS",
    "LENGTH_TOLERANCE_TOKENS",
    "ROBUST_TASKS",
    "SENSITIVE_TASKS",
    "TASKS",
    "SampleRandom",
    "TaskRow",
    "count_question",
    "filler_paragraph",
    "filler_sentence",
    "generate",
    "needle_multikey",
    "needle_multivalue",
    "needle_single",
    "local_count",
    "local_pattern",
    "local_recall",
    "normalize_answer",
    "pattern_question",
    "prompt_tokens",
    "sample_seed",
    "score",
    "variable_tracking",
]

T = TypeVar("T")

#: A rendered prompt has exactly the requested number of tokens.
LENGTH_TOLERANCE_TOKENS = 0
#: Upper bound on the last paragraph of a robust task, in tokens (its evidence is always in the last 300 tokens).
FINAL_PARAGRAPH_MAX_TOKENS = 240
_FINAL_PARAGRAPH_MIN_TOKENS = 64
_PARAGRAPH_MIN_TOKENS = 48
_PARAGRAPH_MAX_TOKENS = 160
_SENTENCE_MIN_TOKENS = 6
_SENTENCE_MAX_TOKENS = 15
_TOPIC_NOUN_PROBABILITY = 0.75

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


@dataclass(frozen=True)
class TaskRow:
    """One sample of the suite.

    Attributes:
        context: the long text; paragraphs separated by newlines, words by single spaces.
        question: the task-specific question that ends the prompt.
        answer: the exact expected answer, words separated by single spaces.
        task: the task name, a key of :data:`TASKS`.
        instruction: the fixed task-specific sentence that starts the prompt.
        metadata: ``length`` (rendered prompt tokens), ``seed`` (the sample seed), ``context_tokens``,
            ``evidence_offsets`` (token offsets in the context of the evidence the answer needs),
            ``depths`` (those offsets divided by ``context_tokens``) and task-specific fields.
    """

    context: str
    question: str
    answer: str
    task: str
    instruction: str
    metadata: dict[str, Any]

    @property
    def prompt(self) -> str:
        """The user prompt: instruction, context and question separated by newlines."""
        return f"{self.instruction}\n{self.context}\n{self.question}"


class SampleRandom:
    """A seeded random source whose draws depend only on the seed, not on the Python version.

    Only ``random.Random.getrandbits`` is used (its Mersenne Twister stream for an integer seed has been fixed since
    Python 3.2); integers are drawn by rejection sampling, exactly as CPython does today, but without relying on it.

    Args:
        seed: a non-negative integer.
    """

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def below(self, bound: int) -> int:
        """A uniform integer in ``[0, bound)``; ``bound`` must be positive."""
        bits = bound.bit_length()
        while True:
            draw = self._random.getrandbits(bits)
            if draw < bound:
                return draw

    def integer(self, low: int, high: int) -> int:
        """A uniform integer in ``[low, high]`` (both inclusive)."""
        return low + self.below(high - low + 1)

    def fraction(self) -> float:
        """A uniform float in ``[0, 1)`` with 53 random bits."""
        return self._random.getrandbits(53) / float(1 << 53)

    def choice(self, items: Sequence[T]) -> T:
        """A uniformly chosen element of a non-empty sequence."""
        return items[self.below(len(items))]

    def shuffle(self, items: list[Any]) -> None:
        """Shuffle ``items`` in place (Fisher-Yates)."""
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]

    def sample(self, items: Sequence[T], count: int, exclude: Iterable[T] = ()) -> list[T]:
        """``count`` distinct elements of ``items`` not in ``exclude``, in random order."""
        excluded = set(exclude)
        pool = [item for item in items if item not in excluded]
        if count > len(pool):
            raise InputError(f"cannot draw {count} distinct items from a pool of {len(pool)}")
        for i in range(count):
            j = i + self.below(len(pool) - i)
            pool[i], pool[j] = pool[j], pool[i]
        return pool[:count]


def sample_seed(task: str, length: int, seed: int, index: int) -> int:
    """The seed of sample ``index`` of ``generate(task, length, seed, n)``.

    Args:
        task: task name.
        length: requested rendered prompt length in tokens.
        seed: the caller's seed (any integer).
        index: sample index, ``0 <= index < n``.

    Returns:
        A 64-bit non-negative integer: the first 8 bytes (big endian) of SHA-256 of ``"{task}|{length}|{seed}|{index}"``.
    """
    digest = hashlib.sha256(f"{task}|{length}|{seed}|{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def prompt_tokens(instruction: str, question: str) -> int:
    """Tokens a rendered prompt spends outside the context (chat markers, instruction, question)."""
    return CHAT_PROMPT_OVERHEAD_TOKENS + len(instruction.split()) + len(question.split())


# ----------------------------------------------------------------------------------------------------------------
# Filler grammar
# ----------------------------------------------------------------------------------------------------------------

# Optional sentence slots and the tokens each adds to the 6-token core "DET NOUN VERB DET NOUN .".
_SLOT_TOKENS = {"subject_adjective": 1, "object_adjective": 1, "adverb": 1, "place": 3, "second_place": 3}


def _slot_sets_by_extra_tokens() -> dict[int, list[frozenset[str]]]:
    table: dict[int, list[frozenset[str]]] = {}
    names = list(_SLOT_TOKENS)
    for size in range(len(names) + 1):
        for combination in itertools.combinations(names, size):
            if "second_place" in combination and "place" not in combination:
                continue
            extra = sum(_SLOT_TOKENS[name] for name in combination)
            table.setdefault(extra, []).append(frozenset(combination))
    return table


_SLOT_SETS = _slot_sets_by_extra_tokens()
_TOPICS = tuple(TOPIC_NOUNS)


def filler_sentence(rng: SampleRandom, num_tokens: int, topic: str | None = None) -> list[str]:
    """One grammatical filler sentence of exactly ``num_tokens`` tokens, ending with ``.``.

    Args:
        rng: random source.
        num_tokens: sentence length in tokens, 6 to 15.
        topic: a key of ``TOPIC_NOUNS`` most nouns come from; ``None`` draws one.

    Returns:
        The sentence as a list of ``num_tokens`` words.

    Raises:
        InputError: if ``num_tokens`` is outside 6-15.
    """
    slots = _SLOT_SETS.get(num_tokens - _SENTENCE_MIN_TOKENS)
    if slots is None:
        raise InputError(
            f"`num_tokens` must be in [{_SENTENCE_MIN_TOKENS}, {_SENTENCE_MAX_TOKENS}], got {num_tokens}"
        )
    chosen = rng.choice(slots)
    nouns = TOPIC_NOUNS[topic if topic is not None else rng.choice(_TOPICS)]

    def noun() -> str:
        return rng.choice(nouns) if rng.fraction() < _TOPIC_NOUN_PROBABILITY else rng.choice(SHARED_NOUNS)

    words = [rng.choice(DETERMINERS)]
    if "subject_adjective" in chosen:
        words.append(rng.choice(ADJECTIVES))
    words += [noun(), rng.choice(VERBS), rng.choice(DETERMINERS)]
    if "object_adjective" in chosen:
        words.append(rng.choice(ADJECTIVES))
    words.append(noun())
    for slot in ("place", "second_place"):
        if slot in chosen:
            words += [rng.choice(PREPOSITIONS), rng.choice(DETERMINERS), noun()]
    if "adverb" in chosen:
        words.append(rng.choice(ADVERBS))
    words.append(".")
    return words


def _partition(rng: SampleRandom, total: int, low: int, high: int) -> list[int]:
    """Split ``total`` into random parts in ``[low, high]`` (needs ``total >= low`` and ``high >= 2 * low - 1``)."""
    parts = []
    while total > high:
        part = rng.integer(low, min(high, total - low))
        parts.append(part)
        total -= part
    parts.append(total)
    return parts


def _filler_sentences(rng: SampleRandom, num_tokens: int, topic: str) -> list[list[str]]:
    """Sentences totalling exactly ``num_tokens`` tokens (0 or at least 6)."""
    if num_tokens == 0:
        return []
    sizes = _partition(rng, num_tokens, _SENTENCE_MIN_TOKENS, _SENTENCE_MAX_TOKENS)
    return [filler_sentence(rng, size, topic) for size in sizes]


def filler_paragraph(rng: SampleRandom, num_tokens: int) -> list[list[str]]:
    """One topic paragraph of exactly ``num_tokens`` tokens.

    Args:
        rng: random source.
        num_tokens: paragraph length in tokens, at least 7.

    Returns:
        Segments: ``["##"]`` then the sentences (lists of words).
    """
    if num_tokens < 1 + _SENTENCE_MIN_TOKENS:
        raise InputError(f"`num_tokens` of a paragraph must be at least {1 + _SENTENCE_MIN_TOKENS}, got {num_tokens}")
    topic = rng.choice(_TOPICS)
    return [[PARAGRAPH_MARKER], *_filler_sentences(rng, num_tokens - 1, topic)]


def _filler_paragraphs(rng: SampleRandom, num_tokens: int) -> list[list[list[str]]]:
    if num_tokens < _PARAGRAPH_MIN_TOKENS:
        return [filler_paragraph(rng, num_tokens)]
    sizes = _partition(rng, num_tokens, _PARAGRAPH_MIN_TOKENS, _PARAGRAPH_MAX_TOKENS)
    return [filler_paragraph(rng, size) for size in sizes]


# ----------------------------------------------------------------------------------------------------------------
# Context assembly
# ----------------------------------------------------------------------------------------------------------------

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


def _depth(rng: SampleRandom, depth: float | None) -> float:
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


def _sensitive_context(
    rng: SampleRandom, task: str, length: int, instruction: str, question: str, inserts: list[tuple[float, list[str]]]
) -> tuple[str, dict[str, Any]]:
    """Filler with evidence inserts at their depths; returns the context and its length metadata."""
    evidence_tokens = sum(len(words) for _, words in inserts)
    budget = _context_budget(task, length, instruction, question, evidence_tokens + 1 + _SENTENCE_MIN_TOKENS)
    paragraphs = _tagged(_filler_paragraphs(rng, budget - evidence_tokens))
    _insert_at_depths(paragraphs, inserts)
    context, total, offsets = _render(paragraphs, len(inserts))
    return context, {"context_tokens": total, "offsets": offsets}


def _robust_context(
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
    far_minimum = distractor_tokens + 1 + _SENTENCE_MIN_TOKENS
    budget = _context_budget(task, length, instruction, question, far_minimum + 1 + local_tokens)
    final_high = min(FINAL_PARAGRAPH_MAX_TOKENS, budget - far_minimum)
    if final_high < 1 + local_tokens:
        raise InputError(f"the local evidence of task {task!r} ({local_tokens} tokens) does not fit its last paragraph")
    filler_high = final_high - 1 - local_tokens
    filler_low = max(_SENTENCE_MIN_TOKENS, _FINAL_PARAGRAPH_MIN_TOKENS - 1 - local_tokens)
    if filler_high < _SENTENCE_MIN_TOKENS:
        final_filler = 0
    else:
        final_filler = rng.integer(min(filler_low, filler_high), filler_high)
    final_tokens = 1 + local_tokens + final_filler

    paragraphs = _tagged(_filler_paragraphs(rng, budget - final_tokens - distractor_tokens))
    _insert_at_depths(paragraphs, [(rng.fraction(), words) for words in distractors], first_tag=len(local_segments))

    sentences = _filler_sentences(rng, final_filler, rng.choice(_TOPICS))
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


def _row(
    task: str,
    length: int,
    seed: int,
    instruction: str,
    question: str,
    answer: str,
    context: str,
    layout: dict[str, Any],
    extra: dict[str, Any],
) -> TaskRow:
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
    return TaskRow(context, question, answer, task, instruction, metadata)


def _needles(keys: Sequence[str], values: Sequence[str]) -> list[list[str]]:
    return [[NEEDLE_MARKER, key, value, "."] for key, value in zip(keys, values, strict=True)]


def _require_count(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"`{name}` must be an integer in [{low}, {high}], got {value!r}")


# ----------------------------------------------------------------------------------------------------------------
# Sensitive tasks
# ----------------------------------------------------------------------------------------------------------------


def needle_single(length: int, seed: int, *, depth: float | None = None) -> TaskRow:
    """One key/value needle in filler; the question asks the key's value.

    Args:
        length: rendered prompt length in tokens (at least about 50).
        seed: sample seed.
        depth: needle depth in [0, 1]; ``None`` draws it uniformly.

    Returns:
        A row with answer ``"v42"``; ``metadata["key"]``.
    """
    rng = SampleRandom(seed)
    key, value = rng.choice(KEY_TOKENS), rng.choice(VALUE_TOKENS)
    instruction = INSTRUCTIONS["needle_single"]
    question = f"question : what is the value of {key} ?"
    inserts = [(_depth(rng, depth), [NEEDLE_MARKER, key, value, "."])]
    context, layout = _sensitive_context(rng, "needle_single", length, instruction, question, inserts)
    return _row("needle_single", length, seed, instruction, question, value, context, layout, {"key": key})


def needle_multikey(length: int, seed: int, *, depth: float | None = None, num_keys: int = 4) -> TaskRow:
    """``num_keys`` needles with distinct keys and values; one key is asked.

    Args:
        length: rendered prompt length in tokens.
        seed: sample seed.
        depth: depth of the asked needle in [0, 1]; ``None`` draws it uniformly. Other needles are uniform.
        num_keys: number of needles, 2 to 64.

    Returns:
        A row with the asked key's value as answer; ``metadata["key"]``, ``metadata["keys"]`` (all, in insertion
        order of the list, the asked one first).
    """
    _require_count("num_keys", num_keys, 2, 64)
    rng = SampleRandom(seed)
    keys = rng.sample(KEY_TOKENS, num_keys)
    values = rng.sample(VALUE_TOKENS, num_keys)
    instruction = INSTRUCTIONS["needle_multikey"]
    question = f"question : among all hidden keys , what is the value of {keys[0]} ?"
    depths = [_depth(rng, depth)] + [rng.fraction() for _ in keys[1:]]
    inserts = list(zip(depths, _needles(keys, values), strict=True))
    context, layout = _sensitive_context(rng, "needle_multikey", length, instruction, question, inserts)
    layout["distractor_offsets"] = layout["offsets"][1:]
    layout["offsets"] = layout["offsets"][:1]
    extra = {"key": keys[0], "keys": keys}
    return _row("needle_multikey", length, seed, instruction, question, values[0], context, layout, extra)


def needle_multivalue(
    length: int,
    seed: int,
    *,
    depths: Sequence[float] | None = None,
    num_values: int = 2,
    num_distractors: int = 2,
) -> TaskRow:
    """One key with ``num_values`` values at different depths, plus distractor needles of other keys.

    Args:
        length: rendered prompt length in tokens.
        seed: sample seed.
        depths: ``num_values`` depths in [0, 1] (sorted before use); ``None`` draws them uniformly.
        num_values: values of the asked key, 2 to 16.
        num_distractors: needles of other keys, 0 to 32, at uniform depths.

    Returns:
        A row whose answer lists the key's values in order of appearance (``"v3 v91 v40 v7"``).
    """
    _require_count("num_values", num_values, 2, 16)
    _require_count("num_distractors", num_distractors, 0, 32)
    rng = SampleRandom(seed)
    keys = rng.sample(KEY_TOKENS, 1 + num_distractors)
    values = rng.sample(VALUE_TOKENS, num_values + num_distractors)
    if depths is None:
        needle_depths = sorted(rng.fraction() for _ in range(num_values))
    else:
        if len(depths) != num_values:
            raise InputError(f"`depths` must have `num_values` ({num_values}) entries, got {len(depths)}")
        needle_depths = sorted(_depth(rng, d) for d in depths)
    instruction = INSTRUCTIONS["needle_multivalue"]
    question = f"question : list all values of {keys[0]} in order ?"
    asked = _needles([keys[0]] * num_values, values[:num_values])
    inserts = list(zip(needle_depths, asked, strict=True))
    inserts += [(rng.fraction(), words) for words in _needles(keys[1:], values[num_values:])]
    context, layout = _sensitive_context(rng, "needle_multivalue", length, instruction, question, inserts)
    layout["distractor_offsets"] = layout["offsets"][num_values:]
    layout["offsets"] = layout["offsets"][:num_values]
    answer = " ".join(values[:num_values])
    return _row("needle_multivalue", length, seed, instruction, question, answer, context, layout, {"key": keys[0]})


def variable_tracking(length: int, seed: int, *, num_chains: int = 2, num_hops: int = 2) -> TaskRow:
    """Chains of variable assignments spread over the context; list the variables holding the asked value.

    Chain ``c`` is ``VAR a = v .``, ``VAR b = a .``, ``VAR c = b .`` ... in increasing depth, so every variable of
    the chain ends up holding ``v``. Chains are interleaved at random depths.

    Args:
        length: rendered prompt length in tokens.
        seed: sample seed.
        num_chains: chains, 1 to 8 (one is asked; the others are distractors with other values).
        num_hops: variables per chain, 1 to 12.

    Returns:
        A row whose answer is the asked chain's variables in order of assignment (``"x3 x8 x51 x20"``);
        ``metadata["value"]`` and ``metadata["chains"]`` (the variables of every chain, the asked one first).
    """
    _require_count("num_chains", num_chains, 1, 8)
    _require_count("num_hops", num_hops, 1, 12)
    rng = SampleRandom(seed)
    variables = rng.sample(VARIABLE_TOKENS, num_chains * num_hops)
    values = rng.sample(VALUE_TOKENS, num_chains)
    chains = [variables[c * num_hops : (c + 1) * num_hops] for c in range(num_chains)]
    inserts: list[tuple[float, list[str]]] = []
    for chain, value in zip(chains, values, strict=True):
        sources = [value, *chain[:-1]]
        chain_depths = sorted(rng.fraction() for _ in chain)
        for depth, target, source in zip(chain_depths, chain, sources, strict=True):
            inserts.append((depth, [VARIABLE_MARKER, target, "=", source, "."]))
    instruction = INSTRUCTIONS["variable_tracking"]
    question = f"question : which variables hold the value {values[0]} ?"
    context, layout = _sensitive_context(rng, "variable_tracking", length, instruction, question, inserts)
    layout["distractor_offsets"] = layout["offsets"][num_hops:]
    layout["offsets"] = layout["offsets"][:num_hops]
    answer = " ".join(chains[0])
    extra = {"value": values[0], "chains": chains}
    return _row("variable_tracking", length, seed, instruction, question, answer, context, layout, extra)


# ----------------------------------------------------------------------------------------------------------------
# Robust tasks
# ----------------------------------------------------------------------------------------------------------------


def _distractor_needles(
    rng: SampleRandom, count: int, used_keys: Sequence[str], used_values: Sequence[str]
) -> list[list[str]]:
    _require_count("num_distractors", count, 0, 32)
    keys = rng.sample(KEY_TOKENS, count, exclude=used_keys)
    values = rng.sample(VALUE_TOKENS, count, exclude=used_values)
    return _needles(keys, values)


def local_recall(length: int, seed: int, *, num_distractors: int = 2) -> TaskRow:
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
    context, layout = _robust_context(rng, "local_recall", length, instruction, question, local, distractors)
    return _row("local_recall", length, seed, instruction, question, value, context, layout, {"key": key})


def pattern_question(num_items: int) -> str:
    """The question of local_pattern."""
    return f"question : what are the next {num_items} items of the sequence ?"


def count_question(color: str) -> str:
    """The question of local_count."""
    return f"question : how many times does the color {color} appear in the last paragraph ?"


def local_pattern(
    length: int, seed: int, *, num_items: int = 1, period: int | None = None, num_distractors: int = 2
) -> TaskRow:
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
    _require_count("num_items", num_items, 1, 8)
    rng = SampleRandom(seed)
    if period is None:
        period = rng.integer(2, 4)
    _require_count("period", period, 2, 4)
    cycle = rng.sample(VALUE_TOKENS, period)
    shown = rng.integer(2 * period, 4 * period)
    items = [cycle[i % period] for i in range(shown)]
    answer = " ".join(cycle[(shown + j) % period] for j in range(num_items))
    distractors = _distractor_needles(rng, num_distractors, [], cycle)
    instruction = INSTRUCTIONS["local_pattern"]
    question = pattern_question(num_items)
    local = [[SEQUENCE_MARKER, ":", *items, "."]]
    context, layout = _robust_context(rng, "local_pattern", length, instruction, question, local, distractors)
    return _row("local_pattern", length, seed, instruction, question, answer, context, layout, {"cycle": cycle})


def local_count(
    length: int, seed: int, *, max_count: int = 4, num_other_colors: int = 2, num_distractors: int = 2
) -> TaskRow:
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
    _require_count("max_count", max_count, 1, min(12, NUM_NUMBERS - 1))
    _require_count("num_other_colors", num_other_colors, 0, 3)
    rng = SampleRandom(seed)
    colors = rng.sample(COLOR_WORDS, 1 + num_other_colors)
    counts = {color: rng.integer(1, max_count) for color in colors}
    local = [["there", "is", "a", color, rng.choice(SHARED_NOUNS), "."] for color in colors for _ in range(counts[color])]
    rng.shuffle(local)
    distractors = _distractor_needles(rng, num_distractors, [], [])
    instruction = INSTRUCTIONS["local_count"]
    question = count_question(colors[0])
    context, layout = _robust_context(rng, "local_count", length, instruction, question, local, distractors)
    layout["offsets"] = [offset for offset, words in zip(layout["offsets"], local, strict=True) if words[3] == colors[0]]
    answer = str(counts[colors[0]])
    extra = {"color": colors[0], "counts": counts}
    return _row("local_count", length, seed, instruction, question, answer, context, layout, extra)


# ----------------------------------------------------------------------------------------------------------------
# Registry, generation, scoring
# ----------------------------------------------------------------------------------------------------------------

#: Task name -> generator ``(length, seed, **options) -> TaskRow``.
TASKS: dict[str, Callable[..., TaskRow]] = {
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


def generate(task: str, length: int, seed: int, n: int, **options: Any) -> list[TaskRow]:
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


def score(prediction: str, row: TaskRow) -> bool:
    """Exact match of a prediction against the row's answer, after whitespace normalization only.

    Args:
        prediction: the decoded model answer (special tokens already removed).
        row: the row it answers.

    Returns:
        True when the normalized strings are equal.
    """
    return normalize_answer(prediction) == normalize_answer(row.answer)
