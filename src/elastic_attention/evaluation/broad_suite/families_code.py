"""Families over Python source: where a new function is defined, which function calls a helper, and completing a
line that the context breaks off in the middle of.

New functions get coined names (``merge_window_korvath``), so they are defined nowhere in the snapshot and a model
cannot answer from its memory of the standard library.
"""

from __future__ import annotations

import re
from typing import Any

from elastic_attention.evaluation.broad_suite.assembly import Draft, Needle, Redraw
from elastic_attention.evaluation.broad_suite.haystacks import Haystack
from elastic_attention.evaluation.broad_suite.snapshot import header_targets
from elastic_attention.evaluation.broad_suite.vocabulary import coined_names, long_words
from elastic_attention.evaluation.corpus import stdlib_files
from elastic_attention.evaluation.seeded_random import SampleRandom

_VERBS = ("collect", "resolve", "merge", "render", "parse", "filter", "normalize", "count", "build", "check")
#: Bodies of new functions: ``{name}`` is the function, ``{n}`` a small number, ``{call}`` a call to another one.
_BODIES = (
    'def {name}(items, limit={n}):\n    """Return at most limit items that are not empty."""\n'
    "    kept = [item for item in items if item]\n    return kept[:limit]\n",
    "def {name}(text, sep=\",\"):\n    parts = text.split(sep)\n    return [part.strip() for part in parts if part]\n",
    "def {name}(mapping, key, default=None):\n    value = mapping.get(key, default)\n    if value is None:\n"
    "        raise KeyError(key)\n    return value\n",
    "def {name}(values, scale={n}):\n    total = 0\n    for value in values:\n        total += value * scale\n"
    "    return total\n",
    "def {name}(path, mode=\"r\"):\n    with open(path, mode) as handle:\n        return handle.read()\n",
)
_CALLERS = (
    "def {name}(records):\n    cleaned = {call}(records)\n    return sorted(cleaned)\n",
    "def {name}(self, payload):\n    if not payload:\n        return None\n    return {call}(payload)\n",
    'def {name}(entries, verbose=False):\n    """Summarize the entries."""\n    result = {call}(entries)\n'
    "    if verbose:\n        print(result)\n    return result\n",
    "def {name}(source):\n    data = list(source)\n    checked = {call}(data)\n    return len(checked)\n",
)
_CALL_LINES = ("    result = {call}(data)\n", "{call}(options)\n", "        value = {call}(self.items, {n})\n",
               "    return {call}(args)\n")


def _function_names(rng: SampleRandom, count: int) -> list[str]:
    return [f"{rng.choice(_VERBS)}_{rng.choice(long_words())}_{name.lower()}" for name in coined_names(rng, count)]


def _header_pattern(haystack: Haystack) -> re.Pattern[str]:
    """The file headers of ``haystack``'s style, with the path as group ``path``."""
    head, tail = haystack.header.split("{path}")
    return re.compile(rf"^{re.escape(head)}(?P<path>\S+){re.escape(tail)}$", re.M)


def code_definition(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """A new function inserted far from the question inside one of the files, and one or two calls to it
    elsewhere; the file that defines it is asked (found after placement: the last header before it)."""
    haystack = Haystack("python", rng)
    name = _function_names(rng, 1)[0]
    body = rng.choice(_BODIES).format(name=name, n=rng.integer(2, 64))
    needles = [Needle("\n" + body + "\n", True, "far", rng.fraction())]
    calls = rng.integer(1, 2)
    needles += [Needle(rng.choice(_CALL_LINES).format(call=name, n=rng.integer(2, 9)), False, "anywhere",
                       rng.fraction()) for _ in range(calls)]
    pattern = _header_pattern(haystack)

    def resolve(context: str, spans: list[tuple[int, int]]) -> tuple[str, list[tuple[int, int]], dict[str, Any]]:
        headers = list(pattern.finditer(context, 0, spans[0][0]))
        if not headers:
            raise Redraw("the function landed before the first file header")
        header = headers[-1]
        return header.group("path"), [header.span()], {"path": header.group("path")}

    expect = [(f"def {name}(", 1), (name, 1 + calls)]
    return haystack, Draft(needles, {"name": name}, "", "path", expect=expect, resolve=resolve,
                           extra={"function": name})


def code_caller(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """A helper defined anywhere, the one function that calls it far from the question, and a look-alike pair
    (another caller of another helper); the caller's name is asked."""
    haystack = Haystack("python", rng)
    helper, caller, other_helper, other_caller = _function_names(rng, 4)
    needles = [
        Needle("\n" + rng.choice(_CALLERS).format(name=caller, call=helper) + "\n", True, "far", rng.fraction()),
        Needle("\n" + rng.choice(_BODIES).format(name=helper, n=rng.integer(2, 64)) + "\n", False, "anywhere",
               rng.fraction()),
        Needle("\n" + rng.choice(_CALLERS).format(name=other_caller, call=other_helper) + "\n", False, "anywhere",
               rng.fraction()),
    ]
    expect = [(f"{helper}(", 2), (caller, 1), (other_helper, 1), (other_caller, 1)]
    return haystack, Draft(needles, {"name": helper}, caller, "identifier", expect=expect,
                           distractors=[other_caller], extra={"helper": helper, "caller": caller})


def line_completion(rng: SampleRandom) -> tuple[Haystack, Draft]:
    """The code before a real one-line ``if`` / ``for`` / ``while`` / ``with`` header, then the header's first
    third of words; the whole header line (stripped) is the answer."""
    file_index, line_index = rng.choice(header_targets())
    haystack = Haystack("python", rng, start=(file_index, line_index))
    target = stdlib_files()[file_index].lines[line_index].rstrip("\n")
    indent = len(target) - len(target.lstrip())
    words = target[indent:].split(" ")
    cut = indent + len(" ".join(words[: max(1, len(words) // 3)]))
    answer = target.strip()
    needle = Needle(target[:cut], True, "end", from_end=0)
    extra = {"file": stdlib_files()[file_index].path, "line": line_index + 1, "prefix": target[:cut]}
    return haystack, Draft([needle], {"prefix": target[indent:cut]}, answer, "line",
                           max_new_tokens=len(answer) // 2 + 16, extra=extra)
