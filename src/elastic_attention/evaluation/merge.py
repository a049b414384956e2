"""`elastic-attention eval-merge`: one table from the eval.json files of several `elastic-attention eval` calls.

An evaluation is often split over calls (one per length, the static modes apart, another machine): this module
checks that the files belong together (one model, one elastic configuration, one seed, the elastic cells from one
router, the same number of rows for every cell of a (task, length), no cell measured twice) and writes their cells
as one eval.json, eval.md and accuracy_vs_msr.png, keeping each file's header (command, date, device, static head
sets, ...) under ``merged_from``. ``--modes`` keeps only some modes' cells: the cells that do not depend on the
router (full, sparse, static@MSR) of an older table can join a new router's elastic and static cells in two merges.
It cannot tell whether a task's generator changed between the calls, and files written before eval.json recorded
its seed are not checked for one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from elastic_attention.config import ElasticConfig
from elastic_attention.errors import ConfigError, InputError
from elastic_attention.evaluation.reporting import cell_results, command_and_date, write_table_and_plot
from elastic_attention.evaluation.runner import CellResult
from elastic_attention.io import atomic_write_text

#: `ElasticConfig` fields only a router reads: cells of other modes (full, sparse, static@MSR, heads@MSR) do not
#: depend on them, so they must agree only among the files with elastic cells.
_ROUTER_FIELDS = ("pool_first", "pool_last", "router_width", "router_standardize", "head_set_choices", "floor_set",
                  "floor_confidence", "signal_layer", "signal_thresholds", "signal_queries", "signal_statistic")

#: The fields every row needs (`CellResult`'s fields without a default).
_REQUIRED = tuple(field.name for field in dataclasses.fields(CellResult)
                  if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING)


def merge_eval_documents(documents: Sequence[tuple[str, dict]], modes: Sequence[str] | None = None) -> dict:
    """One eval document from ``(name, document)`` pairs of eval.json contents.

    Result rows are kept as they are (extra fields included), ordered by mode, task and length as first seen.
    ``modes`` (None: all) keeps only the cells of those modes; the checks apply to the kept cells.

    Raises:
        InputError: no documents; a document without results or with a row that lacks a field; documents of
            different models, attention settings (the elastic configuration less the router's fields) or seeds;
            elastic cells from different routers or router settings; cells of one
            (task, length) with different numbers of rows; a (mode, task, length) cell in more than one document;
            a document or a mode of ``modes`` without any kept cell.
    """
    if not documents:
        raise InputError("eval-merge needs at least one eval.json file")
    for name, document in documents:
        _check_rows(name, document)
    if modes is not None:
        documents = _keep_modes(documents, modes)
    _same(documents, "model", "evaluate different models", "merge one model's files")
    attention = [(name, {"elastic_config": _without_router_fields(d.get("elastic_config"))}) for name, d in documents]
    _same(attention, "elastic_config", "use different elastic configurations", "merge one configuration's files")
    _same([(name, d) for name, d in documents if "seed" in d], "seed", "were drawn with different seeds",
          "merge the files of one --seed")
    elastic = [(name, d) for name, d in documents if any(row["mode"] == "elastic" for row in d["results"])]
    _same(elastic, "router", "have elastic cells of different routers", "merge one router's files")
    _same(elastic, "elastic_config", "have elastic cells of different router settings", "merge one router's files")
    seen: dict[tuple, str] = {}
    samples: dict[tuple, tuple[int, str]] = {}
    rows: list[dict] = []
    for name, document in documents:
        for row in document["results"]:
            cell = (row["mode"], row["task"], row["length"])
            if cell in seen:
                raise InputError(f"cell {cell} (mode, task, length) is in both {seen[cell]} and {name}; "
                                 "leave one file out or remove the cell from one")
            count, first = samples.setdefault((row["task"], row["length"]), (row["samples"], name))
            if count != row["samples"]:
                raise InputError(f"{row['task']} at {row['length']} tokens has {count} rows in {first} but "
                                 f"{row['samples']} in {name}: merge cells measured on the same rows")
            seen[cell] = name
            rows.append(row)
    mode_order, task_order = _first_seen(rows, "mode"), _first_seen(rows, "task")
    rows.sort(key=lambda row: (mode_order[row["mode"]], task_order[row["task"]], row["length"]))
    first = documents[0][1]
    return {
        **command_and_date(),
        "device": " + ".join(dict.fromkeys(str(document.get("device")) for _, document in documents)),
        "model": first.get("model"),
        "router": elastic[0][1].get("router") if elastic else None,
        "seed": next((document["seed"] for _, document in documents if "seed" in document), None),
        "elastic_config": (elastic[0][1] if elastic else first).get("elastic_config"),
        "merged_from": [{"file": name, **{key: value for key, value in document.items() if key != "results"}}
                        for name, document in documents],
        "results": rows,
    }


def run_merge_command(paths: Sequence[str], out: str, modes: Sequence[str] | None = None) -> str:
    """Everything `elastic-attention eval-merge` does; returns the printed table.

    ``paths`` are eval.json files or the folders `elastic-attention eval --out` wrote them to; ``modes`` (None: all)
    the modes whose cells are kept.
    """
    out_file = (Path(out) / "eval.json").resolve()
    documents = []
    for path in paths:
        file = Path(path) / "eval.json" if Path(path).is_dir() else Path(path)
        if file.resolve() == out_file:
            raise InputError(f"--out {out} would overwrite the input {file}: write the merged table elsewhere")
        try:
            documents.append((str(file), json.loads(file.read_text(encoding="utf-8"))))
        except FileNotFoundError:
            raise InputError(f"no eval.json at {path}: pass the files (or folders) `elastic-attention eval` "
                             "wrote") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InputError(f"cannot read {file} as JSON ({error}): pass eval.json files") from None
    merged = merge_eval_documents(documents, modes)
    atomic_write_text(out_file, json.dumps(merged, indent=2))
    return write_table_and_plot(cell_results(merged["results"]), out_file.parent) + f" (from {len(paths)} files)"


def _check_rows(name: str, document) -> None:
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise InputError(f"{name} is not an eval.json of `elastic-attention eval` (no `results` list)")
    for index, row in enumerate(document["results"]):
        missing = [key for key in _REQUIRED if not isinstance(row, dict) or key not in row]
        if missing:
            raise InputError(f"row {index} of {name} lacks {', '.join(missing)}: an eval.json of an older version "
                             "of `elastic-attention eval`? Evaluate again, or add the fields to its rows")


def _keep_modes(documents: Sequence[tuple[str, dict]], modes: Sequence[str]) -> list[tuple[str, dict]]:
    kept = [(name, {**document, "results": [row for row in document["results"] if row["mode"] in modes]})
            for name, document in documents]
    for name, document in kept:
        if not document["results"]:
            raise InputError(f"{name} has no cells of the modes {', '.join(modes)}: leave it out")
    found = {row["mode"] for _, document in kept for row in document["results"]}
    missing = [mode for mode in modes if mode not in found]
    if missing:
        raise InputError(f"no file has cells of the modes {', '.join(missing)}: check the names against the "
                         f"files' modes ({', '.join(sorted(found))})")
    return kept


def _same(documents: Sequence[tuple[str, dict]], key: str, problem: str, fix: str) -> None:
    values = {json.dumps(document.get(key), sort_keys=True) for _, document in documents}
    if len(values) > 1:
        listed = "; ".join(f"{name}: {document.get(key)!r}" for name, document in documents)
        raise InputError(f"the files {problem} ({listed}); {fix}")


def _without_router_fields(config):
    if not isinstance(config, dict):
        return config
    try:  # a file written before a field existed holds its default
        config = ElasticConfig.from_dict(config).to_dict()
    except ConfigError:
        pass
    return {key: value for key, value in config.items() if key not in _ROUTER_FIELDS}


def _first_seen(rows: Sequence[dict], key: str) -> dict:
    return {value: index for index, value in enumerate(dict.fromkeys(row[key] for row in rows))}
