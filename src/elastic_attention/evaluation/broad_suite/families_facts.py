"""Families about stated facts: retrieval of one, several or all values, a recent fact, two linked facts, and
values copied along a chain of names. Each ``make`` draws a haystack and a :class:`Draft` from one random source.
"""

from __future__ import annotations

from elastic_attention.evaluation.broad_suite.assembly import Draft, Needle
from elastic_attention.evaluation.broad_suite.haystacks import ALL_FORMATS, Haystack, draw_haystack
from elastic_attention.evaluation.broad_suite.values import (
    ATTRIBUTES,
    VALUE_KINDS,
    distinct_values,
    draw_entity,
    plural,
    render_fact,
)
from elastic_attention.evaluation.broad_suite.vocabulary import coined_names, long_words
from elastic_attention.evaluation.seeded_random import SampleRandom

RELATIONS = ("supplier", "parent organization", "backup site", "partner", "successor", "auditor", "host", "sponsor")
#: Statement styles of a chain outside Python: (first statement with the value, a copy from one name to another).
_CHAIN_STYLES = (
    ("Let {a} be {v}.", "Let {b} be the same as {a}."),
    ("{a} := {v}", "{b} := {a}"),
    ("Store {v} in {a}.", "Copy {a} into {b}."),
    ("set {a} = {v}", "set {b} = {a}"),
    ("{a} is assigned {v}.", "{b} is assigned the value of {a}."),
    ("{a} <- {v}", "{b} <- {a}"),
)


def _fact_setup(rng: SampleRandom, formats: tuple[str, ...] = ALL_FORMATS) -> tuple[Haystack, str, str, str]:
    """A haystack, a needle format for it, a value kind and an attribute of that kind."""
    haystack = draw_haystack(rng, formats)
    kind = rng.choice(VALUE_KINDS)
    return haystack, rng.choice(haystack.needle_formats), kind, rng.choice(ATTRIBUTES[kind])


def _apart(value: str, others: list[str]) -> bool:
    return all(value != other and value not in other and other not in value for other in others)


def _extra(haystack: Haystack, fmt: str, kind: str, **more) -> dict:
    return {"needle_format": fmt, "value_kind": kind, **more}


def fact_single(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """One fact far from the question, and up to two facts of other attributes about other entities."""
    haystack, fmt, kind, attribute = _fact_setup(rng)
    names = coined_names(rng, 3)
    entity, value = draw_entity(rng, names[0]), distinct_values(rng, kind, 1)[0]
    needles = [Needle(render_fact(rng, fmt, entity, attribute, value), True, "far", rng.fraction())]
    distractors: list[str] = []
    for name in names[1 : 1 + rng.integer(0, 2)]:
        other_kind = rng.choice(VALUE_KINDS)
        other_attribute = rng.choice([item for item in ATTRIBUTES[other_kind] if item != attribute])
        other = distinct_values(rng, other_kind, 1)[0]
        if _apart(other, [value, *distractors]):
            needles.append(Needle(render_fact(rng, fmt, draw_entity(rng, name), other_attribute, other), False,
                                  "anywhere", rng.fraction()))
            distractors.append(other)
    expect = [(entity.coined, 1)]
    return haystack, Draft(needles, {"attribute": attribute, "entity": entity.text}, value, "value",
                           expect=expect, distractors=distractors, extra=_extra(haystack, fmt, kind))


def fact_multikey(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """3-8 entities with a value each of one attribute; the asked one far, the others anywhere."""
    haystack, fmt, kind, attribute = _fact_setup(rng)
    count = rng.integer(3, 8)
    entities = [draw_entity(rng, name) for name in coined_names(rng, count)]
    values = distinct_values(rng, kind, count)
    needles = [Needle(render_fact(rng, fmt, entity, attribute, value), index == 0,
                      "far" if index == 0 else "anywhere", rng.fraction())
               for index, (entity, value) in enumerate(zip(entities, values))]
    fields = {"attribute": attribute, "attributes": plural(attribute), "entity": entities[0].text}
    return haystack, Draft(needles, fields, values[0], "value", expect=[(e.coined, 1) for e in entities],
                           distractors=values[1:], extra=_extra(haystack, fmt, kind, keys=count))


def fact_multivalue(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """2-4 values of one attribute of one entity (the first far, the others anywhere), and one or two other
    entities with a value of the same attribute."""
    haystack, fmt, kind, attribute = _fact_setup(rng)
    count, others = rng.integer(2, 4), rng.integer(1, 2)
    entities = [draw_entity(rng, name) for name in coined_names(rng, 1 + others)]
    values = distinct_values(rng, kind, count + others)
    needles = [Needle(render_fact(rng, fmt, entities[0], attribute, value, several=True), True,
                      "far" if index == 0 else "anywhere", rng.fraction())
               for index, value in enumerate(values[:count])]
    needles += [Needle(render_fact(rng, fmt, entity, attribute, value, several=True), False, "anywhere",
                       rng.fraction()) for entity, value in zip(entities[1:], values[count:])]
    fields = {"attribute": attribute, "attributes": plural(attribute), "entity": entities[0].text,
              "count": str(count)}
    expect = [(entities[0].coined, count)] + [(entity.coined, 1) for entity in entities[1:]]
    return haystack, Draft(needles, fields, ", ".join(values[:count]), "values", max_new_tokens=24 * count,
                           expect=expect, distractors=values[count:],
                           extra=_extra(haystack, fmt, kind, values=values[:count]))


def fact_recent(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """The asked fact 40-450 tokens before the end of the context; one to three facts of the same attribute about
    other entities far before it."""
    haystack, fmt, kind, attribute = _fact_setup(rng)
    others = rng.integer(1, 3)
    entities = [draw_entity(rng, name) for name in coined_names(rng, 1 + others)]
    values = distinct_values(rng, kind, 1 + others)
    needles = [Needle(render_fact(rng, fmt, entities[0], attribute, values[0]), True, "end",
                      from_end=rng.integer(40, 450))]
    needles += [Needle(render_fact(rng, fmt, entity, attribute, value), False, "far", rng.fraction())
                for entity, value in zip(entities[1:], values[1:])]
    return haystack, Draft(needles, {"attribute": attribute, "entity": entities[0].text}, values[0], "value",
                           expect=[(entity.coined, 1) for entity in entities], distractors=values[1:],
                           extra=_extra(haystack, fmt, kind))


def two_hop(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """``entity`` -> (relation) -> ``middle`` -> (attribute) -> value; a second middle item with its own value of
    the attribute, linked to another entity, as the distractor."""
    haystack, fmt, kind, attribute = _fact_setup(rng)
    relation = rng.choice(RELATIONS)
    entity, middle, other_middle, other = (draw_entity(rng, name) for name in coined_names(rng, 4))
    values = distinct_values(rng, kind, 2)
    needles = [
        Needle(render_fact(rng, fmt, entity, relation, middle.text), True, "far", rng.fraction()),
        Needle(render_fact(rng, fmt, middle, attribute, values[0]), True, "anywhere", rng.fraction()),
        Needle(render_fact(rng, fmt, other_middle, attribute, values[1]), False, "anywhere", rng.fraction()),
        Needle(render_fact(rng, fmt, other, relation, other_middle.text), False, "anywhere", rng.fraction()),
    ]
    fields = {"attribute": attribute, "relation": relation, "entity": entity.text}
    expect = [(entity.coined, 1), (middle.coined, 2), (other_middle.coined, 2), (other.coined, 1)]
    return haystack, Draft(needles, fields, values[0], "value", expect=expect, distractors=values[1:],
                           extra=_extra(haystack, fmt, kind, relation=relation, middle=middle.text))


def _chain_names(rng: SampleRandom, haystack: Haystack, count: int) -> tuple[list[str], list[str]]:
    """(names as written, their coined parts): ``limit_korvath`` in Python, ``KORVATH`` elsewhere."""
    coined = coined_names(rng, count)
    if haystack.fmt == "python":
        return [f"{rng.choice(long_words())}_{name.lower()}" for name in coined], coined
    return [name.upper() for name in coined], coined


def chain_tracking(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """A chain of 2-4 copies from a literal number (every statement far, in order) and a shorter distractor
    chain; the value of the main chain's last name is asked."""
    haystack = draw_haystack(rng, ALL_FORMATS)
    hops, other_hops = rng.integer(2, 4), rng.integer(1, 2)
    names, coined = _chain_names(rng, haystack, hops + 1 + other_hops + 1)
    values = distinct_values(rng, "number", 2)
    first, copy = ("{a} = {v}", "{b} = {a}") if haystack.fmt == "python" else rng.choice(_CHAIN_STYLES)
    needles, expect = [], []
    for chain, value, evidence in ((names[: hops + 1], values[0], True), (names[hops + 1 :], values[1], False)):
        draws = sorted(rng.fraction() for _ in chain)
        lines = [first.format(a=chain[0], v=value)]
        lines += [copy.format(a=chain[k - 1], b=chain[k]) for k in range(1, len(chain))]
        needles += [Needle(line + "\n", evidence, "far", draw) for line, draw in zip(lines, draws)]
    for index, name in enumerate(coined):
        last = index in (hops, len(coined) - 1)
        expect.append((name, 1 if last else 2))
    return haystack, Draft(needles, {"name": names[hops]}, values[0], "value", expect=expect,
                           distractors=[values[1]], extra={"hops": hops, "chain": names[: hops + 1],
                                                           "statement_style": first})
