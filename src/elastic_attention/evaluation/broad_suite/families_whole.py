"""Families over the whole context: counting the mentions of something, and aggregating numbers (sum, maximum,
minimum) that are spread from the start of the context to its end. The first item is always far from the question,
the others anywhere.
"""

from __future__ import annotations

from collections.abc import Callable

from elastic_attention.evaluation.broad_suite.assembly import Draft, Needle
from elastic_attention.evaluation.broad_suite.haystacks import ALL_FORMATS, Haystack, draw_haystack
from elastic_attention.evaluation.broad_suite.records import LOG_EVENTS
from elastic_attention.evaluation.broad_suite.values import distinct_values, draw_entity, render_fact
from elastic_attention.evaluation.broad_suite.vocabulary import coined_names, vocabulary
from elastic_attention.evaluation.seeded_random import SampleRandom

_MENTIONS = ("{Entity} was brought up again during the review.", "A message from {entity} arrived late.",
             "Nobody had heard from {entity} for a while.", "The plan was approved by {entity}.",
             "{Entity} asked for more time.", "Later, {entity} sent a short reply.")
_MEASURES = (("payment", "payments"), ("deposit", "deposits"), ("shipment weight", "shipment weights"),
             ("score", "scores"), ("donation", "donations"), ("reading", "readings"))
#: Aggregations: name -> (how questions say it, the function).
OPERATIONS = {"sum": (("sum", "total"), sum), "max": (("maximum", "largest value"), max),
              "min": (("minimum", "smallest value"), min)}


def _where(index: int, rng: SampleRandom) -> tuple[str, float]:
    return ("far" if index == 0 else "anywhere"), rng.fraction()


def _mention_writer(rng: SampleRandom, haystack: Haystack, marker: str) -> tuple[Callable[[], str], str]:
    """(a function writing one line that mentions ``marker`` in the haystack's own style, what the question
    counts)."""
    if haystack.fmt == "words":
        def write() -> str:
            words = [rng.choice(vocabulary()) for _ in range(rng.integer(5, 12))]
            words.insert(rng.below(len(words) + 1), marker.lower())
            return haystack.word_line(words)
        return write, f'occurrences of the word "{marker.lower()}"'
    if haystack.fmt == "python":
        function = f"{marker.lower()}_hook"
        lines = ("    {f}(event)\n", "    result = {f}(self, {n})\n", "{f}(config)\n")
        return lambda: rng.choice(lines).format(f=function, n=rng.integer(1, 9)), f"calls to `{function}`"
    if haystack.fmt == "prose":
        entity = draw_entity(rng, marker)
        capital = entity.text[0].upper() + entity.text[1:]
        return (lambda: rng.choice(_MENTIONS).format(entity=entity.text, Entity=capital) + "\n",
                f"sentences that mention {entity.text}")
    if haystack.fmt == "log":
        event = next(event for event in LOG_EVENTS if event.component == "cache")
        return (lambda: haystack.log.render(rng, event, event.draw(rng) | {"word": marker.lower()},
                                            rng.integer(0, 86399)),
                f'cache misses for keys that start with "{marker.lower()}"')
    schema = haystack.table.schema
    probe = SampleRandom(0)  # which columns hold plain words; the row's own source is not touched
    columns = [column for column in schema.askable
               if not column.numeric and column.draw(probe).replace(" ", "").isalpha()]
    column = rng.choice(columns)
    return (lambda: haystack.table.render(schema.draw(rng) | {column.name: marker}),
            f"{schema.noun} records whose {column.name} is {marker}")


def mention_count(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """2-9 lines that mention a coined name, written in the haystack's style; how many there are is asked."""
    haystack = draw_haystack(rng, ALL_FORMATS)
    marker = coined_names(rng, 1)[0]
    count = rng.integer(2, 9)
    write, items = _mention_writer(rng, haystack, marker)
    needles = [Needle(write(), True, *_where(index, rng)) for index in range(count)]
    return haystack, Draft(needles, {"items": items}, str(count), "number", expect=[(marker, count)],
                           extra={"marker": marker, "count": count})


def value_aggregate(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """3-6 amounts of one measure for one entity and 1-3 for each of one or two others, as facts in the haystack's
    needle formats; the sum, maximum or minimum of the first entity's amounts is asked."""
    haystack = draw_haystack(rng, ALL_FORMATS)
    fmt = rng.choice(haystack.needle_formats)
    measure, measures = rng.choice(_MEASURES)
    operation = rng.choice(tuple(OPERATIONS))
    phrases, function = OPERATIONS[operation]
    count, others = rng.integer(3, 6), rng.integer(1, 2)
    entities = [draw_entity(rng, name) for name in coined_names(rng, 1 + others)]
    other_counts = [rng.integer(1, 3) for _ in range(others)]
    amounts = [int(value) for value in distinct_values(rng, "number", count + sum(other_counts))]
    amounts = [10 + value % 990 for value in amounts]
    needles, expect = [], [(entities[0].coined, count)]
    for index, amount in enumerate(amounts[:count]):
        text = render_fact(rng, fmt, entities[0], measure, str(amount), several=True)
        needles.append(Needle(text, True, *_where(index, rng)))
    position = count
    for entity, number in zip(entities[1:], other_counts):
        for amount in amounts[position : position + number]:
            text = render_fact(rng, fmt, entity, measure, str(amount), several=True)
            needles.append(Needle(text, False, "anywhere", rng.fraction()))
        position += number
        expect.append((entity.coined, number))
    answer = str(function(amounts[:count]))
    fields = {"op": rng.choice(phrases), "measure": measure, "measures": measures, "entity": entities[0].text}
    extra = {"operation": operation, "amounts": amounts[:count], "needle_format": fmt}
    return haystack, Draft(needles, fields, answer, "number", expect=expect, extra=extra)
