"""Filler text of the synthetic suite: paragraphs (``##`` then 48-160 tokens) that each draw most nouns from one
topic, made of sentences from a small grammar (determiner, adjective, noun, verb, object, prepositional phrases,
adverb), each sentence exactly as many tokens as asked."""

from __future__ import annotations

import itertools

from elastic_attention.errors import InputError
from elastic_attention.evaluation.seeded_random import SampleRandom
from elastic_attention.evaluation.synthetic.words import (
    ADJECTIVES,
    ADVERBS,
    DETERMINERS,
    PARAGRAPH_MARKER,
    PREPOSITIONS,
    SHARED_NOUNS,
    TOPIC_NOUNS,
    VERBS,
)

_PARAGRAPH_MIN_TOKENS = 48
_PARAGRAPH_MAX_TOKENS = 160
SENTENCE_MIN_TOKENS = 6
_SENTENCE_MAX_TOKENS = 15
_TOPIC_NOUN_PROBABILITY = 0.75

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
TOPICS = tuple(TOPIC_NOUNS)


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
    slots = _SLOT_SETS.get(num_tokens - SENTENCE_MIN_TOKENS)
    if slots is None:
        raise InputError(
            f"`num_tokens` must be in [{SENTENCE_MIN_TOKENS}, {_SENTENCE_MAX_TOKENS}], got {num_tokens}"
        )
    chosen = rng.choice(slots)
    nouns = TOPIC_NOUNS[topic if topic is not None else rng.choice(TOPICS)]

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


def filler_sentences(rng: SampleRandom, num_tokens: int, topic: str) -> list[list[str]]:
    """Sentences totalling exactly ``num_tokens`` tokens (0 or at least 6)."""
    if num_tokens == 0:
        return []
    sizes = _partition(rng, num_tokens, SENTENCE_MIN_TOKENS, _SENTENCE_MAX_TOKENS)
    return [filler_sentence(rng, size, topic) for size in sizes]


def filler_paragraph(rng: SampleRandom, num_tokens: int) -> list[list[str]]:
    """One topic paragraph of exactly ``num_tokens`` tokens.

    Args:
        rng: random source.
        num_tokens: paragraph length in tokens, at least 7.

    Returns:
        Segments: ``["##"]`` then the sentences (lists of words).
    """
    if num_tokens < 1 + SENTENCE_MIN_TOKENS:
        raise InputError(f"`num_tokens` of a paragraph must be at least {1 + SENTENCE_MIN_TOKENS}, got {num_tokens}")
    topic = rng.choice(TOPICS)
    return [[PARAGRAPH_MARKER], *filler_sentences(rng, num_tokens - 1, topic)]


def filler_paragraphs(rng: SampleRandom, num_tokens: int) -> list[list[list[str]]]:
    if num_tokens < _PARAGRAPH_MIN_TOKENS:
        return [filler_paragraph(rng, num_tokens)]
    sizes = _partition(rng, num_tokens, _PARAGRAPH_MIN_TOKENS, _PARAGRAPH_MAX_TOKENS)
    return [filler_paragraph(rng, size) for size in sizes]
