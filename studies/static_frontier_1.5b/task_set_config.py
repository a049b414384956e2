"""Which head set can each task have to itself, and what training config lets a head-set router choose among them?

For each ``--task-set TASK SEARCH EVAL...``: SEARCH is a head-set search on that task alone (`scripts/
head_set_search.py --tasks TASK`, usually ``--start`` from a joint set), EVAL the eval.json files of its points
(``eval --modes heads@0.8,heads@0.85,... --head-set SEARCH --tasks TASK``, one file per length or one for all). The
task's set is the point of highest MSR whose accuracy keeps at least ``--share`` of full attention's at every length
measured (full attention's cells from the EVAL files or ``--full``); a task with no such point above its target in
``--base`` keeps that target and gets no set.

Writes ``--out``: the ``--base`` training config with each chosen set appended to ``head_set_choices_extra`` (as
``SEARCH@MSR``), ``elastic.head_set_choices`` counting it, and the task's target moved to the set's MSR (its sparse
heads over all heads, so the target sits on the set). ``--choice-msrs`` replaces the base's
``head_set_choices_msrs`` (the joint search's sets the router keeps). Prints each task's points and the choice.

    python studies/static_frontier_1.5b/task_set_config.py --base configs/qwen2.5_coder_1.5b_code_head_set_router_pattern_held_out.yaml \\
        --choice-msrs 0.0,0.6,1.0 --task-set passkey passkey.json eval_passkey_8k/eval.json eval_passkey_16k/eval.json \\
        --full benchmarks/results/real_model_1.5b_eval.json --share 0.98 --out task_sets.yaml
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path


def sparsest_point_keeping(rows: Sequence[dict], task: str, share: float) -> tuple[str | None, dict[str, dict]]:
    """The ``heads@MSR`` mode of highest MSR whose cells of ``task`` keep at least ``share`` of full attention's
    accuracy at every length where that mode was measured on it (None when none does), and each mode's retention by
    length (mode -> {"msr": measured MSR, "kept": {length: accuracy / full accuracy}}).

    Raises:
        ValueError: a length with a heads cell of ``task`` has no full-attention cell of it.
    """
    from elastic_attention.evaluation.frontier import point

    points: dict[str, dict] = {}
    for row in rows:
        if row["task"] != task or not row["mode"].startswith("heads@"):
            continue
        measured = point(rows, row["mode"], row["length"], [task])  # retention as the frontier counts it
        if measured is None:
            raise ValueError(f"{task} has a {row['mode']} cell at {row['length']} tokens but no full-attention cell "
                             f"there: give an eval.json that has one (--full)")
        entry = points.setdefault(row["mode"], {"msr": row["msr"], "kept": {}})
        entry["kept"][row["length"]] = measured.tasks[task]
    keeping = [mode for mode, entry in points.items() if all(value >= share for value in entry["kept"].values())]
    return max(keeping, key=lambda mode: points[mode]["msr"], default=None), points


def main(argv: Sequence[str] | None = None) -> dict:
    import yaml

    from elastic_attention.errors import ConfigError
    from elastic_attention.head_sets import read_head_sets
    from elastic_attention.io import atomic_write_text
    from elastic_attention.training.train_config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, type=Path, help="the training config to start from")
    parser.add_argument("--task-set", nargs="+", action="append", required=True, metavar="TASK SEARCH EVAL",
                        help="a task, its own head-set search file and the eval.json files of that file's points")
    parser.add_argument("--full", action="append", default=[], type=Path,
                        help="an eval.json holding full attention's cells of the same rows (when EVAL has none)")
    parser.add_argument("--share", type=float, default=0.98, help="share of full attention a set must keep")
    parser.add_argument("--choice-msrs", help="comma list replacing the base's head_set_choices_msrs")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if any(len(entry) < 3 for entry in args.task_set):
        parser.error("each --task-set needs TASK SEARCH EVAL [EVAL ...]")
    missing = [path for path in [args.base, *args.full, *(name for entry in args.task_set for name in entry[1:])]
               if not Path(path).is_file()]
    if missing:
        parser.error(f"no file at {', '.join(map(str, missing))} (give the base config, each task's search file and "
                     "the eval.json files of its points)")

    config = yaml.safe_load(args.base.read_text(encoding="utf-8"))
    if args.choice_msrs is not None:
        config["head_set_choices_msrs"] = [float(text) for text in args.choice_msrs.split(",") if text.strip()]
    if not isinstance(config.get("elastic"), dict) or not config.get("head_set_choices_msrs") \
            or not config.get("initial_full_heads"):
        parser.error(f"{args.base} is not a head-set router's config: it needs `elastic`, `initial_full_heads` and "
                     "`head_set_choices_msrs` (or give --choice-msrs)")
    full_rows = [row for path in args.full for row in json.loads(path.read_text(encoding="utf-8"))["results"]
                 if row["mode"] == "full"]
    extra, chosen = list(config.get("head_set_choices_extra") or []), {}
    for task, search, *evals in args.task_set:
        if task not in config.get("targets", {}):
            parser.error(f"--task-set {task}: not a task with a target in {args.base} (its targets: "
                         f"{sorted(config.get('targets', {}))})")
        rows = [row for path in evals for row in json.loads(Path(path).read_text(encoding="utf-8"))["results"]]
        own_full = {(row["task"], row["length"]) for row in rows if row["mode"] == "full"}
        rows += [row for row in full_rows if (row["task"], row["length"]) not in own_full]
        try:
            mode, points = sparsest_point_keeping(rows, task, args.share)
        except ValueError as error:
            parser.error(str(error))
        for name, entry in sorted(points.items(), key=lambda item: item[1]["msr"]):
            kept = ", ".join(f"{length // 1024}K {value:.0%}" for length, value in sorted(entry["kept"].items()))
            print(f"{task} {name} (MSR {entry['msr']:.3f}): {kept}")
        heads = read_head_sets(search, option="--task-set")
        if mode is None:
            print(f"{task}: no point keeps {args.share:.0%} at every length; target stays {config['targets'][task]}")
            continue
        msr_asked = float(mode.split("@", 1)[1])
        msr = round(msr_asked * heads.shape[0] * heads.shape[1]) / (heads.shape[0] * heads.shape[1])
        if msr <= config["targets"][task]:
            print(f"{task}: its sparsest point keeping {args.share:.0%} ({mode}) is not above its target "
                  f"{config['targets'][task]}; no set added")
            continue
        heads.at(msr_asked, msr_option="--task-set")  # the point exists in that file
        extra.append(f"{search}@{msr_asked}")
        config["targets"][task] = msr
        chosen[task] = {"mode": mode, "msr": msr, "set": extra[-1]}
        print(f"{task}: {mode}, target {msr:.3f}")
    config["head_set_choices_extra"] = extra
    config["elastic"]["head_set_choices"] = len(config["head_set_choices_msrs"]) + len(extra)
    header = (f"# elastic-attention train {args.out} model={config['model']} output_dir=runs/{args.out.stem}\n"
              f"# written by: python studies/static_frontier_1.5b/task_set_config.py {shlex.join(argv if argv is not None else sys.argv[1:])}\n")
    atomic_write_text(args.out, header + yaml.safe_dump(config, sort_keys=False, width=120))
    try:
        TrainConfig.from_yaml(args.out).head_set_choices()  # the config trains: its sets load, one per choice
    except ConfigError as error:
        args.out.unlink()
        parser.error(f"the config written would not train ({error}); nothing kept at {args.out}")
    return chosen


if __name__ == "__main__":
    main(sys.argv[1:])
