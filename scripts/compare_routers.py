"""Compare the router adapters and throughput of two training runs (one process against torchrun, issue 7).

  python scripts/compare_routers.py RUN_A RUN_B --out comparison.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from safetensors.torch import load_file


def compare(first: Path, second: Path) -> dict:
    routers = [load_file(run / "router" / "router.safetensors") for run in (first, second)]
    summaries = [json.loads((run / "summary.json").read_text()) for run in (first, second)]
    differences = {name: float((routers[1][name].double() - value.double()).abs().max())
                   for name, value in routers[0].items()}
    scales = {name: float(value.double().abs().max()) for name, value in routers[0].items()}
    throughput = [summary.get("tokens_per_second") for summary in summaries]
    return {
        "runs": [str(first), str(second)],
        "max_abs_difference": max(differences.values()),
        "max_relative_difference": max(differences[name] / max(scales[name], 1e-12) for name in differences),
        "per_tensor_max_abs_difference": differences,
        "tokens_per_second": throughput,
        "speedup": throughput[1] / throughput[0] if all(throughput) else None,
        "steps": [summary["steps"] for summary in summaries],
        "final_metrics": [summary["final"] for summary in summaries],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    arguments = parser.parse_args()
    result = compare(arguments.first, arguments.second)
    arguments.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({key: result[key] for key in ("max_abs_difference", "tokens_per_second", "speedup")}))
