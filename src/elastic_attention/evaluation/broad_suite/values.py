"""What the broad suite's needles state: values of several types, the attributes they are values of, the entities
that own them, and a fact ``(entity, attribute, value)`` written in one of several needle formats (a sentence, a
comment, a ``key: value`` line, a JSON object, an assignment, a log line, a table row, a bullet).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from elastic_attention.evaluation.broad_suite.vocabulary import (
    coined_name,
    long_words,
    person_name,
)
from elastic_attention.evaluation.seeded_random import SampleRandom

VALUE_KINDS = ("number", "word", "code", "date", "name", "version", "hexid")

#: Attribute phrases per value kind (singular; :func:`plural` makes the plural).
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "number": ("badge number", "account number", "room number", "serial number", "phone extension",
               "batch number", "locker number", "permit number"),
    "word": ("password", "code word", "call sign", "nickname", "passphrase", "watchword"),
    "code": ("access code", "license key", "tracking code", "voucher code", "reference code", "booking reference"),
    "date": ("launch date", "deadline", "renewal date", "inspection date", "release date", "start date"),
    "name": ("owner", "contact person", "on-call engineer", "reviewer", "team lead", "maintainer"),
    "version": ("firmware version", "release version", "schema version", "client version", "driver version"),
    "hexid": ("commit hash", "build id", "device id", "session id", "checksum"),
}
_PLURALS = {"contact person": "contact people", "passphrase": "passphrases", "owner": "owners"}

#: How entities are named: each holds one coined name, so the entity occurs nowhere else in a context.
_ENTITY_TEMPLATES = ("project {X}", "the {X} team", "warehouse {X}", "client {X}", "server {x}-{n}",
                     "the {X} account", "vessel {X}", "lab {X}", "the {X} branch", "{X} Holdings")

NEEDLE_FORMATS = ("sentence", "comment", "kv", "json", "assignment", "log", "table", "bullet")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


@dataclass(frozen=True)
class Entity:
    """Something a fact is about.

    Attributes:
        text: how it is written (``project Korvath``).
        coined: its coined name (``Korvath``), which occurs in a context only where the entity is mentioned.
    """

    text: str
    coined: str

    @property
    def slug(self) -> str:
        """``PROJECT_KORVATH``: the entity as a constant name."""
        words = [word for word in re.findall(r"[A-Za-z0-9]+", self.text) if word.lower() != "the"]
        return "_".join(words).upper()


def plural(attribute: str) -> str:
    if attribute in _PLURALS:
        return _PLURALS[attribute]
    return attribute + ("es" if attribute.endswith(("s", "sh", "ch", "x")) else "s")


def draw_entity(rng: SampleRandom, coined: str | None = None) -> Entity:
    """An entity from a random template around ``coined`` (a fresh coined name when None)."""
    name = coined or coined_name(rng)
    template = rng.choice(_ENTITY_TEMPLATES)
    text = template.format(X=name, x=name.lower(), n=f"{rng.integer(1, 99):02d}")
    return Entity(text, name)


def draw_value(rng: SampleRandom, kind: str) -> str:
    """A random value of ``kind`` (one of `VALUE_KINDS`), written as a model should copy it."""
    if kind == "number":
        return str(rng.integer(10_000, 9_999_999))
    if kind == "word":
        return rng.choice(long_words())
    if kind == "code":
        letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
        first = "".join(rng.choice(letters) for _ in range(rng.integer(2, 3)))
        last = "".join(rng.choice(letters) for _ in range(2))
        return rng.choice((f"{first}-{rng.integer(1000, 9999)}-{last}", f"{first}{rng.integer(100, 999)}{last}",
                           f"{first.lower()}-{rng.integer(10, 99)}-{last.lower()}{rng.integer(1, 9)}"))
    if kind == "date":
        year, month, day = rng.integer(1995, 2035), rng.integer(1, 12), rng.integer(1, 28)
        return rng.choice((f"{year}-{month:02d}-{day:02d}", f"{day} {_MONTHS[month - 1]} {year}",
                           f"{_MONTHS[month - 1]} {day}, {year}"))
    if kind == "name":
        return person_name(rng)
    if kind == "version":
        return f"{rng.integer(0, 12)}.{rng.integer(0, 40)}.{rng.integer(0, 99)}"
    if kind == "hexid":
        return "".join(rng.choice("0123456789abcdef") for _ in range(rng.choice((8, 10, 12))))
    raise ValueError(f"unknown value kind {kind!r}")


def distinct_values(rng: SampleRandom, kind: str, count: int) -> list[str]:
    values: list[str] = []
    while len(values) < count:
        value = draw_value(rng, kind)
        if value not in values and not any(value in other or other in value for other in values):
            values.append(value)
    return values


def timestamp(rng: SampleRandom) -> str:
    return (f"2024-{rng.integer(1, 12):02d}-{rng.integer(1, 28):02d} "
            f"{rng.integer(0, 23):02d}:{rng.integer(0, 59):02d}:{rng.integer(0, 59):02d}")


def _key(text: str) -> str:
    return "_".join(word for word in re.findall(r"[a-z0-9]+", text.lower()) if word != "the")


def _literal(value: str) -> str:
    return value if re.fullmatch(r"[1-9]\d*", value) else json.dumps(value)


def render_fact(rng: SampleRandom, fmt: str, entity: Entity, attribute: str, value: str, *,
                several: bool = False) -> str:
    """One line stating that ``entity``'s ``attribute`` is ``value``, in needle format ``fmt`` (ends with a newline).

    Args:
        several: the entity has several values of this attribute; sentences then say "one of its ...".
    """
    name, capital = entity.text, entity.text[0].upper() + entity.text[1:]
    if fmt == "sentence":
        if several:
            choices = (f"{value} is among the {plural(attribute)} of {name}.",
                       f"{capital} counts {value} among its {plural(attribute)}.",
                       f"Another {attribute} on record for {name}: {value}.",
                       f"{capital} also has the {attribute} {value}.")
        else:
            choices = (f"The {attribute} of {name} is {value}.", f"{capital}'s {attribute} is {value}.",
                       f"For {name}, the {attribute} is {value}.", f"{capital} uses {value} as its {attribute}.",
                       f"Please note that the {attribute} for {name} is {value}.",
                       f"Records show {value} as the {attribute} of {name}.")
        return rng.choice(choices) + "\n"
    if fmt == "comment":
        return rng.choice((f"# {attribute} for {name}: {value}", f"# NOTE: {name} {attribute} = {value}",
                           f"# {capital} -> {attribute}: {value}", f"# ({name}) {attribute} is {value}")) + "\n"
    if fmt == "kv":
        assigned = f"{_key(name)}.{_key(attribute)} += {value}" if several else \
            f"{_key(name)}.{_key(attribute)} = {value}"
        return rng.choice((f"{capital} {attribute}: {value}", f"{attribute} ({name}): {value}", assigned,
                           f"{attribute} of {name} => {value}")) + "\n"
    if fmt == "json":
        record = rng.choice(({"entity": name, "field": attribute, "value": value},
                             {_key(name): {_key(attribute): value}}, {"name": name, _key(attribute): value}))
        return json.dumps(record) + "\n"
    if fmt == "assignment":
        if several:  # a second plain assignment would overwrite the first
            return f"{entity.slug}_{_key(plural(attribute)).upper()}.append({_literal(value)})\n"
        return f"{entity.slug}_{_key(attribute).upper()} = {_literal(value)}\n"
    if fmt == "log":
        return (f"{timestamp(rng)} {rng.choice(('INFO', 'NOTICE', 'DEBUG'))} "
                f"{rng.choice(('registry', 'inventory', 'config', 'records'))}: "
                f"{attribute} of {name} set to {value}\n")
    if fmt == "table":
        return rng.choice((f"| {name} | {attribute} | {value} |", f"{name},{attribute},{value}")) + "\n"
    if fmt == "bullet":
        return rng.choice((f"- {capital}: {attribute} {value}", f"* {attribute} for {name} - {value}",
                           f"- {attribute}, {name}: {value}")) + "\n"
    raise ValueError(f"unknown needle format {fmt!r}")
