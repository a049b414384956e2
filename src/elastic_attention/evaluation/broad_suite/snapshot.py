"""What the broad suite reads from the shipped standard-library snapshot besides its lines: the docstrings, as
prose, and compound-statement headers, as lines to complete. Parsed with :mod:`ast` once per process.
"""

from __future__ import annotations

import ast
import functools
import re

from elastic_attention.evaluation.corpus import stdlib_files

#: Longest prose unit, in words: longer paragraphs are cut at sentence ends, so a unit stays a few dozen tokens.
_UNIT_WORDS = 60
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


@functools.cache
def syntax_trees() -> tuple[ast.Module, ...]:
    """The syntax tree of every snapshot file, in :func:`stdlib_files` order."""
    return tuple(ast.parse("".join(source.lines)) for source in stdlib_files())


def _paragraphs(docstring: str) -> list[str]:
    """Prose paragraphs of one docstring, each on one line; doctest, code-like and tiny paragraphs dropped."""
    kept = []
    for block in re.split(r"\n\s*\n", docstring):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if not lines or any(line.startswith((">>>", "...", "$", "%")) for line in lines):
            continue
        text = " ".join(" ".join(lines).split())
        letters = sum(ch.isalpha() or ch in " ,.;:'-()" for ch in text)
        if len(text.split()) >= 6 and letters >= 0.9 * len(text):
            kept.append(text)
    return kept


def _units(paragraph: str) -> list[str]:
    """A paragraph cut at sentence ends into pieces of at most about `_UNIT_WORDS` words."""
    pieces, current = [], []
    for sentence in _SENTENCE_END.split(paragraph):
        if current and len(" ".join(current + [sentence]).split()) > _UNIT_WORDS:
            pieces.append(" ".join(current))
            current = []
        current.append(sentence)
    if current:
        pieces.append(" ".join(current))
    return pieces


@functools.cache
def prose_paragraphs() -> tuple[tuple[str, ...], ...]:
    """The snapshot's docstring paragraphs in file order, each as its units (one or more pieces of text)."""
    paragraphs = []
    for tree in syntax_trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                docstring = ast.get_docstring(node, clean=True)
                if docstring:
                    paragraphs += [tuple(_units(text)) for text in _paragraphs(docstring)]
    return tuple(paragraphs)


_HEADER_KINDS = (ast.If, ast.For, ast.While, ast.With)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _headers(node: ast.AST, in_function: bool):
    """Compound statements inside function bodies, except a function's first statement; each node once."""
    first = node.body[0] if isinstance(node, _FUNCTIONS) else None
    for child in ast.iter_child_nodes(node):
        if in_function and isinstance(child, _HEADER_KINDS) and child is not first:
            yield child
        yield from _headers(child, in_function or isinstance(child, _FUNCTIONS))


@functools.cache
def header_targets(min_chars: int = 12, max_chars: int = 100) -> tuple[tuple[int, int], ...]:
    """(file index, line index) of one-line compound-statement headers inside function bodies: the lines the
    ``line_completion`` family asks to complete.

    A target is an ``if``, ``for``, ``while`` or ``with`` header that fits on one line of ``min_chars`` to
    ``max_chars`` characters (indentation excluded), ends with ``:`` and is not the function's first statement.
    These are never the simple statements the code suite's ``next_line`` completes, so the two suites share no
    line to complete.
    """
    targets = []
    for file_index, (source, tree) in enumerate(zip(stdlib_files(), syntax_trees())):
        for statement in _headers(tree, False):
            if statement.body[0].lineno != statement.lineno + 1:
                continue
            text = source.lines[statement.lineno - 1].strip()
            if min_chars <= len(text) <= max_chars and text.endswith(":") and not text.startswith("elif"):
                targets.append((file_index, statement.lineno - 1))
    return tuple(sorted(set(targets)))
