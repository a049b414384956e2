"""`elastic-attention eval-merge`: one table from the eval.json files of several `elastic-attention eval` calls.

An evaluation is often split over calls (one per length, the static modes apart, another machine): this module
checks that the files belong together (one model, one elastic configuration, the elastic cells from one router, no
cell measured twice) and writes their cells as one eval.json, eval.md and accuracy_vs_msr.png, keeping each file's
command, date and device under ``merged_from``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from elastic_attention.errors import InputError
from elastic_attention.evaluation.reporting import format_markdown, format_table, plot_accuracy_vs_msr
from elastic_attention.evaluation.runner import CellResult
from elastic_attention.io import atomic_write_text

#: What each source file contributes to ``merged_from`` besides its path (when present).
_SOURCE_KEYS = ("command", "date", "device", "router", "static", "note")


def merge_eval_documents(documents: Sequence[tuple[str, dict]]) -> dict:
    """One eval document from ``(name, document)`` pairs of eval.json contents.

    Result rows are kept as they are (extra fields included), ordered by mode, task and length as first seen.

    Raises:
        InputError: a document without results, documents of different models or elastic configurations, elastic
            cells from different routers, or a (mode, task, length) cell in more than one document.
    """
    if not documents:
        raise InputError("eval-merge needs at least one eval.json file")
    for name, document in documents:
        if not isinstance(document, dict) or not isinstance(document.get("results"), list):
            raise InputError(f"{name} is not an eval.json of `elastic-attention eval` (no `results` list)")
    models = {document.get("model") for _, document in documents}
    if len(models) > 1:
        raise InputError(f"the files evaluate different models ({_by_file(documents, 'model')}); merge one model's")
    configs = {json.dumps(document.get("elastic_config"), sort_keys=True) for _, document in documents}
    if len(configs) > 1:
        raise InputError(f"the files use different elastic configurations ({_by_file(documents, 'elastic_config')})")
    elastic = [(name, document) for name, document in documents
               if any(row.get("mode") == "elastic" for row in document["results"])]
    routers = {document.get("router") for _, document in elastic}
    if len(routers) > 1:
        raise InputError(f"the elastic cells come from different routers ({_by_file(elastic, 'router')}); "
                         "merge one router's")
    seen: dict[tuple, str] = {}
    rows: list[dict] = []
    for name, document in documents:
        for row in document["results"]:
            cell = (row.get("mode"), row.get("task"), row.get("length"))
            if cell in seen:
                raise InputError(f"cell {cell} (mode, task, length) is in both {seen[cell]} and {name}; "
                                 "leave one file out or remove the cell from one")
            seen[cell] = name
            rows.append(row)
    modes, tasks = _first_seen(rows, "mode"), _first_seen(rows, "task")
    rows.sort(key=lambda row: (modes[row["mode"]], tasks[row["task"]], row["length"]))
    devices = list(dict.fromkeys(str(document.get("device")) for _, document in documents))
    return {
        "command": " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": " + ".join(devices),
        "model": models.pop(),
        "router": routers.pop() if routers else None,
        "elastic_config": documents[0][1].get("elastic_config"),
        "merged_from": [{"file": name, **{key: document[key] for key in _SOURCE_KEYS if key in document}}
                        for name, document in documents],
        "results": rows,
    }


def cell_results(rows: Sequence[dict]) -> list[CellResult]:
    """The `CellResult` of each eval.json row (fields `CellResult` does not know are left out)."""
    known = {field.name for field in dataclasses.fields(CellResult)}
    return [CellResult(**{key: value for key, value in row.items() if key in known}) for row in rows]


def run_merge_command(paths: Sequence[str], out: str) -> str:
    """Everything `elastic-attention eval-merge` does; returns the printed table."""
    documents = []
    for path in paths:
        try:
            documents.append((str(path), json.loads(Path(path).read_text(encoding="utf-8"))))
        except FileNotFoundError:
            raise InputError(f"no eval.json at {path}: pass the files `elastic-attention eval --out DIR` wrote") from None
        except json.JSONDecodeError as error:
            raise InputError(f"{path} is not JSON ({error}): pass eval.json files") from None
    merged = merge_eval_documents(documents)
    out_dir = Path(out)
    results = cell_results(merged["results"])
    atomic_write_text(out_dir / "eval.json", json.dumps(merged, indent=2))
    atomic_write_text(out_dir / "eval.md", format_markdown(results) + "\n")
    plot_accuracy_vs_msr(results, out_dir / "accuracy_vs_msr.png")
    written = ", ".join(str(out_dir / name) for name in ("eval.json", "eval.md", "accuracy_vs_msr.png"))
    return format_table(results) + f"\n\nmerged {len(paths)} files; wrote {written}"


def _by_file(documents: Sequence[tuple[str, dict]], key: str) -> str:
    return "; ".join(f"{name}: {document.get(key)!r}" for name, document in documents)


def _first_seen(rows: Sequence[dict], key: str) -> dict:
    return {value: index for index, value in enumerate(dict.fromkeys(row[key] for row in rows))}
