"""The held-out table of one router: the eval runs merged into one eval.json, a markdown table with the share of
prompts on each set, the issue's bars checked, and a Pareto plot.

    python studies/signal_router/heldout_report.py RUN/ruler_8k/eval.json RUN/ruler_16k/eval.json \
        RUN/code_8k_16k/eval.json RUN/ruler_4k_32k/eval.json --out benchmarks/results/real_model_1.5b_heldout_eval

Each run holds the modes full, elastic, sparse (all-SSA) and heads (the joint searched set at the run's elastic
MSR). Writes OUT.json (the merged eval document plus ``bars``), OUT.md and OUT.png. The bars, at 8K and at 16K:
every RULER task where full attention scores at least 0.5 keeps >= 95% of it under elastic, every code-suite task
>= 97%; the share of niah prompts on the router's sparsest set (reported; the bar is none); RULER mean retention over
those tasks at least 3 points above the searched set's; average MSR over the RULER and code cells >= 0.55.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

RULER_FLOOR, RULER_KEEP, CODE_KEEP, MARGIN, MSR_BAR = 0.5, 0.95, 0.97, 0.03, 0.55
BAR_LENGTHS = (8192, 16384)


def _retention(accuracy: float, full: float) -> float:
    """accuracy / full; a task full attention never answers keeps everything (1.0) unless it is answered."""
    return accuracy / full if full else (1.0 if accuracy == 0 else float("inf"))


def bars(rows: Sequence[dict], suites: dict[str, str]) -> dict:
    """The bars at each of `BAR_LENGTHS` measured on ``rows`` (eval.json rows; ``suites``: task -> suite name).

    Returns:
        length -> {"ruler_tasks": the tasks with full >= 0.5, "ruler": task -> retention, "code": task -> retention,
        "niah_on_sparsest": task -> share, "ruler_mean": {"elastic", "heads", "margin"}, "msr": average elastic MSR,
        "met": bar name -> bool}.
    """
    cells = {(row["mode"], row["task"], row["length"]): row for row in rows}
    report = {}
    for length in BAR_LENGTHS:
        tasks = sorted({task for mode, task, at in cells if at == length and mode == "elastic"})
        if not tasks:
            continue
        full = {task: cells[("full", task, length)]["accuracy"] for task in tasks}
        elastic = {task: cells[("elastic", task, length)] for task in tasks}
        ruler = [task for task in tasks if suites[task] == "ruler" and full[task] >= RULER_FLOOR]
        code = [task for task in tasks if suites[task] == "code"]
        kept = {task: _retention(elastic[task]["accuracy"], full[task]) for task in tasks}
        heads = {task: _retention(cells[("heads", task, length)]["accuracy"], full[task]) for task in ruler}
        mean_elastic = sum(kept[task] for task in ruler) / len(ruler) if ruler else float("nan")
        mean_heads = sum(heads.values()) / len(heads) if heads else float("nan")
        routed = [task for task in tasks if suites[task] in ("ruler", "code")]
        samples = sum(elastic[task]["samples"] for task in routed)
        msr = sum(elastic[task]["msr"] * elastic[task]["samples"] for task in routed) / samples
        niah = {task: (elastic[task].get("set_shares") or [float("nan")])[-1] for task in tasks
                if task.startswith("niah")}
        report[length] = {
            "ruler_tasks": ruler, "ruler": {task: kept[task] for task in ruler},
            "code": {task: kept[task] for task in code}, "niah_on_sparsest": niah,
            "ruler_mean": {"elastic": mean_elastic, "heads": mean_heads, "margin": mean_elastic - mean_heads},
            "msr": msr,
            "met": {"ruler_keep": all(kept[task] >= RULER_KEEP for task in ruler),
                    "code_keep": all(kept[task] >= CODE_KEEP for task in code),
                    "no_niah_on_sparsest": all(share == 0 for share in niah.values()),
                    "ruler_margin": mean_elastic - mean_heads >= MARGIN, "msr": msr >= MSR_BAR},
        }
    return report


def markdown(rows: Sequence[dict], report: dict) -> str:
    """One line per (task, length): each mode's accuracy (MSR), elastic's retention and share of prompts per set;
    then the bars per length."""
    cells = {(row["mode"], row["task"], row["length"]): row for row in rows}
    lines = ["| task | kind | length | full | elastic (MSR) | retention | prompts per set | heads (MSR) | all-SSA |",
             "|---|---|---|---|---|---|---|---|---|"]
    for task, kind, length in dict.fromkeys((row["task"], row["kind"], row["length"]) for row in rows):
        full, elastic = cells.get(("full", task, length)), cells.get(("elastic", task, length))
        heads, sparse = cells.get(("heads", task, length)), cells.get(("sparse", task, length))
        if full is None or elastic is None:
            continue
        shares = " / ".join(f"{share:.2f}" for share in elastic.get("set_shares") or [])
        lines.append(f"| {task} | {kind} | {length} | {full['accuracy']:.2f} | {elastic['accuracy']:.2f} "
                     f"({elastic['msr']:.2f}) | {_retention(elastic['accuracy'], full['accuracy']):.2f} | {shares} | "
                     + (f"{heads['accuracy']:.2f} ({heads['msr']:.2f})" if heads else "-") + " | "
                     + (f"{sparse['accuracy']:.2f}" if sparse else "-") + " |")
    for length, item in report.items():
        met = ", ".join(f"{name} {'met' if value else 'MISSED'}" for name, value in item["met"].items())
        lines += ["", f"**{length // 1024}K**: RULER mean retention {item['ruler_mean']['elastic']:.3f} against the "
                      f"searched set's {item['ruler_mean']['heads']:.3f} (margin {item['ruler_mean']['margin']:+.3f}); "
                      f"average MSR {item['msr']:.3f}; niah prompts on the sparsest set "
                      + ", ".join(f"{task} {share:.2f}" for task, share in item["niah_on_sparsest"].items())
                      + f". Bars: {met}."]
    return "\n".join(lines)


def plot(rows: Sequence[dict], suites: dict[str, str], path: Path) -> None:
    """Mean retention against average MSR, one panel per (suite, length): full, elastic, heads, all-SSA."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from elastic_attention.evaluation.frontier import point

    panels = sorted({(suites[row["task"]], row["length"]) for row in rows})
    figure, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 4.0), squeeze=False)
    for axis, (suite, length) in zip(axes[0], panels):
        tasks = sorted({row["task"] for row in rows if suites[row["task"]] == suite and row["length"] == length})
        for mode, style, label in (("full", "k*", "full attention"), ("elastic", "o", "elastic"),
                                   ("heads", "s", "searched set at elastic's MSR"), ("sparse", "kx", "all-SSA")):
            found = point(rows, mode, length, tasks)
            if found is not None:
                axis.plot(found.msr, found.retention, style, markersize=9, label=label)
        axis.set_title(f"{suite} {length // 1024}K")
        axis.set_xlabel("average MSR")
        axis.set_ylabel("mean retention")
        axis.set_xlim(-0.03, 1.03)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("evals", nargs="+", help="eval.json files of the runs")
    parser.add_argument("--out", required=True, help="path without extension of the .json, .md and .png")
    args = parser.parse_args()
    from elastic_attention.evaluation.merge import merge_eval_documents
    from elastic_attention.evaluation.suites import suite_of

    document = merge_eval_documents([(name, json.loads(Path(name).read_text())) for name in args.evals])
    rows = document["results"]
    suites = {row["task"]: suite_of(row["task"]).name for row in rows}
    report = bars(rows, suites)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    # appended, not Path.with_suffix: "real_model_1.5b_heldout_eval" has a dot of its own
    Path(f"{args.out}.json").write_text(json.dumps({**document, "bars": report}, indent=1))
    Path(f"{args.out}.md").write_text(markdown(rows, report) + "\n")
    plot(rows, suites, Path(f"{args.out}.png"))
    print(markdown(rows, report))


if __name__ == "__main__":
    main()
