"""What each router input predicts: per row, does the prompt need the far context (full attention answers, all-SSA
does not), and how well does each candidate input (the retrieval signal of each layer; the shipped router's
probability of its all-SSA set) tell those rows apart?

    python studies/ruler_heldout/analyze.py --run RUN --cells CELLS --tokenizer TOKENIZER --out results.json

RUN holds what device_job.sh wrote (ruler_eval/eval.json, broad_eval/eval.json, signal.jsonl, signal_broad.jsonl);
CELLS the row cells it read. A row "needs the far context" when full attention's score exceeds all-SSA's by at least
0.5 (code-suite rows: their suite's kind, since all-SSA scores 0 on every sensitive code task and keeps the robust
ones). The input and its threshold are chosen on the broad suite's validation rows only (the code suite trained the
shipped router, so its rows would favour the router's own input) and then applied, once, to RULER. Beside the need
label, each input's AUC for the broad families' declared kind (sensitive against robust) is reported.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch


def auc(scores: list[float], labels: list[bool]) -> float:
    """Area under the ROC curve: the probability that a random positive scores above a random negative (ties
    count one half); NaN without both classes."""
    positives = [s for s, label in zip(scores, labels) if label]
    negatives = [s for s, label in zip(scores, labels) if not label]
    if not positives or not negatives:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def row_scores(run: Path, name: str, cells: Path, tokenizer, seed: int) -> dict:
    """(task, length, index) -> {mode: score}, rescored from an eval.json's predictions and the cells' rows."""
    from elastic_attention.evaluation.row_cells import read_cell
    from elastic_attention.evaluation.suites import suite_of

    document = json.loads((run / name / "eval.json").read_text())
    scores: dict = defaultdict(dict)
    for cell in document["results"]:
        rows = read_cell(cells, task=cell["task"], length=cell["length"], seed=seed, samples=cell["samples"],
                         tokenizer=tokenizer)
        suite = suite_of(cell["task"])
        for index, (row, prediction) in enumerate(zip(rows, cell["predictions"])):
            scores[(cell["task"], cell["length"], index)][cell["mode"]] = suite.score(prediction, row).accuracy
    return scores


def signals(path: Path) -> dict:
    """(task, length, index) -> the signal.jsonl record."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["task"], r["length"], r["index"]): r for r in records}


def candidate_inputs(record: dict) -> dict[str, float]:
    """Each candidate input of one row: the signal of each layer (mean and max over its KV heads), the signal's
    mean over all layers, and the shipped router's probability of its sparsest set."""
    signal = torch.tensor(record["signal"])
    inputs = {f"signal_l{layer:02d}_mean": float(signal[layer].mean()) for layer in range(signal.shape[0])}
    inputs.update({f"signal_l{layer:02d}_max": float(signal[layer].max()) for layer in range(signal.shape[0])})
    inputs["signal_all_mean"] = float(signal.mean())
    sparsest = max(range(len(record["router_set_msrs"])), key=lambda i: record["router_set_msrs"][i])
    inputs["router_not_sparsest"] = 1.0 - record["router_probabilities"][sparsest]
    return inputs


def need_labels(scores: dict, margin: float = 0.5) -> dict:
    """(task, length, index) -> True where full attention beats all-SSA by ``margin``."""
    return {key: (modes["full"] - modes["sparse"]) >= margin for key, modes in scores.items()
            if "full" in modes and "sparse" in modes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True)
    parser.add_argument("--cells", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--broad-seed", type=int, default=777)
    parser.add_argument("--recall", type=float, default=0.95, help="share of needy validation rows a rule catches")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    run, cells = Path(args.run), Path(args.cells)
    ruler_scores = row_scores(run, "ruler_eval", cells / "ruler", tokenizer, 0)
    broad_scores = row_scores(run, "broad_eval", cells / "broad", tokenizer, args.broad_seed)
    ruler_need, broad_need = need_labels(ruler_scores), need_labels(broad_scores)
    records = {**signals(run / "signal.jsonl"), **signals(run / "signal_broad.jsonl")}
    from elastic_attention.evaluation.suites import suite_of
    from elastic_attention.router.floor import signal_floor_threshold

    code_need = {key: suite_of(key[0]).kind(key[0]) == "sensitive" for key, record in records.items()
                 if suite_of(key[0]).name == "code"}
    inputs = {key: candidate_inputs(record) for key, record in records.items()}
    names = sorted(next(iter(inputs.values())))

    def table(labels: dict) -> dict[str, float]:
        keys = [key for key in labels if key in inputs]
        return {name: auc([inputs[key][name] for key in keys], [labels[key] for key in keys]) for name in names}

    validation = broad_need
    broad_kind = {key: suite_of(key[0]).kind(key[0]) == "sensitive" for key in broad_scores}
    aucs = {"broad (need)": table(broad_need), "broad (kind)": table(broad_kind), "code (kind)": table(code_need),
            "ruler (need)": table(ruler_need)}
    chosen = max(names, key=lambda name: aucs["broad (need)"][name])
    keys = [key for key in validation if key in inputs]
    threshold = signal_floor_threshold(torch.tensor([inputs[key][chosen] for key in keys]),
                                       torch.tensor([validation[key] for key in keys]), args.recall)
    ruler_keys = [key for key in ruler_need if key in inputs]
    caught = [key for key in ruler_keys if ruler_need[key] and inputs[key][chosen] >= threshold]
    spared = [key for key in ruler_keys if not ruler_need[key] and inputs[key][chosen] < threshold]
    per_task = defaultdict(lambda: {"rows": 0, "need": 0, "caught": 0, "flagged": 0})
    for key in ruler_keys:
        cell = per_task[f"{key[0]}@{key[1]}"]
        cell["rows"] += 1
        cell["need"] += int(ruler_need[key])
        flagged = inputs[key][chosen] >= threshold
        cell["flagged"] += int(flagged)
        cell["caught"] += int(flagged and ruler_need[key])
    result = {
        "rows": {"ruler": len(ruler_keys), "broad": len([k for k in broad_need if k in inputs]),
                 "code": len(code_need)},
        "need": {"ruler": sum(ruler_need[k] for k in ruler_keys), "broad": sum(broad_need.values()),
                 "code": sum(code_need.values())},
        "auc": aucs,
        "rule": {"input": chosen, "threshold": threshold, "chosen_on": "the broad suite's validation rows",
                 "validation_recall": args.recall,
                 "ruler_needy_caught": f"{len(caught)} of {sum(ruler_need[k] for k in ruler_keys)}",
                 "ruler_unneedy_left_sparse": f"{len(spared)} of {sum(not ruler_need[k] for k in ruler_keys)}",
                 "ruler_per_cell": dict(per_task)},
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    best = sorted(names, key=lambda name: -aucs["broad (need)"][name])[:8]
    for name in best + ["router_not_sparsest", "signal_all_mean"]:
        print(f"{name:24s} " + "  ".join(f"{split} {aucs[split][name]:.3f}" for split in aucs))
    print(json.dumps(result["rule"], indent=1))


if __name__ == "__main__":
    main()
