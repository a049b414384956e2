"""Issue 4 item 7's bounds from an ``eval.json`` of ``elastic-attention eval`` (modes full, elastic and static).

    python studies/synthetic_routers/finding_bounds.py EVAL_JSON --sensitive needle_multikey,variable_tracking --robust local_recall

Per length: elastic's share of full attention's accuracy (mean over the sensitive tasks, and over the robust ones),
elastic's MSR on sensitive and robust tasks and their gap, elastic's average MSR over every task, and the static
hybrid's sensitive accuracy at its MSR; each bound marked met or missed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def bounds(results: list[dict], sensitive: list[str], robust: list[str], length: int) -> dict[str, float | bool]:
    """The item-7 quantities at one length; ``results`` are the ``results`` entries of an eval.json."""
    cells = {(r["mode"], r["task"], r["length"]): r for r in results}

    def mean(mode: str, field: str, tasks: list[str]) -> float:
        return sum(cells[(mode, task, length)][field] for task in tasks) / len(tasks)

    full_sensitive, full_robust = mean("full", "accuracy", sensitive), mean("full", "accuracy", robust)
    elastic_sensitive, elastic_robust = mean("elastic", "accuracy", sensitive), mean("elastic", "accuracy", robust)
    static_sensitive = mean("static", "accuracy", sensitive)
    msr_sensitive, msr_robust = mean("elastic", "msr", sensitive), mean("elastic", "msr", robust)
    return {
        "sensitive_kept": elastic_sensitive / full_sensitive,
        "robust_kept": elastic_robust / full_robust,
        "msr_sensitive": msr_sensitive,
        "msr_robust": msr_robust,
        "msr_gap": msr_robust - msr_sensitive,
        "msr_average": mean("elastic", "msr", sensitive + robust),
        "static_msr": mean("static", "msr", sensitive + robust),
        "elastic_sensitive_loss": full_sensitive - elastic_sensitive,
        "static_sensitive_loss": full_sensitive - static_sensitive,
        "met_sensitive": elastic_sensitive >= 0.97 * full_sensitive,
        "met_robust": elastic_robust >= 0.99 * full_robust,
        "met_gap": msr_robust - msr_sensitive >= 0.2,
        "met_average": mean("elastic", "msr", sensitive + robust) >= 0.6,
        "met_static_loses_more": full_sensitive - static_sensitive > full_sensitive - elastic_sensitive,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("eval_json", type=Path)
    parser.add_argument("--sensitive", required=True, help="comma list of sensitive tasks")
    parser.add_argument("--robust", required=True, help="comma list of robust tasks")
    args = parser.parse_args()
    results = json.loads(args.eval_json.read_text())["results"]
    for length in sorted({r["length"] for r in results}):
        values = bounds(results, args.sensitive.split(","), args.robust.split(","), length)
        print(f"length {length}: " + ", ".join(
            f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {'yes' if value else 'NO'}"
            for key, value in values.items()))


if __name__ == "__main__":
    main()
