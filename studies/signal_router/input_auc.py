"""What each signal input alone predicts: per (statistic, query count, layer), the AUC of its largest KV head for
"this row needs the far context" (full attention beats all-SSA by 0.5), on the validation rows the router was chosen
on and, reported only, on the held-out rows.

    python studies/signal_router/input_auc.py --features RUN/features_val.jsonl \
        --scores studies/signal_router/results/broad_validation_scores.json --eval RUN/code_val/eval.json \
        --heldout-features RUN/features_heldout.jsonl --heldout-eval RUN/ruler_8k/eval.json RUN/ruler_16k/eval.json \
        RUN/code_8k_16k/eval.json --out auc.json

Held-out rows are labelled by the table's own full and all-SSA cells (their ``row_accuracy``); features_heldout holds
the first 20 rows of each cell.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from select_router import labelled, read_features, read_scores


def auc(scores: list[float], labels: list[bool]) -> float:
    """Area under the ROC curve: the probability that a random positive scores above a random negative (ties count
    one half); NaN without both classes."""
    positives = torch.tensor([s for s, label in zip(scores, labels) if label], dtype=torch.float64)
    negatives = torch.tensor([s for s, label in zip(scores, labels) if not label], dtype=torch.float64)
    if not len(positives) or not len(negatives):
        return float("nan")
    above = (positives[:, None] > negatives[None, :]).double() + 0.5 * (positives[:, None] == negatives[None, :])
    return float(above.mean())


def input_aucs(records: list[dict], scores: dict, margin: float = 0.5) -> dict[str, float]:
    """``"statistic q=Q layer L"`` -> AUC over the records that have full and all-SSA scores."""
    kept, need, signal = labelled(records, scores, margin)
    if not kept:
        return {}
    labels = need.tolist()
    result = {}
    for kind, statistic in enumerate(kept[0]["statistics"]):
        for position, count in enumerate(kept[0]["queries"]):
            for layer in range(signal.shape[3]):
                value = signal[:, kind, position, layer].amax(dim=1).tolist()
                result[f"{statistic} q={count} layer {layer}"] = auc(value, labels)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", required=True)
    parser.add_argument("--scores")
    parser.add_argument("--eval", nargs="*", default=[])
    parser.add_argument("--heldout-features")
    parser.add_argument("--heldout-eval", nargs="*", default=[])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    validation = input_aucs(read_features(args.features), read_scores(args.scores, args.eval))
    heldout = {}
    if args.heldout_features:
        records = read_features(args.heldout_features)
        scores = read_scores(None, args.heldout_eval)
        suites = {r["task"]: _suite(r["task"]) for r in records}
        heldout = {suite: input_aucs([r for r in records if suites[r["task"]] == suite], scores)
                   for suite in sorted(set(suites.values()))}
    best = sorted(validation, key=lambda name: -validation[name])[:10]
    document = {"validation": validation, "heldout": heldout,
                "best_on_validation": [{"input": name, "validation": validation[name],
                                        **{suite: values.get(name) for suite, values in heldout.items()}}
                                       for name in best]}
    Path(args.out).write_text(json.dumps(document, indent=1))
    for item in document["best_on_validation"]:
        print(json.dumps(item))


def _suite(task: str) -> str:
    from elastic_attention.evaluation.suites import suite_of

    return suite_of(task).name


if __name__ == "__main__":
    main()
