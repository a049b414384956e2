"""The real text of the code suite: a fixed snapshot of the Python standard library's source.

The snapshot (``assets/python_stdlib/corpus.jsonl.xz``, written by ``scripts/snapshot_stdlib.py`` from CPython
3.11.7's ``Lib/``, PSF licence in ``LICENSE.txt`` beside it) ships with the package, so the suite's rows do not
depend on the Python installed on the machine. This module reads it once per process and offers what the tasks
draw from it: the files' lines, functions with an integer default parameter, single-line statements to complete,
snake_case function names, and per-tokenizer token counts of every line.
"""

from __future__ import annotations

import ast
import functools
import json
import lzma
import weakref
from dataclasses import dataclass
from pathlib import Path

CORPUS_FILE = Path(__file__).resolve().parent.parent / "assets" / "python_stdlib" / "corpus.jsonl.xz"



@dataclass(frozen=True)
class SourceFile:
    """One module of the snapshot.

    Attributes:
        path: its path under ``Lib/`` (``json/decoder.py``).
        lines: its lines, each ending with ``"\\n"``.
    """

    path: str
    lines: tuple[str, ...]

    @property
    def header(self) -> str:
        """The line that introduces the file in a context."""
        return f"# File: Lib/{self.path}\n"


@dataclass(frozen=True)
class Definition:
    """A function of the snapshot with a parameter whose default is a plain integer literal.

    Attributes:
        file_index: index of its file in :func:`stdlib_files`.
        name: the function's name.
        start: index of its ``def`` line (decorators excluded).
        end: index one past its last line.
        parameter: the parameter's name.
        default_line: index of the line holding the default literal.
        default_columns: (start, end) character columns of the literal in that line.
        default: the literal's value.
    """

    file_index: int
    name: str
    start: int
    end: int
    parameter: str
    default_line: int
    default_columns: tuple[int, int]
    default: int


@functools.cache
def stdlib_files() -> tuple[SourceFile, ...]:
    """Every file of the snapshot, in sorted path order."""
    with lzma.open(CORPUS_FILE, "rt", encoding="utf-8") as stream:
        records = [json.loads(line) for line in stream if line.strip()]
    return tuple(SourceFile(record["path"], tuple(record["text"].splitlines(keepends=True))) for record in records)


@functools.cache
def _syntax_trees() -> tuple[ast.Module, ...]:
    return tuple(ast.parse("".join(source.lines)) for source in stdlib_files())


@functools.cache
def integer_defaults(max_lines: int = 40) -> tuple[Definition, ...]:
    """Functions of at most ``max_lines`` lines (public names, no dunders) with an integer default parameter.

    One entry per function: its first such parameter whose default literal sits on one line.
    """
    found = []
    for file_index, tree in enumerate(_syntax_trees()):
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            if node.end_lineno - node.lineno + 1 > max_lines:
                continue
            definition = _first_integer_default(file_index, node)
            if definition is not None:
                found.append(definition)
    return tuple(found)


def _first_integer_default(file_index: int, node: ast.FunctionDef) -> Definition | None:
    arguments = node.args
    positional = arguments.posonlyargs + arguments.args
    pairs = list(zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults))
    pairs += [(arg, default) for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults) if default]
    for argument, default in pairs:
        if (
            isinstance(default, ast.Constant)
            and type(default.value) is int
            and default.lineno == default.end_lineno
        ):
            return Definition(
                file_index=file_index,
                name=node.name,
                start=node.lineno - 1,
                end=node.end_lineno,
                parameter=argument.arg,
                default_line=default.lineno - 1,
                default_columns=(default.col_offset, default.end_col_offset),
                default=default.value,
            )
    return None


@functools.cache
def completion_targets(min_chars: int = 16, max_chars: int = 100) -> tuple[tuple[int, int], ...]:
    """(file index, line index) of single-line statements inside function bodies: the lines to complete.

    A target is an assignment, return, call, raise or augmented assignment that fits on one line of ``min_chars`` to
    ``max_chars`` characters (indentation excluded) and is not the function's first statement (so the code before
    it in the same function gives context).
    """
    kinds = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr, ast.Raise)
    targets = []
    for file_index, (source, tree) in enumerate(zip(stdlib_files(), _syntax_trees())):
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for statement in function.body[1:]:
                if not isinstance(statement, kinds) or statement.lineno != statement.end_lineno:
                    continue
                if isinstance(statement, ast.Expr) and not isinstance(statement.value, ast.Call):
                    continue
                text = source.lines[statement.lineno - 1].strip()
                if min_chars <= len(text) <= max_chars and not text.startswith(("#", '"', "'")):
                    targets.append((file_index, statement.lineno - 1))
    return tuple(sorted(set(targets)))


class LineTokens:
    """Token counts of the snapshot's lines under one tokenizer, computed per file on first use.

    Counts are of each line encoded alone (no special tokens); a run of lines encodes to about their sum, since
    byte-level BPE pre-tokenizers split at newlines. Callers that need the exact count render and encode the result.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._files: dict[int, tuple[int, ...]] = {}
        self._headers: dict[int, int] = {}

    def of_file(self, file_index: int) -> tuple[int, ...]:
        if file_index not in self._files:
            lines = list(stdlib_files()[file_index].lines)
            encoded = self.tokenizer(lines, add_special_tokens=False)["input_ids"] if lines else []
            self._files[file_index] = tuple(len(ids) for ids in encoded)
        return self._files[file_index]

    def of_header(self, file_index: int) -> int:
        if file_index not in self._headers:
            self._headers[file_index] = self.count(stdlib_files()[file_index].header)
        return self._headers[file_index]

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))


_LINE_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def line_tokens(tokenizer) -> LineTokens:
    """The :class:`LineTokens` of ``tokenizer``, shared by every call with the same tokenizer object."""
    if tokenizer not in _LINE_TOKENS:
        _LINE_TOKENS[tokenizer] = LineTokens(tokenizer)
    return _LINE_TOKENS[tokenizer]
