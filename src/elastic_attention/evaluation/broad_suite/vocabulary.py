"""The words the broad suite writes with: a word vocabulary taken from the snapshot's docstrings
(:func:`~elastic_attention.evaluation.broad_suite.snapshot.prose_paragraphs`), coined names that occur in no
haystack, and small lists of people's names and cities.
"""

from __future__ import annotations

import functools
import re
from collections import Counter

from elastic_attention.evaluation.broad_suite.snapshot import prose_paragraphs
from elastic_attention.evaluation.seeded_random import SampleRandom

_WORD = re.compile(r"^[a-z]{3,10}$")

FIRST_NAMES = (
    "Amara", "Bjorn", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiroshi", "Ines", "Jonas", "Kavya", "Liam",
    "Mei", "Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Sanjay", "Tova", "Ugo", "Valeria", "Wen", "Ximena",
    "Yusuf", "Zofia", "Aurelio", "Beatriz", "Cormac", "Dalia", "Emeka", "Freya", "Gideon", "Hana", "Ivo", "Jelena",
)
LAST_NAMES = (
    "Abernathy", "Bergstrom", "Castellano", "Dubois", "Eriksen", "Fontaine", "Gallagher", "Hoffmann", "Iwasaki",
    "Jovanovic", "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov", "Quintero", "Rasmussen",
    "Salazar", "Takahashi", "Underwood", "Varga", "Whitfield", "Yilmaz", "Zimmermann", "Achterberg", "Brennan",
    "Ferreira", "Haddad", "Lombardi", "Mbeki", "Novak", "Ortega", "Pereira", "Sorensen", "Tanaka",
)
CITIES = (
    "Lisbon", "Oslo", "Nairobi", "Montreal", "Kyoto", "Valparaiso", "Tbilisi", "Adelaide", "Porto", "Gdansk",
    "Cusco", "Accra", "Bergen", "Hanoi", "Marseille", "Quito", "Tallinn", "Dakar", "Sapporo", "Windhoek",
    "Ljubljana", "Halifax", "Cebu", "Bilbao", "Tromso", "Mombasa", "Leipzig", "Hobart", "Cordoba", "Tampere",
)
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "st",
           "tr", "sh", "th", "pl", "qu")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
_CODAS = ("", "", "n", "r", "l", "s", "x", "th", "m")


@functools.cache
def vocabulary() -> tuple[str, ...]:
    """Lowercase words of 3-10 letters used at least three times in the docstrings, most frequent first."""
    counts = Counter(
        word for paragraph in prose_paragraphs() for unit in paragraph
        for word in re.findall(r"[A-Za-z]+", unit) if _WORD.match(word)
    )
    return tuple(word for word, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])) if count >= 3)


@functools.cache
def _vocabulary_set() -> frozenset[str]:
    return frozenset(vocabulary())


@functools.cache
def long_words() -> tuple[str, ...]:
    """Vocabulary words of 5-9 letters (values, rule inputs): long enough to be distinct, short enough to copy."""
    return tuple(word for word in vocabulary() if 5 <= len(word) <= 9)


def coined_name(rng: SampleRandom, syllables: int | None = None) -> str:
    """A capitalized made-up word of 2-3 syllables (``Korvath``): it names things no haystack mentions."""
    count = syllables or rng.integer(2, 3)
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(count)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def coined_names(rng: SampleRandom, count: int) -> list[str]:
    """``count`` distinct coined names, none a prefix of another (so counting one never counts another)."""
    names: list[str] = []
    while len(names) < count:
        name = coined_name(rng)
        if len(name) >= 5 and not any(name.lower().startswith(other.lower()) or other.lower().startswith(
                name.lower()) for other in names) and name.lower() not in _vocabulary_set():
            names.append(name)
    return names


def person_name(rng: SampleRandom) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
