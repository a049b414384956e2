"""One results file from several runs of a benchmark: later measurements replace earlier ones cell by cell, and every
row keeps the run it came from.

A benchmark is often measured over several calls (a lease ends, a cell is measured again after a change). `merge_runs`
checks that the runs belong together (the same GPU kind and the `MergeRule`'s shared header fields), lets a later
run's cell replace an earlier one's rows in place, and records each run's date, device, versions, command and source
under ``runs``; each row's ``run`` indexes that list.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_attention.errors import InputError

#: Header fields of one run, kept per run in a merged result.
RUN_FIELDS = ("date", "device", "torch", "transformers", "command")


@dataclass(frozen=True)
class MergeRule:
    """How a benchmark's runs merge.

    Attributes:
        cell: the row fields whose values name a cell; a later run's rows of a cell replace every earlier row of it.
        shared: header fields every run must share (``device`` is always checked).
        union: header fields holding lists; the merged header holds every run's entries, first seen first.
    """

    cell: tuple[str, ...]
    shared: tuple[str, ...]
    union: tuple[str, ...] = ()


#: The rules of the benchmarks whose runs merge (`scripts/merge_bench_results.py`).
RULES = {
    # a request cell holds its dense setups and elastic rows, all of one run
    "request": MergeRule(cell=("prompt_kind", "length", "batch"),
                         shared=("model", "router", "new_tokens", "rows_per_kind", "tasks"), union=("dense_setups",)),
    # a prefill row is one model at one length; an elastic row carries its own run's speedups (`bench.prefill`)
    "prefill": MergeRule(cell=("length", "model"), shared=("model", "elastic")),
}


def rows_of(document: dict) -> list[dict]:
    """A results document's rows (``results``; files written before 2026-12 call them ``rows``)."""
    return document.get("results", document.get("rows")) or []


def merge_runs(documents: list[tuple[str, dict]], rule: MergeRule) -> dict:
    """One result from runs' JSON documents ``(name, document)``, oldest first.

    Returns:
        The newest run's header (each `MergeRule.union` field the union of the runs') with ``runs`` (each run's
        `RUN_FIELDS` and ``source``: its name) and ``results``: every cell's rows from the newest run that measured
        it, each with ``run`` (its index in ``runs``), cells in the order first measured.

    Raises:
        InputError: no documents; a document without rows; runs that differ in ``device`` or a shared field.
    """
    if not documents:
        raise InputError("merging results needs at least one document")
    for name, document in documents:
        if not rows_of(document):
            raise InputError(f"{name} holds no result rows: is it a benchmark's JSON?")
    first_name, first = documents[0]
    for name, document in documents[1:]:
        differing = [field for field in ("device", *rule.shared) if document.get(field) != first.get(field)]
        if differing:
            raise InputError(f"{name} differs from {first_name} in {', '.join(differing)}: only runs of one GPU kind "
                             "and one setup share a table")
    cells: dict[tuple, list[dict]] = {}
    runs = []
    for index, (name, document) in enumerate(documents):
        runs.append({**{field: document.get(field) for field in RUN_FIELDS}, "source": name})
        measured: dict[tuple, list[dict]] = {}
        for row in rows_of(document):
            measured.setdefault(tuple(row[field] for field in rule.cell), []).append({**row, "run": index})
        cells.update(measured)  # a later run's cell replaces the earlier one's, in the earlier one's place
    newest = {key: value for key, value in documents[-1][1].items() if key != "rows"}
    for field in rule.union:
        newest[field] = list(dict.fromkeys(entry for _, document in documents for entry in document.get(field, [])))
    return {**newest, "runs": runs, "results": [row for rows in cells.values() for row in rows]}


def runs_lines(result: dict, title: str) -> list[str]:
    """A table's opening lines: ``title``, then each run's device, date and command (``run N`` where several)."""
    runs = result.get("runs") or [result]
    return [f"{title}{f', run {index}' if len(runs) > 1 else ''}, {run['device']}, {run['date']}: `{run['command']}`"
            for index, run in enumerate(runs)]
