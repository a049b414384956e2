"""Row cells on disk: the rows of one (task, length), generated once on one machine and read on another.

Long rows are cheap to make on a CPU and costly to make where the GPU time is counted, and some generators (RULER's,
through lm-evaluation-harness) need packages the GPU machine lacks. ``elastic-attention rows`` writes each cell as
``DIR/<task>_<length>.jsonl``; ``elastic-attention eval --rows DIR`` reads the cells found there instead of
generating them.

A cell file's first line is a header object ``{"cell": {...}}`` (task, length, seed, rows, the tokenizer's digest,
the generator and its version); each further line is one `Row` (its fields, ``metadata`` included). Reading checks
that the file holds the asked cell, with enough rows, rendered for the same tokenizer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from elastic_attention.errors import InputError
from elastic_attention.io import atomic_write_text
from elastic_attention.rows import Row

HEADER_KEY = "cell"
_REQUIRED_FIELDS = ("context", "question", "answer", "task")


def tokenizer_digest(tokenizer) -> str:
    """A short SHA-256 of the tokenizer's vocabulary and chat template: rows cut to a token length are only right
    for the tokenizer that measured them."""
    vocabulary = sorted(tokenizer.get_vocab().items())
    text = json.dumps([vocabulary, getattr(tokenizer, "chat_template", None) or ""], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def cell_path(folder: str | Path, task: str, length: int) -> Path:
    """Where the cell of (``task``, ``length``) lives in ``folder``."""
    return Path(folder) / f"{task}_{length}.jsonl"


def write_cell(folder: str | Path, rows: list[Row], *, task: str, length: int, seed: int, tokenizer,
               generator: str) -> Path:
    """Write one cell atomically (`io.atomic_write_text`).

    Args:
        folder: the cells' folder (created when missing).
        rows: the cell's rows, in order.
        task, length, seed: what the rows are.
        tokenizer: the tokenizer the rows were measured with.
        generator: what made the rows and its version, e.g. ``"lm-eval 0.4.13"``.

    Returns:
        The file written.
    """
    path = cell_path(folder, task, length)
    header = {"task": task, "length": length, "seed": seed, "rows": len(rows),
              "tokenizer": tokenizer_digest(tokenizer), "generator": generator}
    lines = [json.dumps({HEADER_KEY: header})]
    lines += [json.dumps({name: value for name, value in asdict(row).items() if name != "source"},
                         ensure_ascii=False) for row in rows]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def read_cell(folder: str | Path, *, task: str, length: int, seed: int, samples: int, tokenizer) -> list[Row] | None:
    """The first ``samples`` rows of the cell of (``task``, ``length``) in ``folder``, or None when it has no file
    for that cell.

    Raises:
        InputError: a file that is not a cell file, or one of another task, length or seed, with fewer rows than
            asked, or measured with another tokenizer (each message names the file and the fix).
    """
    path = cell_path(folder, task, length)
    if not path.is_file():
        return None
    header, records = _parsed(path)
    return _checked_rows(path, header, records, {"task": task, "length": length, "seed": seed}, samples, tokenizer)


def read_cells(folder: str | Path, *, seed: int, samples: int, tokenizer) -> list[tuple[str, int, list[Row]]]:
    """Every cell file in ``folder``, in file-name order: (task, length, its first ``samples`` rows, or all of a
    cell holding fewer), each checked as `read_cell` checks one.

    Raises:
        InputError: as `read_cell`, for any of the files.
    """
    cells = []
    for path in sorted(Path(folder).glob("*_*.jsonl")):
        header, records = _parsed(path)
        asked = {"task": header.get("task"), "length": header.get("length"), "seed": seed}
        rows = _checked_rows(path, header, records, asked, min(samples, len(records)), tokenizer)
        cells.append((header["task"], header["length"], rows))
    return cells


def _parsed(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A cell file's header and row records."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        return json.loads(lines[0])[HEADER_KEY], [json.loads(line) for line in lines[1:]]
    except (IndexError, KeyError, TypeError, json.JSONDecodeError) as error:
        raise InputError(f"{path} is not a row-cell file (first line a {{\"cell\": ...}} header, then one row a "
                         f"line): {error!r}; write it with `elastic-attention rows`") from None


def _checked_rows(path: Path, header: dict[str, Any], records: list[dict[str, Any]], asked: dict[str, Any],
                  samples: int, tokenizer) -> list[Row]:
    """The first ``samples`` rows of a parsed cell file, after checking its header against ``asked`` (task, length,
    seed) and ``tokenizer``."""
    other = {key: header.get(key) for key in asked if header.get(key) != asked[key]}
    if other:
        raise InputError(f"{path} holds {other}, asked {asked}; write the cell again with `elastic-attention rows`")
    if header.get("tokenizer") != tokenizer_digest(tokenizer):
        raise InputError(f"{path} was measured with another tokenizer (digest {header.get('tokenizer')}, this one "
                         f"{tokenizer_digest(tokenizer)}); write it again with this model's tokenizer")
    if len(records) < samples:
        raise InputError(f"{path} holds {len(records)} rows, {samples} asked; write it again with --samples "
                         f"{samples} or more")
    return [_row(record, f"{path}, row {index + 1}") for index, record in enumerate(records[:samples])]


def _row(record: dict[str, Any], source: str) -> Row:
    missing = [name for name in _REQUIRED_FIELDS if name not in record]
    known = {field.name for field in fields(Row)} - {"source"}
    unknown = sorted(set(record) - known)
    if missing or unknown:
        raise InputError(f"{source}: missing fields {missing}, unknown fields {unknown} (a row has {sorted(known)})")
    return Row(**record, source=source)


def write_cells(tokenizer, tasks: list[str], lengths: list[int], samples: int, seed: int, out: str | Path,
                echo=None) -> list[Path]:
    """Generate and write the cells of ``tasks`` x ``lengths`` (``samples`` rows each, from each task's suite),
    what ``elastic-attention rows`` does.

    Args:
        tokenizer: the model's tokenizer (loaded from its folder).
        tasks: task names of any suite.
        lengths: prompt lengths in tokens.
        samples: rows per cell.
        seed: the suites' seed (``eval --seed`` must match it to read the cells).
        out: the cells' folder.
        echo: called with one line per cell written (None: silent).

    Returns:
        The files written.
    """
    from elastic_attention.evaluation.suites import suite_of

    written = []
    for task in tasks:
        suite = suite_of(task)
        generator = _generator_name(suite.name)
        for length in lengths:
            rows = suite.generate(task, length, seed, samples, tokenizer)
            written.append(write_cell(out, rows, task=task, length=length, seed=seed, tokenizer=tokenizer,
                                      generator=generator))
            if echo is not None:
                echo(f"{written[-1]}: {len(rows)} rows of {task} at {length} tokens ({generator})")
    return written


def _generator_name(suite: str) -> str:
    """What made a suite's rows, with its version: lm-eval's for RULER, this package's for the others."""
    from importlib.metadata import PackageNotFoundError, version

    if suite == "ruler":
        from elastic_attention.evaluation.ruler import lm_eval_version

        return f"lm-eval {lm_eval_version()} (RULER)"
    try:
        return f"elastic-attention {version('elastic-attention')} ({suite} suite)"
    except PackageNotFoundError:
        return f"elastic-attention ({suite} suite)"
