"""What the retrieval-signal teacher would ask of a router, read off measured validation features before any training.

    python studies/signal_router/teacher_targets.py --features results/features_validation_h100_2026-12-07.jsonl.gz \
        --scores results/broad_validation_scores.json --eval results/code_validation_eval_h100_2026-12-07.json \
        --head-set benchmarks/results/real_model_1.5b_head_set_search_2026-12-03.json \
        --out results/teacher_targets_h100_2026-12-07.json

For each statistic, query count and threshold tau, the teacher marks a head needed when its signal reaches tau
(`training.signal_teacher`). The head-set teacher's target is the sparsest of the config's sets (the search path at
MSR 0.5, 0.6, 0.7, 0.8 and all-SSA) keeping every needed head (`sparsest_covering_set`); the per-head teacher's target
MSR is the share of heads below tau. Reported per setting, for the validation rows that need the far context (full
attention beats all-SSA by 0.5) and the others: the share of needy rows on the floor (MSR 0.5) or denser, each group's
average target MSR, and the AUC with which the per-head target MSR puts the other rows sparser. A teacher worth
training on keeps the needy rows dense and sends the others sparse. Validation rows only; the features were measured
with the floor set running, a close stand-in for the full attention under which the teacher measures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from input_auc import auc
from select_router import add_validation_arguments, validation_rows

THRESHOLDS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
SET_MSRS = (0.5, 0.6, 0.7, 0.8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_validation_arguments(parser)
    parser.add_argument("--head-set", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from elastic_attention.head_sets import read_head_sets
    from elastic_attention.training.signal_teacher import sparsest_covering_set

    records, need, signal = validation_rows(args)
    if not records:
        raise SystemExit("no validation row has both features and full / all-SSA scores")
    head_sets = read_head_sets(args.head_set)
    sets = torch.stack([head_sets.at(msr) for msr in SET_MSRS] + [torch.zeros_like(head_sets.at(SET_MSRS[0]))])
    msrs = 1.0 - sets.float().mean(dim=(1, 2))
    settings = []
    for kind, statistic in enumerate(records[0]["statistics"]):
        for position, count in enumerate(records[0]["queries"]):
            for threshold in THRESHOLDS:
                needed = signal[:, kind, position] >= threshold
                head_set = msrs[sparsest_covering_set(needed, sets, msrs)]
                per_head = (~needed).float().mean(dim=(1, 2))
                settings.append({
                    "statistic": statistic, "queries": count, "threshold": threshold,
                    "head_set": {"needy_on_floor_or_denser": float((head_set[need] <= msrs[0] + 1e-6).float().mean()),
                                 "needy_msr": float(head_set[need].mean()), "other_msr": float(head_set[~need].mean())},
                    "per_head": {"needy_msr": float(per_head[need].mean()), "other_msr": float(per_head[~need].mean()),
                                 "auc_other_sparser": auc(per_head.tolist(), (~need).tolist())},
                })
    result = {"rule": __doc__.split("\n\n")[1].replace("\n", " "), "validation_rows": len(records),
              "needy_rows": int(need.sum()), "set_msrs": msrs.tolist(), "settings": settings}
    Path(args.out).write_text(json.dumps(result, indent=1))
    for item in settings:
        print(json.dumps(item))


if __name__ == "__main__":
    main()
