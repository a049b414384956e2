"""Families over structured haystacks: key-value lookup in JSON records, in tables (CSV, markdown) and in logs, and
the last record of a table or log. The asked record is written by the haystack's own table or log writer, so it
looks like every other record; only its key is unique.
"""

from __future__ import annotations

import re

from elastic_attention.evaluation.broad_suite.assembly import Draft, Needle
from elastic_attention.evaluation.broad_suite.haystacks import Haystack, draw_haystack
from elastic_attention.evaluation.broad_suite.records import ASKABLE_EVENTS, TABLE_FORMATS, LogEvent
from elastic_attention.evaluation.seeded_random import SampleRandom


def _subject_field(event: LogEvent) -> str:
    """The slot that identifies one line of ``event`` (``rid`` in ``request {rid}``)."""
    return re.search(r"\{(\w+)\}", event.subject).group(1)


def _table_lookup(rng: SampleRandom, formats: tuple[str, ...]) -> tuple[Haystack, Draft]:
    haystack = draw_haystack(rng, formats)
    schema = haystack.table.schema
    record = schema.draw(rng)
    column = rng.choice(schema.askable)
    key = record[schema.key.name]
    needle = Needle(haystack.table.render(record), True, "far", rng.fraction())
    fields = {"noun": schema.noun, "key_column": schema.key.name, "key": key, "column": column.name}
    extra = {"schema": schema.name, "column": column.name, "key": key}
    return haystack, Draft([needle], fields, record[column.name], "value", expect=[(key, 1)], extra=extra)


def json_lookup(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """One record of a JSON Lines file or a JSON array, far from the question; a field of it is asked by its key."""
    return _table_lookup(rng, ("jsonl", "json_array"))


def table_lookup(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """One row of a CSV or markdown table, far from the question; a cell of it is asked by the row's key."""
    return _table_lookup(rng, ("csv", "markdown"))


def log_lookup(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """One log line with a unique identifier (a request, a job, a payment...), far from the question; a detail of
    it is asked."""
    haystack = draw_haystack(rng, ("log",))
    event = rng.choice(ASKABLE_EVENTS)
    values = event.draw(rng)
    field, phrase = rng.choice(event.asked)
    needle = Needle(haystack.log.render(rng, event, values, rng.integer(0, 86399)), True, "far", rng.fraction())
    identifier = values[_subject_field(event)]
    fields = {"subject": event.subject.format(**values), "field": phrase}
    extra = {"event": event.component, "field": field, "identifier": identifier}
    return haystack, Draft([needle], fields, values[field], "value", expect=[(identifier, 1)], extra=extra)


def last_record(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """The context ends with one more record of its table or log; a field of that last record is asked."""
    haystack = draw_haystack(rng, (*TABLE_FORMATS, "log"))
    if haystack.log is not None:
        event = rng.choice(ASKABLE_EVENTS)
        values = event.draw(rng)
        field, phrase = rng.choice(event.asked)
        text = haystack.log.render(rng, event, values, 86399)
        fields, answer = {"column": phrase, "noun": "log entry"}, values[field]
        expect = [(values[_subject_field(event)], 1)]
    else:
        schema = haystack.table.schema
        record = schema.draw(rng)
        column = rng.choice((schema.key, *schema.askable))
        text = haystack.table.render(record)
        fields, answer = {"column": column.name, "noun": schema.noun}, record[column.name]
        expect = [(record[schema.key.name], 1)]
    needle = Needle(text, True, "end", from_end=0)
    return haystack, Draft([needle], fields, answer, "value", expect=expect, extra={"record": text.strip()})
