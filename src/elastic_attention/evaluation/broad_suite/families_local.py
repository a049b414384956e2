"""Local families: continuing a regular sequence that ends the context, and applying a string rule shown by a few
examples near its end. Their evidence is in the last few hundred tokens.
"""

from __future__ import annotations

import datetime
import json

from elastic_attention.evaluation.broad_suite.assembly import Draft, Needle
from elastic_attention.evaluation.broad_suite.haystacks import ALL_FORMATS, Haystack, draw_haystack
from elastic_attention.evaluation.broad_suite.records import LogEvent
from elastic_attention.evaluation.broad_suite.values import plural
from elastic_attention.evaluation.broad_suite.vocabulary import coined_names, long_words
from elastic_attention.evaluation.seeded_random import SampleRandom

_LABELS = ("checkpoint", "batch", "ticket", "milestone", "invoice", "frame", "revision", "slot")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_VOWELS = set("aeiou")

#: String rules: name -> the function (lowercase words in, a string out).
RULES = {
    "reverse": lambda word: word[::-1],
    "upper": str.upper,
    "first_last": lambda word: word[0] + word[-1],
    "sorted_letters": lambda word: "".join(sorted(word)),
    "no_vowels": lambda word: "".join(ch for ch in word if ch not in _VOWELS),
    "shift_one": lambda word: "".join(chr((ord(ch) - 97 + 1) % 26 + 97) for ch in word),
    "swap_ends": lambda word: word[-1] + word[1:-1] + word[0],
    "with_length": lambda word: f"{word}{len(word)}",
}
_PAIR_STYLES = ("{x} -> {y}", "input: {x} | output: {y}", "{x} => {y}", "json", "| {x} | {y} |", "{x}: {y}")
_PYTHON_PAIR_STYLES = ("# {x} -> {y}", "    {f}({xr})  # gives {yr}", "{f}({xr}) == {yr}")
_BLOCK_HEADS = ("Examples:", "Mapping:", "Samples of the rule:", "")


def _sequence(rng: SampleRandom, count: int) -> tuple[list[str], str, str]:
    """(``count`` items of a regular sequence, the next item, the rule's kind)."""
    kind = rng.choice(("number", "date", "code", "letter"))
    if kind == "number":
        start, step = rng.integer(10, 5000), rng.integer(2, 50)
        items = [str(start + step * k) for k in range(count + 1)]
    elif kind == "date":
        start = datetime.date(rng.integer(2000, 2030), rng.integer(1, 12), rng.integer(1, 28))
        step = rng.integer(1, 14)
        items = [(start + datetime.timedelta(days=step * k)).isoformat() for k in range(count + 1)]
    elif kind == "code":
        prefix = "".join(rng.choice(_LETTERS) for _ in range(3))
        start, step, width = rng.integer(1, 900), rng.integer(1, 9), rng.integer(4, 5)
        items = [f"{prefix}-{start + step * k:0{width}d}" for k in range(count + 1)]
    else:
        first, suffix = rng.integer(0, 25 - count - 1), rng.integer(1, 99)
        items = [f"{_LETTERS[first + k]}{suffix}" for k in range(count + 1)]
    return items[:-1], items[-1], kind


def _sequence_lines(rng: SampleRandom, haystack: Haystack, items: list[str], label: str) -> tuple[list[str], str]:
    """The items as lines in the haystack's style, and the label a question calls them by."""
    if haystack.fmt == "python":
        name = f"{plural(label).replace(' ', '_')}_{coined_names(rng, 1)[0].lower()}"
        return [f"{name}.append({json.dumps(item) if not item.isdigit() else item})\n" for item in items], label
    if haystack.log is not None:
        event = LogEvent("writer", "{label} {item} written", {})
        second = rng.integer(40000, 80000)
        return [haystack.log.render(rng, event, {"label": label, "item": item}, second + 7 * k)
                for k, item in enumerate(items)], label
    if haystack.table is not None:
        schema = haystack.table.schema
        return [haystack.table.render(schema.draw(rng) | {schema.key.name: item}) for item in items], schema.key.name
    style = rng.choice(("{label} {item}", "- {label}: {item}", "{Label} {item}."))
    return [style.format(label=label, Label=label.capitalize(), item=item) + "\n" for item in items], label


def sequence_next(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """4-7 items of a regular sequence (numbers, dates, codes or letters with a fixed step) end the context; the
    next item is asked."""
    haystack = draw_haystack(rng, ALL_FORMATS)
    items, following, kind = _sequence(rng, rng.integer(4, 7))
    lines, label = _sequence_lines(rng, haystack, items, rng.choice(_LABELS))
    needle = Needle("".join(lines), True, "end", from_end=0)
    return haystack, Draft([needle], {"label": label}, following, "value",
                           extra={"sequence": items, "sequence_kind": kind})


def _pair_line(rng: SampleRandom, style: str, function: str, word: str, result: str) -> str:
    if style == "json":
        return json.dumps({"in": word, "out": result}) + "\n"
    return style.format(x=word, y=result, f=function, xr=json.dumps(word), yr=json.dumps(result)) + "\n"


def rule_induction(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """3-6 examples of one string rule 0-250 tokens before the end of the context; the rule applied to a new word
    is asked (case-sensitive)."""
    haystack = draw_haystack(rng, ALL_FORMATS)
    rule = rng.choice(tuple(RULES))
    words = rng.sample([word for word in long_words() if RULES[rule](word) != word], rng.integer(3, 6) + 1)
    style = rng.choice(_PYTHON_PAIR_STYLES if haystack.fmt == "python" else _PAIR_STYLES)
    function = f"convert_{coined_names(rng, 1)[0].lower()}"
    head = rng.choice(_BLOCK_HEADS)
    if haystack.fmt == "python" and head:
        head = "# " + head
    lines = [head + "\n"] if head else []
    lines += [_pair_line(rng, style, function, word, RULES[rule](word)) for word in words[:-1]]
    needle = Needle("\n" + "".join(lines) + "\n", True, "end", from_end=rng.integer(0, 250))
    answer = RULES[rule](words[-1])
    return haystack, Draft([needle], {"input": words[-1]}, answer, "value",
                           extra={"rule": rule, "examples": words[:-1], "case_sensitive": True})
