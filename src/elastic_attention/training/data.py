"""Training data for the routers: rows read from files (`load_rows`) and encoded rows packed to a token budget.

Rows are `elastic_attention.rows.Row`, encoded by `elastic_attention.rows.encode_row` as in evaluation. Packing keeps
per-sample boundaries: each packed sample gets its own positions (restarting at 0), so elastic attention routes and
attends it on its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from elastic_attention.errors import InputError
from elastic_attention.rows import EncodedRow, Row

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Pack:
    """Samples packed into one sequence of at most the token budget.

    Attributes:
        input_ids: [T] int64.
        labels: [T] int64, IGNORE_INDEX outside the supervised tokens (HF shifts labels inside the loss).
        position_ids: [T] int64, restarting at 0 at every sample.
        tasks: the task of each sample, in order.
        spans: (start, length, prompt_length) of each sample.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    tasks: tuple[str, ...]
    spans: tuple[tuple[int, int, int], ...]

    @property
    def prompt_lengths(self) -> list[int]:
        """The prompt length of each sample: what the routers pool (they never see the answer)."""
        return [prompt_length for _, _, prompt_length in self.spans]


#: Seed stride between the epochs of ``data.fresh_rows``: epoch e draws its rows at ``seed + e * EPOCH_SEED_STRIDE``.
EPOCH_SEED_STRIDE = 1_000_003


class EpochPacks:
    """The packs of each epoch: the first epoch's for every epoch, or, given ``build``, each epoch's own (built when
    first asked; the last two kept, as a step may straddle two epochs).

    Args:
        first: epoch 0's packs.
        build: epoch -> its packs, or None (every epoch repeats the first).
    """

    def __init__(self, first: list[Pack], build: Callable[[int], list[Pack]] | None = None) -> None:
        self.first = first
        self.build = build
        self._built: dict[int, list[Pack]] = {}

    def of(self, epoch: int) -> list[Pack]:
        """Epoch ``epoch``'s packs, as many as the first epoch's.

        Raises:
            InputError: the epoch's rows packed into another number of packs than the first epoch's.
        """
        if self.build is None or epoch == 0:
            return self.first
        if epoch not in self._built:
            packs = self.build(epoch)
            if len(packs) != len(self.first):
                raise InputError(f"epoch {epoch}'s fresh rows make {len(packs)} packs, epoch 0's {len(self.first)}: "
                                 "give data.lengths whose rows pack alike (a budget that is a multiple of each "
                                 "length), or turn data.fresh_rows off")
            self._built = {index: value for index, value in self._built.items() if index == epoch - 1}
            self._built[epoch] = packs
        return self._built[epoch]


def pack_rows(
    rows: Sequence[EncodedRow],
    budget: int,
    *,
    answer_only: bool = True,
    on_overlong: str = "error",
) -> list[Pack]:
    """Greedy in-order packing of encoded rows into sequences of at most ``budget`` tokens.

    Args:
        rows: encoded rows, in the order they should be trained.
        budget: tokens per pack.
        answer_only: labels on the answer tokens only (the paper's CE(Y | X)); else on every token of a sample
            except its first (which has no prediction from inside the sample).
        on_overlong: ``"error"`` raises on a row longer than the budget; ``"skip"`` drops it and logs a warning
            with how many rows were dropped. Rows are never cut.

    Raises:
        InputError: a row longer than the budget with ``on_overlong="error"`` (named by its file and line when it
            came from a file, else by its 1-based place in ``rows``), or a bad argument.
    """
    if budget < 2:
        raise InputError(f"the packing budget must be at least 2 tokens, got {budget}")
    if on_overlong not in ("error", "skip"):
        raise InputError(f"on_overlong must be 'error' or 'skip', got {on_overlong!r}")
    overlong = {index for index, row in enumerate(rows) if len(row) > budget}
    if overlong:
        first = min(overlong)
        named = rows[first].source or f"row {first + 1} of {len(rows)}"
        summary = (f"{len(overlong)} rows are longer than the packing budget of {budget} tokens (first: {named}, "
                   f"{len(rows[first])} tokens)")
        if on_overlong == "error":
            raise InputError(f"{summary}; raise the budget or pass on_overlong='skip'")
        logger.warning("skipped %s", summary)
    packs, current = [], []
    for index, row in enumerate(rows):
        if index in overlong:
            continue
        if current and sum(map(len, current)) + len(row) > budget:
            packs.append(_make_pack(current, answer_only))
            current = []
        current.append(row)
    if current:
        packs.append(_make_pack(current, answer_only))
    return packs


def _make_pack(rows: list[EncodedRow], answer_only: bool) -> Pack:
    ids, labels, positions, spans = [], [], [], []
    for row in rows:
        start = len(ids)
        tokens = row.prompt_ids + row.answer_ids
        ids += tokens
        positions += list(range(len(tokens)))
        if answer_only:
            labels += [IGNORE_INDEX] * len(row.prompt_ids) + row.answer_ids
        else:
            labels += [IGNORE_INDEX] + tokens[1:]
        spans.append((start, len(tokens), len(row.prompt_ids)))
    return Pack(
        input_ids=torch.tensor(ids, dtype=torch.long),
        labels=torch.tensor(labels, dtype=torch.long),
        position_ids=torch.tensor(positions, dtype=torch.long),
        tasks=tuple(row.task for row in rows),
        spans=tuple(spans),
    )


def load_rows(path: str | Path) -> list[Row]:
    """Rows from a local JSONL or parquet file (columns context, question, answer, task; optional instruction and
    system, the system turn).

    Rows in the authors' layout (context, question, answer, metadata: a dict, or that dict written as a Python
    literal, with ``task`` and ``is_prefix``) are read as their training reads them (`_reference_row`). JSONL is read
    with the standard library; parquet through ``datasets`` (no network: local files only).

    Raises:
        InputError: a missing file, a line that is not a JSON object, a missing or non-string column, or an
            unsupported file type; the message names the file and the 1-based line (JSONL) or row (parquet). Each
            row keeps that place as its ``source`` for later errors (an over-long row, a failed encoding).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"row file {path} does not exist")
    if path.suffix in (".jsonl", ".json"):
        records = list(_jsonl_records(path))
        where = "line"
    elif path.suffix == ".parquet":
        try:
            from datasets import load_dataset
        except ImportError as error:
            raise InputError("reading parquet needs `datasets`: pip install 'elastic-attention[train]'") from error
        records = [(number, record) for number, record in
                   enumerate(load_dataset("parquet", data_files=str(path), split="train"), 1)]
        where = "row"
    else:
        raise InputError(f"unsupported row file {path.name!r}: use .jsonl or .parquet")
    rows = []
    for number, record in records:
        source = f"{path}, {where} {number}"
        if "task" not in record and "metadata" in record:
            rows.append(_reference_row(record, source))
            continue
        for key in ("context", "question", "answer", "task"):
            if key not in record:
                raise InputError(f"{path}, {where} {number}: no `{key}` column (rows need context, question, "
                                 "answer, task)")
            if not isinstance(record[key], str):
                raise InputError(f"{path}, {where} {number}: `{key}` must be a string, got {record[key]!r}")
        optional = {}
        for key in ("instruction", "system"):
            value = record.get(key)
            if value is not None and not isinstance(value, str):
                raise InputError(f"{path}, {where} {number}: `{key}` must be a string, got {value!r}")
            optional[key] = value or ""
        rows.append(Row(record["context"], record["question"], record["answer"], record["task"],
                        optional["instruction"], source=source, system=optional["system"]))
    if not rows:
        raise InputError(f"{path} holds no rows")
    return rows


#: The task classes of the authors' training data, and their target MSR (their trainer's table: robust classes 1.0,
#: QA 0.6, anything else the QA target). `configs/reference_rows.yaml` uses it.
REFERENCE_TARGETS = {"Single QA": 0.6, "MultiHop QA": 0.6, "Summarization": 1.0, "Code": 1.0,
                     "In-Context Learning": 1.0, "Other": 0.6}
_REFERENCE_INSTRUCTIONS = {
    "Summarization": ("You are given several news passages. Write a one-page summary of all news.", "Summary:"),
    "Code": ("Please complete the code given below.", ""),
}


def _reference_row(record: dict, where: str) -> Row:
    """A row of the authors' layout: task and order from ``metadata``; their fixed wording for summarization and code.

    ``is_prefix`` (default true) puts the question before the context; a task outside their five classes is
    ``Other`` (their default).
    """
    import ast

    metadata = record["metadata"]
    if isinstance(metadata, str):
        try:
            metadata = ast.literal_eval(metadata)
        except (ValueError, SyntaxError):
            raise InputError(f"{where}: `metadata` is neither a dict nor a dict literal: {metadata[:80]!r}") from None
    if not isinstance(metadata, dict):
        raise InputError(f"{where}: `metadata` must be a dict, got {type(metadata).__name__}")
    for key in ("context", "question", "answer"):
        if not isinstance(record.get(key), str):
            raise InputError(f"{where}: `{key}` must be a string, got {record.get(key)!r}")
    clean = {key: record[key].replace("\ufeff", "").strip() for key in ("context", "question", "answer")}
    task = metadata.get("task", "Other")
    task = task if task in REFERENCE_TARGETS else "Other"
    prefix, suffix = _REFERENCE_INSTRUCTIONS.get(task, ("", ""))
    if metadata.get("is_prefix", True):
        instruction = "\n".join(part for part in (prefix, clean["question"]) if part)
        return Row(clean["context"], suffix, clean["answer"], task, instruction, source=where)
    question = "\n".join(part for part in (clean["question"], suffix) if part)
    return Row(clean["context"], question, clean["answer"], task, prefix, source=where)


def _jsonl_records(path: Path):
    """(line number, object) for every non-empty line of a JSONL file."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}, line {number}: not JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}, line {number}: expected a JSON object, got {type(record).__name__}")
        yield number, record
