"""Choose a signal router on validation rows only, by a rule fixed before any held-out row is seen, and write it.

    python studies/signal_router/select_router.py --features features_val.jsonl --scores broad_scores.json \
        --eval code_val/eval.json --head-set FILE --msr 0.5 --recall 0.98 --model MODEL --out DIR

The router chooses between two sets: the floor set (the head-set file's set at --msr) and that set with every layer
from the decision layer L on sparse. Candidates: every layer L >= 1, every measured query count q and statistic
(mean or max over the measured queries and query heads; the max over KV heads always). For each, the
threshold is the largest that keeps --recall of the validation rows that need the far context (full attention beats
all-SSA by 0.5) on the floor set; the candidate chosen is the one whose validation rows reach the highest average MSR.
Writes the adapter (DIR/adapter) and DIR/selection.json (every candidate, the choice, and per validation cell the
share of rows sent sparse and the scores the two sets would have: the floor set's read from its heads@--msr cells,
the sparse set's from all-SSA, a lower bound).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
from collections import defaultdict
from pathlib import Path

import torch


def read_scores(scores_file: str | None, eval_files: list[str]) -> dict:
    """(task, length, index) -> {mode: score}: from a JSON of "task|length|index" keys, and from eval.json files
    (their cells' ``row_accuracy``)."""
    scores: dict = defaultdict(dict)
    if scores_file:
        for key, modes in json.loads(Path(scores_file).read_text()).items():
            task, length, index = key.split("|")
            scores[(task, int(length), int(index))].update(modes)
    for name in eval_files:
        for cell in json.loads(Path(name).read_text())["results"]:
            for index, value in enumerate(cell["row_accuracy"]):
                scores[(cell["task"], cell["length"], index)][cell["mode"]] = value
    return scores


def read_features(path: str) -> list[dict]:
    """features.py's records, from a .jsonl file or a gzipped one (.jsonl.gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def labelled(records: list[dict], scores: dict, margin: float) -> tuple[list[dict], torch.Tensor, torch.Tensor]:
    """The records that have full and all-SSA scores, whether each needs the far context (full attention beats
    all-SSA by ``margin``: [rows] bool) and their signals ([rows, statistics, counts, layers, Hkv])."""
    kept = [r for r in records if {"full", "sparse"} <= set(scores.get((r["task"], r["length"], r["index"]), {}))]
    modes = [scores[(r["task"], r["length"], r["index"])] for r in kept]
    need = torch.tensor([row["full"] - row["sparse"] >= margin for row in modes], dtype=torch.bool)
    signal = torch.tensor([r["signal"] for r in kept]) if kept else torch.empty(0)
    return kept, need, signal


def add_validation_arguments(parser, scores_required: bool = False) -> None:
    """--features, --scores, --eval and --margin: the validation rows `validation_rows` reads."""
    parser.add_argument("--features", required=True, help="features.py output (.jsonl or .jsonl.gz)")
    parser.add_argument("--scores", required=scores_required,
                        help='JSON {"task|length|index": {mode: score}} of validation rows')
    parser.add_argument("--eval", nargs="*", default=[], help="eval.json files of validation rows (row_accuracy)")
    parser.add_argument("--margin", type=float, default=0.5, help="full minus all-SSA that marks a needy row")


def validation_rows(args) -> tuple[list[dict], torch.Tensor, torch.Tensor]:
    """`labelled` on the rows named by `add_validation_arguments`' arguments."""
    return labelled(read_features(args.features), read_scores(args.scores, args.eval), args.margin)


def sets_for(floor: torch.Tensor, layer: int) -> torch.Tensor:
    """[2, layers, Hkv] bool: the floor set, and the floor set with every layer from ``layer`` on sparse."""
    sparse = floor.clone()
    sparse[layer:] = False
    return torch.stack([floor, sparse])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_validation_arguments(parser)
    parser.add_argument("--head-set", required=True)
    parser.add_argument("--msr", type=float, default=0.5)
    parser.add_argument("--recall", type=float, default=0.98)
    parser.add_argument("--model", help="the model folder (to write the adapter); none: selection only")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from elastic_attention.head_sets import read_head_sets
    from elastic_attention.router.floor import signal_floor_threshold

    scores = read_scores(args.scores, args.eval)
    records, need_mask, signal = labelled(read_features(args.features), scores, args.margin)
    if not records:
        raise SystemExit("no validation row has both features and full / all-SSA scores")
    keys = [(r["task"], r["length"], r["index"]) for r in records]
    need = need_mask.tolist()
    counts, statistics = records[0]["queries"], records[0]["statistics"]
    floor = read_head_sets(args.head_set).at(args.msr)
    layers = floor.shape[0]
    candidates = []
    for (kind, statistic), (position, count) in itertools.product(enumerate(statistics), enumerate(counts)):
        for layer in range(1, layers):
            value = signal[:, kind, position, layer].amax(dim=1)
            threshold = signal_floor_threshold(value, torch.tensor(need), args.recall)
            msrs = 1.0 - sets_for(floor, layer).float().mean(dim=(1, 2))
            sparse = value < threshold
            candidates.append({"statistic": statistic, "queries": count, "layer": layer, "threshold": threshold,
                               "set_msrs": msrs.tolist(), "sent_sparse": int(sparse.sum()),
                               "needy_sent_sparse": int((sparse & torch.tensor(need)).sum()),
                               "validation_msr": float(torch.where(sparse, msrs[1], msrs[0]).mean())})
    best = max(candidates, key=lambda c: (c["validation_msr"], -c["layer"]))
    value = signal[:, statistics.index(best["statistic"]), counts.index(best["queries"]), best["layer"]].amax(dim=1)
    cells: dict = defaultdict(lambda: {"rows": 0, "needy": 0, "sent_sparse": 0, "full": 0.0, "floor": 0.0,
                                       "sparse_bound": 0.0})
    floor_mode = f"heads@{args.msr:g}"
    for key, row_value, row_need in zip(keys, value.tolist(), need):
        cell = cells[f"{key[0]}@{key[1]}"]
        sent = row_value < best["threshold"]
        modes = scores[key]
        cell["rows"] += 1
        cell["needy"] += int(row_need)
        cell["sent_sparse"] += int(sent)
        cell["full"] += modes["full"]
        cell["floor"] += modes.get(floor_mode, float("nan"))
        cell["sparse_bound"] += modes["sparse"] if sent else modes.get(floor_mode, float("nan"))
    for cell in cells.values():
        for name in ("full", "floor", "sparse_bound"):
            cell[name] /= cell["rows"]
    selection = {"rule": __doc__.split("\n\n")[2].replace("\n", " "), "recall": args.recall, "margin": args.margin,
                 "head_set": args.head_set, "floor_msr": args.msr, "validation_rows": len(keys),
                 "needy_rows": sum(need), "chosen": best, "validation_cells": dict(sorted(cells.items())),
                 "candidates": candidates}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "selection.json").write_text(json.dumps(selection, indent=1))
    print(json.dumps(best))
    if args.model:
        write_adapter(args.model, floor, best, out / "adapter")


def write_adapter(model_dir: str, floor: torch.Tensor, chosen: dict, path: Path) -> None:
    """The chosen router as an adapter folder for the model at ``model_dir``."""
    from transformers import AutoModelForCausalLM

    import elastic_attention as ea
    from features import BLOCK, LOCAL, SINK

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    config = ea.ElasticConfig(block_size=BLOCK, sink_tokens=SINK, local_tokens=LOCAL, head_set_choices=2,
                              signal_layer=chosen["layer"], signal_thresholds=(chosen["threshold"],),
                              signal_queries=chosen["queries"], signal_statistic=chosen["statistic"])
    ea.attach(model, config, backend="reference")
    (router,) = ea.routers_of(model).values()
    router.set_head_sets(sets_for(floor, chosen["layer"]))
    ea.save_router(model, path, overwrite=True)
    print(f"adapter: {path}")


if __name__ == "__main__":
    main()
